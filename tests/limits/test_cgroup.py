"""limits.cgroup: jails on faked hosts, and real ones on this host (fork bomb, OOM, CPU quota)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgroup_fakes import (
    OTHER_UID,
    MiB,
    desktop_v2,
    fake_proc,
    fake_v1,
    fake_v2,
    write_tree,
)
from sono import proc
from sono.limits import Limits
from sono.limits import cgroup as cg
from sono.limits.cgroup import (
    JOIN_FAILED,
    CgroupJail,
    find_cgroup,
)


def test_jail_v2_writes_limits(tmp_path: Path) -> None:
    fs = fake_v2(tmp_path, "/", {})
    leaf = fs / "so/t-1"
    write_tree(fs / "so", {"cgroup.subtree_control": ""})
    files = ("memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.procs", "cgroup.kill")
    write_tree(leaf, dict.fromkeys(files, ""))
    write_tree(leaf, {"memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n"})
    write_tree(leaf, {"pids.events": "max 0\n"})
    jail = CgroupJail.create(
        "t-1", Limits(memory=64 * MiB, cpus=1.5, pids=20), root=tmp_path, uid=0
    )
    assert jail is not None and jail.mechanism == "cgroup-v2"
    assert jail.enforced == {"memory", "cpus", "pids"}
    assert jail.leaves == (leaf,)
    assert (leaf / "memory.max").read_text() == str(64 * MiB)
    assert (leaf / "memory.swap.max").read_text() == "0"
    assert (leaf / "pids.max").read_text() == "20"
    assert (leaf / "cpu.max").read_text() == "150000 100000"
    assert not jail.oom_killed() and not jail.pids_hit()
    write_tree(leaf, {"memory.events": "max 9\noom 2\noom_kill 1\n", "pids.events": "max 5\n"})
    assert jail.oom_killed() and jail.pids_hit()
    assert jail.kill_all()
    assert (leaf / "cgroup.kill").read_text() == "1"
    jail.remove()  # a plain directory with files: rmdir fails, quietly


def test_jail_v2_unset_controller_file_missing(tmp_path: Path) -> None:
    fs = fake_v2(tmp_path, "/", {})
    write_tree(fs / "so", {"cgroup.subtree_control": ""})
    write_tree(fs / "so/t-2", {"cgroup.procs": "", "memory.max": ""})  # no pids.max
    jail = CgroupJail.create("t-2", Limits(memory=MiB, pids=20), root=tmp_path, uid=0)
    assert jail is not None and jail.enforced == {"memory"}


def test_jail_v1_writes_limits(tmp_path: Path) -> None:
    fs = fake_v1(tmp_path)
    mem = fs / "memory/session/42/so/t-3"
    oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"
    write_tree(
        mem,
        {
            "memory.limit_in_bytes": "",
            "memory.memsw.limit_in_bytes": "",
            "memory.oom_control": oom,
            "cgroup.procs": "",
        },
    )
    cpu_files = {"cpu.cfs_quota_us": "", "cpu.cfs_period_us": "", "cgroup.procs": ""}
    write_tree(fs / "cpu,cpuacct/so/t-3", cpu_files)
    write_tree(fs / "pids/so/t-3", {"pids.max": "", "pids.events": "max 0\n", "cgroup.procs": ""})
    jail = CgroupJail.create(
        "t-3", Limits(memory=64 * MiB, cpus=0.5, pids=20), root=tmp_path, uid=0
    )
    assert jail is not None and jail.mechanism == "cgroup-v1"
    assert jail.enforced == {"memory", "cpus", "pids"}
    assert (mem / "memory.limit_in_bytes").read_text() == str(64 * MiB)
    assert (mem / "memory.memsw.limit_in_bytes").read_text() == str(64 * MiB)
    assert (fs / "cpu/so/t-3/cpu.cfs_quota_us").read_text() == "50000"
    assert (fs / "cpu/so/t-3/cpu.cfs_period_us").read_text() == "100000"
    assert (fs / "pids/so/t-3/pids.max").read_text() == "20"
    assert len(jail.leaves) == 3
    assert not jail.oom_killed()
    (mem / "memory.oom_control").write_text(oom.replace("oom_kill 0", "oom_kill 2"))
    assert jail.oom_killed()


def test_jail_v1_old_kernel_oom_from_failcnt(tmp_path: Path) -> None:
    fs = fake_v1(tmp_path)
    mem = fs / "memory/session/42/so/t-4"
    write_tree(mem, {"memory.limit_in_bytes": "", "memory.oom_control": "oom_kill_disable 0\n"})
    write_tree(mem, {"memory.failcnt": "0\n", "cgroup.procs": ""})
    jail = CgroupJail.create("t-4", Limits(memory=MiB), root=tmp_path, uid=0)
    assert jail is not None and not jail.oom_killed()
    (mem / "memory.failcnt").write_text("17\n")
    assert jail.oom_killed()


def test_jail_none_without_writable_cgroup(tmp_path: Path) -> None:
    desktop_v2(tmp_path)
    assert CgroupJail.create("t-5", Limits(pids=20), root=tmp_path, uid=OTHER_UID) is None
    fake_proc(tmp_path / "empty", "0::/\n")
    assert CgroupJail.create("t-5", Limits(pids=20), root=tmp_path / "empty", uid=0) is None


@pytest.mark.parametrize("name", ["", "..", "a/b", "-x", "x y", "a" * 200])
def test_jail_name_is_validated(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="invalid cgroup name"):
        CgroupJail.create(name, Limits(pids=20), root=tmp_path)


def test_wrap_runs_argv_verbatim(tmp_path: Path) -> None:
    """The prefix really joins (here: a plain file stands in for cgroup.procs) and hands
    the command over untouched — no shell parsing of any argument."""
    leaves = [tmp_path / "a", tmp_path / "b"]
    for leaf in leaves:
        write_tree(leaf, {"cgroup.procs": ""})
    jail = CgroupJail("w", 1, {"memory": leaves[0], "pids": leaves[1]}, frozenset())
    tricky = ["$(touch pwned)", "a b", "; echo no", "--", "`id`", "'\"", "*"]
    out = proc.run(jail.wrap(["printf", "%s\n", *tricky]), cwd=tmp_path)
    assert out.stdout.splitlines() == tricky
    assert not (tmp_path / "pwned").exists()
    pids = {(leaf / "cgroup.procs").read_text().strip() for leaf in leaves}
    assert len(pids) == 1 and pids.pop().isdigit()  # the same process joined both


def test_wrap_fails_closed(tmp_path: Path) -> None:
    jail = CgroupJail("w", 2, {"pids": tmp_path / "gone"}, frozenset())
    marker = tmp_path / "ran"
    out = proc.run(jail.wrap(["touch", str(marker)]), check=False)
    assert out.returncode == JOIN_FAILED
    assert "cannot join cgroup" in out.stderr
    assert not marker.exists()
    with pytest.raises(ValueError):
        jail.wrap([])


# ---------------------------------------------------------------------------- real cgroups


def real_jail(limits: Limits, *controllers: str) -> CgroupJail:
    site = find_cgroup()
    if site is None:
        pytest.skip(
            "no writable cgroup on this host (cgroup tests need root on v1, or v2 delegation)"
        )
    missing = [c for c in controllers if c not in site.dirs]
    if missing:
        pytest.skip(f"writable cgroup v{site.version} lacks the {', '.join(missing)} controller")
    jail = CgroupJail.create(f"test-{os.getpid()}-{secrets.token_hex(4)}", limits)
    assert jail is not None
    return jail


@pytest.fixture
def jails() -> Iterator[list[CgroupJail]]:
    made: list[CgroupJail] = []
    yield made
    for jail in made:
        jail.remove()
        assert not any(leaf.exists() for leaf in jail.leaves)


def test_real_pids_limit_stops_fork_bomb(jails: list[CgroupJail]) -> None:
    jail = real_jail(Limits(pids=20), "pids")
    jails.append(jail)
    assert jail.enforced == {"pids"}
    script = "for i in $(seq 100); do sleep 5 & done; wait"
    child = subprocess.Popen(jail.wrap(["sh", "-c", script]), stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not jail.pids_hit() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert jail.pids_hit()
        inside = jail.procs()
        assert 0 < len(inside) <= 20  # not all 100 sleeps started
        assert jail.kill_all()
        assert jail.procs() == set()
    finally:
        child.kill()
        _, err = child.communicate(timeout=10)
    assert b"fork" in err.lower() or child.returncode == -signal.SIGKILL


def test_real_memory_limit_oom_kills(jails: list[CgroupJail]) -> None:
    jail = real_jail(Limits(memory=64 * MiB), "memory")
    jails.append(jail)
    assert jail.enforced == {"memory"}
    small = proc.run(jail.wrap([sys.executable, "-c", "b = b'x' * (8 * 1024 * 1024)"]))
    assert small.returncode == 0 and not jail.oom_killed()
    big = "b = bytearray(300*1024*1024); import time; time.sleep(1)"
    out = proc.run(jail.wrap(["python3", "-c", big]), check=False)
    assert out.returncode == -signal.SIGKILL  # the OOM killer's signal
    assert jail.oom_killed()


def test_real_cpu_quota_throttles(jails: list[CgroupJail]) -> None:
    jail = real_jail(Limits(cpus=0.1), "cpu")
    jails.append(jail)
    assert jail.enforced == {"cpus"}
    spin = (
        "import time\nt = time.monotonic()\n"
        "while time.monotonic() - t < 1.0: pass\n"
        "print(time.process_time())"
    )
    out = proc.run(jail.wrap([sys.executable, "-c", spin]))
    assert float(out.stdout) < 0.5  # ~0.1 CPU-seconds per wall second, not 1.0
    stat = cg._keyed(jail.dirs["cpu"] / "cpu.stat")
    assert stat.get("nr_throttled", 0) > 0


def test_real_context_manager_removes(tmp_path: Path) -> None:
    jail = real_jail(Limits(pids=50), "pids")
    with jail:
        child = subprocess.Popen(jail.wrap(["sleep", "60"]))
        deadline = time.monotonic() + 5
        while not jail.procs() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert child.pid in jail.procs()
    assert child.wait(timeout=10) == -signal.SIGKILL
    assert not any(leaf.exists() for leaf in jail.leaves)


def test_wrap_with_executable_sets_argv0(tmp_path: Path) -> None:
    """bwrap is started as plain "bwrap": its host path stays out of /proc/*/cmdline."""
    jail = CgroupJail("t", 2, {"pids": tmp_path}, frozenset())
    (tmp_path / "cgroup.procs").write_text("")
    show = "print(open('/proc/self/cmdline', 'rb').read().split(bytes(1))[0].decode())"
    out = proc.run(jail.wrap(["shown-name", "-c", show], executable=sys.executable))
    assert out.stdout.strip() == "shown-name"
    assert (tmp_path / "cgroup.procs").read_text().strip().isdigit()  # it joined
