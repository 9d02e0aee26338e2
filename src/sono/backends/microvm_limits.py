"""How a microVM sandbox enforces its limits: the VM's own RAM and vCPUs, RLIMIT_NPROC
on every exec as the guest's agent user, and the disk watchdog (plus the VM's root disk)."""

from __future__ import annotations

import math

from sono.limits.model import Enforcement, Limits, disk_enforcement, limit_value

AGENT_UID = AGENT_GID = 1000  # the agent in the guest, whoever runs so: the image is the VM's
DEFAULT_MEMORY_MIB = 4096  # without limits: enough for node-based agent CLIs
DEFAULT_CPUS = 2


def vcpus(limits: Limits | None) -> int:
    if limits is None or limits.cpus is None:
        return DEFAULT_CPUS
    return max(1, math.floor(limits.cpus))


def memory_mib(limits: Limits | None) -> int:
    if limits is None or limits.memory is None:
        return DEFAULT_MEMORY_MIB
    return max(1, limits.memory // (1 << 20))


def disk_mib(limits: Limits | None) -> int | None:
    if limits is None or limits.disk is None:
        return None
    return max(1, limits.disk // (1 << 20))


def plan_limits(limits: Limits) -> dict[str, Enforcement]:
    """How each set limit is enforced for a microVM sandbox (see :func:`create_kwargs`)."""
    plan: dict[str, Enforcement] = {}
    if limits.memory is not None:
        plan["memory"] = Enforcement(
            "memory",
            "microvm",
            f"the VM has {memory_mib(limits)} MiB of RAM (memory=) and no swap; the guest "
            "kernel OOM-kills inside it, the host never sees more",
            limit_value("memory", limits),
        )
    if limits.cpus is not None:
        if limits.cpus < 1:
            plan["cpus"] = Enforcement(
                "cpus",
                "none",
                f"a VM has whole vCPUs: {limits.cpus:g} CPU cannot be expressed (1 is the least)",
                limit_value("cpus", limits),
            )
        else:
            n = vcpus(limits)
            rounded = "" if n == limits.cpus else f"; {limits.cpus:g} rounded down to whole vCPUs"
            plan["cpus"] = Enforcement(
                "cpus", "microvm", f"{n} vCPU(s) (cpus=){rounded}", limit_value("cpus", limits)
            )
    if limits.pids is not None:
        plan["pids"] = Enforcement(
            "pids",
            "rlimit",
            f"RLIMIT_NPROC={limits.pids} on every exec as uid {AGENT_UID}; the guest kernel "
            "counts that user's processes, and only the agent runs as it in the VM",
            limit_value("pids", limits),
        )
    if limits.disk is not None:
        base = disk_enforcement(limits, fsize=False)
        plan["disk"] = Enforcement(
            "disk",
            base.mechanism,
            f"{base.detail}; the VM's own root disk holds {disk_mib(limits)} MiB",
            base.value,
        )
    return plan
