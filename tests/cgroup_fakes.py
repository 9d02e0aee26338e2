"""Fake hosts for cgroup planning and jails: /proc and /sys/fs/cgroup laid out as a v2
(root, delegated desktop session) or v1 host under a temporary root."""

from __future__ import annotations

import os
from pathlib import Path

from sono.limits import Enforcement, Limits

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
