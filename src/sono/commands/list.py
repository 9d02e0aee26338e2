"""so list: every sandbox with its status; --json for scripts."""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime

# Only the state module: `so list` must start fast (no harness, backend or loop imports).
from sono.state import SandboxRecord, Store, so_home


def age(created: str, now: datetime | None = None) -> str:
    try:
        then = datetime.fromisoformat(created)
    except ValueError:
        return "?"
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def as_json(rec: SandboxRecord) -> dict[str, object]:
    data = rec.to_json()
    data["status"] = rec.live_status()
    data["branch"] = rec.branch
    return data


def table(records: list[SandboxRecord]) -> str:
    header = ("ID", "PROJECT", "HARNESS", "BACKEND", "STATUS", "ITER", "COMMITS", "AGE")
    rows = [header] + [
        (
            r.id,
            r.project_name,
            r.harness,
            r.backend,
            r.live_status(),
            str(r.iterations),
            str(r.commits),
            age(r.created),
        )
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def run(args: argparse.Namespace) -> int:
    records = Store(so_home(os.environ)).all()
    if getattr(args, "json", False):
        print(json.dumps([as_json(r) for r in records], indent=2, sort_keys=True))
    elif not records:
        print("no sandboxes yet: start one with `so run` (or try `so demo`)")
    else:
        print(table(records))
    return 0
