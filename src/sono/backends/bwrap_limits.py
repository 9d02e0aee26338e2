"""How a bwrap sandbox enforces its limits: the plan (:func:`plan_limits`, for
``so doctor`` and fail-closed checks) and, per run, the cgroup jail around bwrap, the
rlimits inside it and the guard (:func:`limited`)."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sono.backends.base import SandboxSpec
from sono.backends.execution import disk_watch
from sono.limits.cgroup import (
    CPU_PERIOD_US,
    JAIL_PARENT,
    LIMIT_CONTROLLERS,
    CgroupJail,
    CgroupSite,
    cpu_quota,
    find_cgroup,
    in_initial_userns,
    kernel_version,
)
from sono.limits.model import Enforcement, Limits, Mechanism, disk_enforcement, limit_value
from sono.limits.rlimit import NPROC_PER_USERNS, rlimit_prefix
from sono.limits.watch import Guard


def plan_limits(
    limits: Limits,
    *,
    root: Path = Path("/"),
    uid: int | None = None,
    kernel: tuple[int, int] | None = None,
) -> dict[str, Enforcement]:
    """How each set limit of memory/cpus/pids/disk is enforced for a bwrap sandbox here.

    Pure: reads the host (under ``root``), creates nothing. ``uid`` defaults to ours,
    ``kernel`` to the running kernel. Without a writable cgroup: pids → RLIMIT_NPROC
    ("rlimit") only where it counts the sandbox alone (Linux >= 5.14, non-root; see
    :func:`rlimit_prefix` for where to apply it), else "none"; memory and cpus → "none".
    """
    uid = os.getuid() if uid is None else uid
    kernel = kernel_version(root) if kernel is None else kernel
    wants_cgroup = any(getattr(limits, name) is not None for name in LIMIT_CONTROLLERS)
    site = find_cgroup(root=root, uid=uid) if wants_cgroup else None
    plan: dict[str, Enforcement] = {}
    for limit, controller in LIMIT_CONTROLLERS.items():
        if getattr(limits, limit) is None:
            continue
        if site is not None and controller in site.dirs:
            mechanism: Mechanism = "cgroup-v2" if site.version == 2 else "cgroup-v1"
            detail = _cgroup_detail(limit, limits, site)
        else:
            mechanism, detail = _fallback(limit, limits, uid, kernel, root)
        plan[limit] = Enforcement(limit, mechanism, detail, limit_value(limit, limits))
    if limits.disk is not None:
        plan["disk"] = disk_enforcement(limits, fsize=True)
    return plan


def _cgroup_detail(limit: str, limits: Limits, site: CgroupSite) -> str:
    where = f"in {site.dirs[LIMIT_CONTROLLERS[limit]] / JAIL_PARENT}/<sandbox>"
    if limit == "memory":
        if site.version == 2:
            files = f"memory.max={limits.memory}, memory.swap.max=0"
        else:
            files = f"memory.limit_in_bytes={limits.memory}"
            if (site.dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                files += " and memory.memsw.limit_in_bytes (no swap)"
        return f"{files} {where}; the kernel OOM-kills inside the sandbox"
    if limit == "cpus":
        quota = cpu_quota(limits.cpus or 0)
        if site.version == 2:
            return f"cpu.max={quota} {CPU_PERIOD_US} {where}"
        return f"cpu.cfs_quota_us={quota} per cpu.cfs_period_us={CPU_PERIOD_US} {where}"
    return f"pids.max={limits.pids} {where}; fork fails with EAGAIN beyond it"


def _fallback(
    limit: str, limits: Limits, uid: int, kernel: tuple[int, int], root: Path
) -> tuple[Mechanism, str]:
    controller = LIMIT_CONTROLLERS[limit]
    no_cgroup = f"no writable cgroup with the {controller} controller"
    if limit == "memory":
        return "none", (
            f"{no_cgroup}; RLIMIT_AS is not used: it caps virtual address space, which "
            "V8/Node (and Go, the JVM) reserve far beyond what they touch, so they would "
            "fail to start (and RLIMIT_RSS is ignored by Linux)"
        )
    if limit == "cpus":
        return "none", (
            f"{no_cgroup}; rlimits have no CPU-rate limit (RLIMIT_CPU caps total CPU "
            "seconds and would kill a long-running agent)"
        )
    if uid == 0 and in_initial_userns(root):
        return "none", (
            f"{no_cgroup}; RLIMIT_NPROC does not apply to root (uid 0 is exempt from it)"
        )
    if kernel < NPROC_PER_USERNS:
        return "none", (
            f"{no_cgroup}; on Linux < 5.14 RLIMIT_NPROC counts every process of uid {uid} "
            "on the host, not only the sandbox's, so it is not set (the sandbox would fail "
            f"to fork once your other processes reach {limits.pids})"
        )
    return "rlimit", (
        f"RLIMIT_NPROC={limits.pids} set inside the sandbox ({no_cgroup}): since Linux "
        "5.14 it counts per user namespace, and bwrap gives the sandbox its own, so only "
        "the sandbox's processes count (set before bwrap, the namespace would take it as a "
        f"ceiling on all of uid {uid}'s processes)"
    )


_JAILS = itertools.count(1)


@dataclass
class Limiter:
    """How one bwrap run is limited: a cgroup around bwrap (``outer``), rlimits inside
    the sandbox (``inner``: RLIMIT_NPROC counts per user namespace there), and a guard
    that reports the limit that was hit."""

    jail: CgroupJail | None = None
    rlimits: tuple[str, ...] = ()
    guard: Guard = field(default_factory=Guard)

    def outer(self, argv: Sequence[str], executable: str | None) -> tuple[list[str], str | None]:
        """The command line that starts bwrap (``argv``, inside the cgroup when there is
        one), and the file to execute when ``argv[0]`` is only a name."""
        if self.jail is None:
            return list(argv), executable
        return self.jail.wrap(argv, executable=executable), None

    def inner(self, argv: Sequence[str]) -> list[str]:
        return [*self.rlimits, *argv]


@contextlib.contextmanager
def limited(spec: SandboxSpec) -> Iterator[Limiter]:
    limits = spec.limits
    if limits is None or not limits.any():
        yield Limiter()
        return
    jail = None
    if any(v is not None for v in (limits.memory, limits.cpus, limits.pids)):
        jail = CgroupJail.create(f"so-{spec.id}-{os.getpid()}-{next(_JAILS)}", limits)
    cgroup_pids = jail is not None and "pids" in jail.enforced
    rlimits = rlimit_prefix(
        limits, nproc=limits.pids is not None and not cgroup_pids, fsize=limits.disk
    )
    try:
        with disk_watch(spec) as disk:
            yield Limiter(jail, tuple(rlimits), Guard(jail=jail, disk=disk))
    finally:
        if jail is not None:
            jail.remove()
