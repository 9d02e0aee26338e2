"""bwrap: the pure argv builder, and the real policy on real namespaces."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from sono.backends.base import Mount, SandboxSpec
from sono.backends.bwrap import (
    TMPFS_DEFAULTS,
    BwrapBackend,
    BwrapOptions,
    bwrap_argv,
    bwrap_options,
    launch,
    own_workdir,
    shell_git_env,
    userns_fix,
)
from sono.limits import Limits
from sono.overlay import Overlay


def spec(tmp_path: Path, **kw: object) -> SandboxSpec:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    seed = tmp_path / "state" / "home"
    seed.mkdir(parents=True, exist_ok=True)
    return SandboxSpec(id="t-1", workspace=work, home_seed=seed, **kw)  # type: ignore[arg-type]


def argv_for(tmp_path: Path, **kw: object) -> list[str]:
    return bwrap_argv(
        spec(tmp_path, **kw),
        ["echo", "hi"],
        {"FOO": "bar"},
        BwrapOptions("/bin/bwrap"),
        etc_dir=tmp_path / "etc",
    )


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_argv_namespaces_and_identity(tmp_path: Path) -> None:
    argv = argv_for(tmp_path)
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ):
        assert flag in argv
    assert argv[argv.index("--uid") + 1] == "1000"
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--unshare-net" not in argv  # host network in this release, documented


def test_argv_overlay_workspace(tmp_path: Path) -> None:
    ov = Overlay.under(tmp_path / "sb", tmp_path / "project")
    argv = argv_for(tmp_path, overlay=ov)
    i = argv.index("--overlay-src")
    assert argv[i : i + 6] == [
        "--overlay-src",
        str(ov.lower),
        "--overlay",
        str(ov.upper),
        str(ov.workdir),
        "/workspace",
    ]
    assert (str(ov.gitdir), "/workspace/.git") in pairs(argv, "--bind")
    assert argv.index("--bind", i) > i  # .git is bound on top of the mounted overlay
    assert (str(tmp_path / "work"), "/workspace") not in pairs(argv, "--bind")


def test_argv_mounts(tmp_path: Path) -> None:
    argv = argv_for(tmp_path, mounts=(Mount(Path("/opt/agent"), "/opt/agent"),))
    assert (str(tmp_path / "work"), "/workspace") in pairs(argv, "--bind")
    assert ("/opt/agent", "/opt/agent") in pairs(argv, "--ro-bind")
    binds = [src for src, _ in pairs(argv, "--bind") + pairs(argv, "--ro-bind")]
    home = os.path.expanduser("~")
    assert not any(b == home or b.endswith((".ssh", "docker.sock")) for b in binds)
    assert ("/etc/resolv.conf", "/etc/resolv.conf") in pairs(argv, "--ro-bind-try")
    assert "/etc/shadow" not in argv
    assert argv[argv.index("--remount-ro") + 1] == "/"


def test_argv_env_is_cleared_then_set(tmp_path: Path) -> None:
    argv = argv_for(tmp_path)
    env = dict(pairs(argv, "--setenv"))
    assert env["FOO"] == "bar" and env["HOME"] == "/home/agent" and env["USER"] == "agent"
    assert "SSH_AUTH_SOCK" not in env
    assert argv[-2:] == ["echo", "hi"]


def test_userns_fix_messages(tmp_path: Path) -> None:
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "apparmor_restrict_unprivileged_userns").write_text("1\n")
    assert "apparmor" in userns_fix(tmp_path).lower()
    (tmp_path / "kernel" / "apparmor_restrict_unprivileged_userns").write_text("0\n")
    (tmp_path / "kernel" / "unprivileged_userns_clone").write_text("0\n")
    assert "unprivileged_userns_clone=1" in userns_fix(tmp_path)


# --- real bwrap -------------------------------------------------------------------------


@pytest.fixture
def real(tmp_path: Path) -> tuple[BwrapBackend, SandboxSpec]:
    backend = BwrapBackend()
    s = spec(tmp_path)
    (s.home_seed / ".gitconfig").write_text("[user]\n\tname = t\n")
    backend.create(spec=s)
    return backend, s


def sh(real: tuple[BwrapBackend, SandboxSpec], script: str) -> tuple[int, str]:
    backend, s = real
    out = backend.run(spec=s, argv=["sh", "-c", script], check=False)
    return out.returncode, out.stdout + out.stderr


def test_health_on_this_host() -> None:
    health = BwrapBackend().health()
    assert health.ok, health


def test_runs_as_unprivileged_user_in_workspace(real: tuple[BwrapBackend, SandboxSpec]) -> None:
    code, out = sh(real, "id -u; id -un; pwd; echo $HOME; cat ~/.gitconfig")
    assert code == 0
    assert out.split()[:4] == ["1000", "agent", "/workspace", "/home/agent"]
    assert "name = t" in out


def test_workspace_writable_system_readonly(real: tuple[BwrapBackend, SandboxSpec]) -> None:
    _backend, s = real
    code, _ = sh(real, "echo ok > /workspace/made-inside")
    assert code == 0 and (s.workspace / "made-inside").read_text() == "ok\n"
    for target in ("/usr/evil", "/etc/evil", "/evil", "/opt/evil"):
        code, out = sh(real, f"mkdir -p $(dirname {target}) 2>/dev/null; echo x > {target}")
        assert code != 0, f"could write {target}: {out}"


def test_host_secrets_invisible(real: tuple[BwrapBackend, SandboxSpec]) -> None:
    _code, out = sh(
        real,
        "ls /root 2>&1; cat /etc/shadow 2>&1; ls ~/.ssh 2>&1; "
        "ls /var/run/docker.sock 2>&1; ls /proc/1/root/ 2>&1 | head -1",
    )
    assert "No such file" in out
    assert "root:" not in out


def test_pid_namespace_hides_host_processes(real: tuple[BwrapBackend, SandboxSpec]) -> None:
    code, out = sh(real, "ls /proc | grep -c '^[0-9]'")
    assert code == 0 and int(out.strip()) < 10


def test_home_is_fresh_each_exec(real: tuple[BwrapBackend, SandboxSpec]) -> None:
    sh(real, "echo state > ~/left-behind")
    _code, out = sh(real, "ls -A ~")
    assert "left-behind" not in out and ".gitconfig" in out


def sized_tmpfs(argv: list[str]) -> dict[str, int]:
    return {argv[i + 3]: int(argv[i + 1]) for i, a in enumerate(argv) if a == "--size"}


def test_argv_sizes_every_tmpfs(tmp_path: Path) -> None:
    argv = argv_for(tmp_path)
    tmpfs = {argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"}
    assert sized_tmpfs(argv) == dict(TMPFS_DEFAULTS)
    assert tmpfs == set(TMPFS_DEFAULTS)  # /dev/shm over --dev's unsized one
    shm = argv.index("/dev/shm")
    assert argv[shm - 1] == "--tmpfs" and shm > argv.index("--dev")  # over --dev's one
    limited = argv_for(tmp_path, limits=Limits(disk=64 * 1024**2))
    assert set(sized_tmpfs(limited).values()) == {64 * 1024**2}


def test_with_a_disk_limit_scratch_dirs_are_counted_with_the_workspace(tmp_path: Path) -> None:
    """Each exec binds its own host dirs under the sandbox's state dir for /tmp, /dev/shm
    and /home: the one disk watch of that dir counts them all; removed afterwards."""
    spec = SandboxSpec(
        id="t",
        workspace=tmp_path / "sb" / "work",
        home_seed=tmp_path / "sb" / "home",
        limits=Limits(disk=64 * 1024**2),
    )
    with own_workdir(spec) as spec_:
        assert spec_.scratch is not None and spec_.scratch.is_relative_to(spec.writable_dir)
        argv = bwrap_options(spec_, {}, BwrapOptions("/bin/bwrap"), etc_dir=tmp_path / "etc")
        for inside, name in (("/tmp", "tmp"), ("/dev/shm", "shm"), ("/home", "home")):
            i = argv.index(inside)
            assert argv[i - 2 : i] == ["--bind", str(spec_.scratch / name)]
        assert "--tmpfs" not in argv
        scratch = spec_.scratch
    assert not scratch.exists()
    with own_workdir(dataclasses.replace(spec, limits=None)) as plain:
        assert plain.scratch is None  # control: no disk limit, sized tmpfs


def test_launch_shows_only_bwrap_and_the_command(tmp_path: Path) -> None:
    full = argv_for(tmp_path)
    sep = full.index("--")
    with launch(full[0], full[1:sep], full[sep + 1 :], b"\0" * 8) as started:
        assert started.argv[:2] == ("bwrap", "--args")
        assert started.argv[4:] == tuple(full[sep + 1 :])
        assert str(tmp_path) not in " ".join(started.argv)
        args_fd, seccomp_fd = int(started.argv[2]), started.fds[0]
        data = os.pread(args_fd, 1 << 20, 0).split(b"\0")
        assert data[:-1] == [*map(os.fsencode, full[1:sep]), b"--seccomp", b"%d" % seccomp_fd]
        assert os.pread(seccomp_fd, 64, 0) == b"\0" * 8
    for fd in started.fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_shell_git_env_is_well_formed() -> None:
    env = shell_git_env()
    count = int(env["GIT_CONFIG_COUNT"])
    keys = [env[f"GIT_CONFIG_KEY_{i}"] for i in range(count)]
    assert {"core.hooksPath", "core.fsmonitor", "credential.helper"} <= set(keys)
    assert env["GIT_PAGER"] and env["GIT_ASKPASS"] == ""
