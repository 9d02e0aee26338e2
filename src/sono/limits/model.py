"""What a sandbox may use (:class:`Limits`) and how one limit is enforced on a backend
(:class:`Enforcement`), with the wording both share. Pure data: no host access.

Mechanisms, best first: a **cgroup** (v2 or v1, :mod:`sono.limits.cgroup`) around the
sandbox; an **rlimit** set inside it (:mod:`sono.limits.rlimit`); a **watchdog** for the
disk (:mod:`sono.limits.watch`); the engine's own (**docker**) or the VM's (**microvm**).
Each backend's plan of which one enforces what is in ``sono/backends/<name>_limits.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal

Mechanism = Literal["cgroup-v2", "cgroup-v1", "docker", "microvm", "rlimit", "watchdog", "none"]
# How each mechanism is named to a person (so doctor).
MECHANISM_LABELS: Mapping[Mechanism, str] = {
    "cgroup-v2": "cgroup v2",
    "cgroup-v1": "cgroup v1",
    "docker": "Docker (engine cgroup)",
    "microvm": "microVM (the guest's own RAM/vCPUs)",
    "rlimit": "rlimit",
    "watchdog": "watchdog",
    "none": "not enforced",
}

# What DiskWatch charges at least for every entry (file, directory, link, whiteout): an
# empty file allocates no block but takes an inode, and a flood of them would exhaust the
# host filesystem's inodes inside any byte budget. 4 KiB (a block) per inode ties the
# inode budget to the disk limit: a 1 GiB limit allows 262 144 entries.
ENTRY_MIN_BYTES = 4096


@dataclass(frozen=True)
class Limits:
    """What a sandbox may use; ``None`` means unlimited.

    ``memory`` and ``disk`` are bytes (``disk``: the workspace's own writes), ``cpus`` a
    number of CPUs, ``pids`` a process/thread count, ``wall`` seconds per iteration
    (enforced by the loop's timeout, informational here).
    """

    memory: int | None = None
    cpus: float | None = None
    pids: int | None = None
    disk: int | None = None
    wall: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and not value > 0:
                raise ValueError(f"limit {f.name} must be > 0, got {value!r}")

    def any(self) -> bool:
        """True when at least one limit is set."""
        return any(getattr(self, f.name) is not None for f in fields(self))


@dataclass(frozen=True)
class Enforcement:
    """How one limit is enforced: ``value`` is the limit for humans ("4.0 GiB")."""

    limit: str
    mechanism: Mechanism
    detail: str
    value: str = ""


def format_size(n: int) -> str:
    """Bytes for humans: "4.0 GiB", "512.0 MiB", "900 B"."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def limit_value(limit: str, limits: Limits) -> str:
    """One set limit for humans ("4.0 GiB", "1.5", "512"); "" when unset."""
    v = getattr(limits, limit)
    if v is None:
        return ""
    if limit in ("memory", "disk"):
        return format_size(int(v))
    if limit == "cpus":
        return f"{float(v):g}"
    return str(v)


def disk_enforcement(limits: Limits, *, fsize: bool) -> Enforcement:
    """The disk limit: the watchdog on every backend; ``fsize``: RLIMIT_FSIZE as well."""
    detail = (
        "DiskWatch measures the blocks allocated under the workspace, on its own filesystem, "
        f"each file, directory or link counted as at least {ENTRY_MIN_BYTES // 1024} KiB "
        f"(an inode budget), about every second and stops the sandbox above "
        f"{limit_value('disk', limits)}"
    )
    if fsize:
        detail += "; RLIMIT_FSIZE caps any single file at the same size (SIGXFSZ)"
    return Enforcement("disk", "watchdog", detail, limit_value("disk", limits))
