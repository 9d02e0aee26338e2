"""How a Docker sandbox enforces its limits: the engine's cgroup for memory, CPUs and
pids (:func:`docker_kwargs`), the disk watchdog for the disk, and the container's cgroup
counters that tell a run hit one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sono.limits.model import Enforcement, Limits, disk_enforcement, limit_value


def plan_limits(limits: Limits) -> dict[str, Enforcement]:
    """How each set limit is enforced for a Docker sandbox (see :func:`docker_kwargs`)."""
    kw = docker_kwargs(limits)
    plan: dict[str, Enforcement] = {}
    if limits.memory is not None:
        plan["memory"] = Enforcement(
            "memory",
            "docker",
            f"mem_limit={kw['mem_limit']}, memswap_limit={kw['memswap_limit']} (no swap); "
            "the engine's cgroup OOM-kills inside the container",
            limit_value("memory", limits),
        )
    if limits.cpus is not None:
        plan["cpus"] = Enforcement(
            "cpus",
            "docker",
            f"nano_cpus={kw['nano_cpus']} (CFS quota)",
            limit_value("cpus", limits),
        )
    if limits.pids is not None:
        plan["pids"] = Enforcement(
            "pids", "docker", f"pids_limit={kw['pids_limit']}", limit_value("pids", limits)
        )
    if limits.disk is not None:
        plan["disk"] = disk_enforcement(limits, fsize=False)
    return plan


def docker_kwargs(limits: Limits) -> dict[str, Any]:
    """Keyword arguments for docker-py ``containers.create`` (``{}`` when none are set)."""
    kw: dict[str, Any] = {}
    if limits.memory is not None:
        kw["mem_limit"] = limits.memory
        kw["memswap_limit"] = limits.memory  # memory + swap = memory: no swap
    if limits.cpus is not None:
        kw["nano_cpus"] = round(limits.cpus * 1e9)
    if limits.pids is not None:
        kw["pids_limit"] = limits.pids
    return kw


# ---------------------------------------------------------------------------- cgroup jail


def cgroup_dirs(container_id: str, root: Path = Path("/")) -> dict[str, Path]:
    """The container's memory and pids cgroup directories on the host (cgroupfs v1, or
    v2 with the cgroupfs or systemd driver); missing ones are left out."""
    fs = root / "sys/fs/cgroup"
    found: dict[str, Path] = {}
    for controller in ("memory", "pids"):
        for candidate in (
            fs / controller / "docker" / container_id,
            fs / "system.slice" / f"docker-{container_id}.scope",
            fs / "docker" / container_id,
        ):
            if candidate.is_dir():
                found[controller] = candidate
                break
    return found
