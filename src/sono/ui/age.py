"""How old a sandbox is, for a person: ``3d``, ``5h``, ``12m``, ``40s`` (stdlib only: the
`so list` fast path uses it)."""

from __future__ import annotations

import time

TYPE_CHECKING = False  # typing itself costs start-up time
if TYPE_CHECKING:
    from datetime import datetime


def age(created: str, now: datetime | None = None) -> str:
    then = epoch_seconds(created)
    if then is None:
        return "?"
    current = now.timestamp() if now is not None else time.time()
    seconds = int(current - then)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def epoch_seconds(stamp: str) -> int | None:
    """``2026-11-30T14:37:12+00:00`` (what so writes) as Unix seconds, without importing
    datetime (start-up time); None for anything else."""
    if len(stamp) != 25 or stamp[10] != "T" or stamp[19:] != "+00:00":
        return None
    try:
        y, mo, d = int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10])
        h, mi, s = int(stamp[11:13]), int(stamp[14:16]), int(stamp[17:19])
    except ValueError:
        return None
    y -= mo <= 2  # days from the civil date (H. Hinnant's algorithm)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (mo + (-3 if mo > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    return days * 86400 + h * 3600 + mi * 60 + s
