"""Resource limits for sandboxes: the model (:mod:`sono.limits.model`, re-exported
here), cgroup jails (:mod:`sono.limits.cgroup`), rlimits (:mod:`sono.limits.rlimit`) and
the disk watchdog with the run guard (:mod:`sono.limits.watch`)."""

from __future__ import annotations

from sono.limits.model import (
    ENTRY_MIN_BYTES,
    MECHANISM_LABELS,
    Enforcement,
    Limits,
    Mechanism,
    disk_enforcement,
    format_size,
    limit_value,
)

__all__ = [
    "ENTRY_MIN_BYTES",
    "MECHANISM_LABELS",
    "Enforcement",
    "Limits",
    "Mechanism",
    "disk_enforcement",
    "format_size",
    "limit_value",
]
