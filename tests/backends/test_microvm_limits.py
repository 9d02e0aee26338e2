"""microVM limits: the VM's own RAM and whole vCPUs, RLIMIT_NPROC, the disk watchdog."""

from __future__ import annotations

from sono.backends.microvm_limits import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MIB,
    disk_mib,
    memory_mib,
    plan_limits,
    vcpus,
)
from sono.limits import Limits


def test_fractions_of_a_cpu_cannot_be_a_vm() -> None:
    assert plan_limits(Limits(cpus=0.5))["cpus"].mechanism == "none"
    assert plan_limits(Limits(cpus=3))["cpus"].detail == "3 vCPU(s) (cpus=)"


def test_vm_sizes_from_limits_or_defaults() -> None:
    assert (vcpus(None), memory_mib(None), disk_mib(None)) == (
        DEFAULT_CPUS,
        DEFAULT_MEMORY_MIB,
        None,
    )
    limits = Limits(cpus=2.5, memory=3 << 30, disk=5 << 30)
    assert (vcpus(limits), memory_mib(limits), disk_mib(limits)) == (2, 3072, 5120)
