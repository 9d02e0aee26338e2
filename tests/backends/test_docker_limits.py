"""Docker limits: the engine's create arguments and the plan."""

from __future__ import annotations

from cgroup_fakes import (
    ALL,
    MiB,
    mechanisms,
)
from sono.backends.docker_limits import docker_kwargs
from sono.backends.docker_limits import plan_limits as plan_docker
from sono.limits import Limits


def test_docker_kwargs() -> None:
    assert docker_kwargs(Limits()) == {}
    assert docker_kwargs(Limits(disk=1, wall=3)) == {}
    assert docker_kwargs(ALL) == {
        "mem_limit": 4 * 1024 * MiB,
        "memswap_limit": 4 * 1024 * MiB,
        "nano_cpus": 1_500_000_000,
        "pids_limit": 256,
    }
    assert docker_kwargs(Limits(cpus=0.1))["nano_cpus"] == 100_000_000  # no float fuzz


def test_plan_docker() -> None:
    plan = plan_docker(ALL)
    assert mechanisms(plan) == {
        "memory": "docker",
        "cpus": "docker",
        "pids": "docker",
        "disk": "watchdog",
    }
    assert "memswap_limit=4294967296" in plan["memory"].detail
    assert plan_docker(Limits()) == {}
