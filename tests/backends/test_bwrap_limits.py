"""bwrap limits: the plan on faked cgroup v2 / v1 / unwritable hosts, and on this host."""

from __future__ import annotations

import os
from pathlib import Path

from cgroup_fakes import (
    ALL,
    OTHER_UID,
    USER_SVC,
    MiB,
    delegate,
    desktop_v2,
    fake_proc,
    fake_v1,
    fake_v2,
    mechanisms,
    v2_group,
    write_tree,
)
from sono.backends.bwrap_limits import plan_limits
from sono.limits import Limits
from sono.limits.cgroup import (
    LIMIT_CONTROLLERS,
    find_cgroup,
    kernel_version,
)


def test_plan_v2_root_uses_hierarchy_root(tmp_path: Path) -> None:
    fs = fake_v2(
        tmp_path, "/system.slice/so.service", {"system.slice": v2_group(enabled="memory pids")}
    )
    site = find_cgroup(root=tmp_path, uid=0)
    assert site is not None and site.version == 2
    assert set(site.dirs.values()) == {fs}
    plan = plan_limits(ALL, root=tmp_path, uid=0)
    assert mechanisms(plan) == {
        "memory": "cgroup-v2",
        "cpus": "cgroup-v2",
        "pids": "cgroup-v2",
        "disk": "watchdog",
    }
    assert "memory.max=4294967296, memory.swap.max=0" in plan["memory"].detail
    assert f"in {fs / 'so'}/<sandbox>" in plan["memory"].detail
    assert "cpu.max=150000 100000" in plan["cpus"].detail
    assert "pids.max=256" in plan["pids"].detail
    assert "RLIMIT_FSIZE" in plan["disk"].detail
    assert plan["memory"].value == "4.0 GiB" and plan["memory"].detail.startswith("memory.max=")


def test_plan_v2_non_root_delegated_subtree(tmp_path: Path) -> None:
    fs = desktop_v2(tmp_path)
    uid = delegate(fs / USER_SVC / "app.slice")
    site = find_cgroup(root=tmp_path, uid=uid)
    # Not the scope itself (it holds our processes, so it cannot enable controllers for
    # children), but app.slice: ours, empty, memory+pids on and cpu enable-able.
    assert site is not None and site.version == 2
    assert dict(site.dirs) == dict.fromkeys(("memory", "cpu", "pids"), fs / USER_SVC / "app.slice")
    assert set(mechanisms(plan_limits(ALL, root=tmp_path, uid=uid)).values()) == {
        "cgroup-v2",
        "watchdog",
    }


def test_plan_v2_delegated_without_cpu(tmp_path: Path) -> None:
    fs = desktop_v2(tmp_path, app_controllers="memory pids")
    uid = delegate(fs / USER_SVC / "app.slice")
    plan = plan_limits(ALL, root=tmp_path, uid=uid, kernel=(6, 18))
    assert mechanisms(plan) == {
        "memory": "cgroup-v2",
        "cpus": "none",
        "pids": "cgroup-v2",
        "disk": "watchdog",
    }
    assert "no writable cgroup with the cpu controller" in plan["cpus"].detail


def test_plan_v2_not_delegated_falls_back_to_rlimits(tmp_path: Path) -> None:
    desktop_v2(tmp_path)  # everything owned by someone else
    assert find_cgroup(root=tmp_path, uid=OTHER_UID) is None
    plan = plan_limits(ALL, root=tmp_path, uid=OTHER_UID, kernel=(6, 18))
    assert mechanisms(plan) == {
        "memory": "none",
        "cpus": "none",
        "pids": "rlimit",
        "disk": "watchdog",
    }
    assert "RLIMIT_AS" in plan["memory"].detail and "V8" in plan["memory"].detail
    assert "RLIMIT_NPROC=256" in plan["pids"].detail
    assert "per user namespace" in plan["pids"].detail
    # Before 5.14 RLIMIT_NPROC counts all of the user's processes: not used.
    old = plan_limits(ALL, root=tmp_path, uid=OTHER_UID, kernel=(5, 10))
    assert old["pids"].mechanism == "none"
    assert "Linux < 5.14" in old["pids"].detail


def test_plan_kernel_read_from_root(tmp_path: Path) -> None:
    desktop_v2(tmp_path)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("5.4.0-150-generic\n")
    assert kernel_version(tmp_path) == (5, 4)
    assert plan_limits(Limits(pids=64), root=tmp_path, uid=OTHER_UID)["pids"].mechanism == "none"


def test_plan_no_cgroup_root(tmp_path: Path) -> None:
    fake_proc(tmp_path, "0::/\n")  # nothing mounted at /sys/fs/cgroup
    plan = plan_limits(Limits(pids=64, memory=MiB), root=tmp_path, uid=0, kernel=(6, 18))
    assert mechanisms(plan) == {"memory": "none", "pids": "none"}
    assert "exempt" in plan["pids"].detail
    # uid 0 of a user namespace (a rootless container) is not the host's root.
    fake_proc(tmp_path, "0::/\n", uid_map="0 100000 65536")
    plan = plan_limits(Limits(pids=64), root=tmp_path, uid=0, kernel=(6, 18))
    assert plan["pids"].mechanism == "rlimit"


def test_plan_v2_namespace_root_with_processes(tmp_path: Path) -> None:
    # In a container with a cgroup namespace "/" is not the real root: the rule of no
    # internal processes applies, and it holds our processes.
    fs = tmp_path / "sys/fs/cgroup"
    write_tree(fs, v2_group(procs="1\n7\n"))
    fake_proc(tmp_path, "0::/\n")
    assert find_cgroup(root=tmp_path, uid=0) is None
    # ...unless the controllers are already enabled below it.
    (fs / "cgroup.subtree_control").write_text("memory pids\n")
    site = find_cgroup(root=tmp_path, uid=0)
    assert site is not None and sorted(site.dirs) == ["memory", "pids"]


def test_plan_v2_someone_elses_so_dir(tmp_path: Path) -> None:
    fs = desktop_v2(tmp_path)
    app = fs / USER_SVC / "app.slice"
    write_tree(app / "so", v2_group())
    uid = delegate(app)
    if os.getuid() == 0:
        os.chown(app / "so", 0, 0)
    else:
        (app / "so").chmod(0o555)
    assert find_cgroup(root=tmp_path, uid=uid) is None


def test_plan_v1(tmp_path: Path) -> None:
    fs = fake_v1(tmp_path)
    site = find_cgroup(root=tmp_path, uid=0)
    assert site is not None and site.version == 1
    assert dict(site.dirs) == {
        "memory": fs / "memory/session/42",  # nested inside our own memory cgroup
        "cpu": fs / "cpu",
        "pids": fs / "pids",
    }
    plan = plan_limits(ALL, root=tmp_path, uid=0)
    assert set(mechanisms(plan).values()) == {"cgroup-v1", "watchdog"}
    assert "memory.memsw.limit_in_bytes (no swap)" in plan["memory"].detail
    assert "cpu.cfs_quota_us=150000 per cpu.cfs_period_us=100000" in plan["cpus"].detail
    assert plan["memory"].detail.startswith("memory.limit_in_bytes=4294967296 and memory.memsw")
    # v1 is root's: another user may write none of it.
    assert find_cgroup(root=tmp_path, uid=OTHER_UID) is None


def test_plan_v1_without_pids_controller(tmp_path: Path) -> None:
    fake_v1(tmp_path, pids=False)
    plan = plan_limits(ALL, root=tmp_path, uid=0, kernel=(6, 18))
    assert plan["memory"].mechanism == "cgroup-v1"
    assert plan["pids"].mechanism == "none"  # root: RLIMIT_NPROC would not bind


def test_plan_only_disk_reads_no_cgroups(tmp_path: Path) -> None:
    plan = plan_limits(Limits(disk=MiB, wall=5), root=tmp_path, uid=0)
    assert mechanisms(plan) == {"disk": "watchdog"}
    assert plan_limits(Limits(), root=tmp_path) == {}


def test_real_plan_matches_site() -> None:
    site = find_cgroup()
    plan = plan_limits(ALL)
    for limit, controller in LIMIT_CONTROLLERS.items():
        if site is not None and controller in site.dirs:
            assert plan[limit].mechanism == f"cgroup-v{site.version}"
        else:
            assert plan[limit].mechanism in ("rlimit", "none")
    assert plan["disk"].mechanism == "watchdog"
