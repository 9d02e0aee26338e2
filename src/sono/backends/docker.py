"""Docker backend: one long-lived container per sandbox, each exec a ``docker exec`` as the
unprivileged agent user, through the ``docker`` SDK (honours ``DOCKER_HOST``).

Same contract and guarantees as bwrap: the workspace is the only writable host path, git
objects and agent CLIs are mounted read-only at their host paths, credentials are copied
into the container's home (never bind-mounted), no docker socket, no ``~/.ssh``. No
network (``network_mode=none``) but so's proxy and model gateway over Unix sockets; the
engine enforces memory/cpus/pids. Every command so runs as the agent (agent runs and so's
own git alike) has a root parent inside the container (``runner/supervise.py``) that kills,
when the command ends or is ended, every agent process it left behind; only processes under
a live ``docker exec`` (an open ``so shell``) are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import secrets
import shutil
import tarfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from sono import proc
from sono.backends.base import BackendSettings, Health, SandboxSpec
from sono.backends.docker_engine import connect
from sono.backends.docker_limits import cgroup_dirs, docker_kwargs, plan_limits
from sono.backends.execution import PATH, Stopper, disk_watch, sandbox_env
from sono.errors import SoError
from sono.home import pid_alive
from sono.images import Images, RunnerSpec, agent_ids
from sono.layout import FORWARDER_INSIDE, INSIDE_DIR, forwarder_argv
from sono.limits.cgroup import cgroup_counters
from sono.limits.model import Enforcement, Limits
from sono.limits.watch import Guard
from sono.overlay import static_obstacle, strip_setid
from sono.trust import TrustStore

LABEL = "so.sandbox"
MOUNTS_LABEL = "so.mounts"
# Not under /tmp: that may be a tmpfs (the disk limit), which put_archive cannot reach.
PROMPT_DIR = "/home/agent"
PROMPT_PATH = f"{PROMPT_DIR}/.so-stdin"
FORWARDER_READY = "/run/so-forward.ready"
# $0 = the ready file, "$@" = the forwarder's command line; a running one is kept.
FORWARDER_START = (
    'if [ -e "$0" ] && kill -0 "$(cat "$0.pid" 2>/dev/null)" 2>/dev/null; then exit 0; fi; '
    'rm -f "$0"; "$@" --ready "$0" </dev/null >/dev/null 2>&1 & echo $! > "$0.pid"; '
    'i=0; while [ ! -e "$0" ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; [ -e "$0" ]'
)
RUN_MARK = "SO_RUN"  # in the environment of what an agent run starts (for diagnosis)
# The image's interpreter by absolute path, isolated (no PYTHON* variables, no user site,
# no script dir on sys.path): root inside the container runs nothing the agent can write.
PYTHON = ("/usr/bin/python3", "-I", "-S", "-c")
# Root in the container keeps only what supervise.py needs: signal the agent's processes,
# drop to its uid. The agent (another uid, no-new-privileges) can never gain them.
CAPS = ("KILL", "SETUID", "SETGID", "SETPCAP")  # the supervisor; SETPCAP drops the bounding set
# Part of the mounts key: containers made before the supervisor are recreated.
CONFIG_VERSION = "supervised-2"
SUPERVISE = resources.files("sono.runner").joinpath("supervise.py").read_text()
TMPFS_INODES = 65536  # every tmpfs: an inode cap (an empty file costs kernel memory)
SHM_SIZE = 64 << 20
Progress = Callable[[str], None]


RUN_TOKEN = re.compile(r"[0-9a-f]{16}")


def _runs_dir(spec: SandboxSpec) -> Path:
    """Host-side, so's own: one file per agent run in progress, named by its token,
    holding the pid of the so process that follows it."""
    return spec.home_seed.parent / "docker-runs"


def container_name(sandbox_id: str) -> str:
    return f"so-{sandbox_id}"


def volume_name(sandbox_id: str) -> str:
    return f"so-{sandbox_id}"


def mounts_key(spec: SandboxSpec, image: str) -> str:
    """Changes of any of these need a new container (mounts, network, limits)."""
    where = spec.overlay.mount_options() if spec.overlay else str(spec.workspace)
    if spec.limits is not None:
        where += f"\nlimits:{spec.limits}"
    if spec.net is not None:
        where += f"\nnet:{spec.net.socket_dir}:{spec.net.forwarder}"
    text = "\n".join(
        [CONFIG_VERSION, image, where, *(f"{m.src}:{m.dest}:{m.writable}" for m in spec.mounts)]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def container_config(spec: SandboxSpec, image: str, *, gpus: bool) -> dict[str, Any]:
    """``containers.create`` keyword arguments; pure, unit-tested."""
    from docker.types import DeviceRequest, DriverConfig, Mount

    ov = spec.overlay
    if ov is None:
        mounts = [Mount(target=spec.mount_point, source=str(spec.workspace), type="bind")]
    else:
        # A local volume of type overlay: the engine mounts project + upper layer for us.
        # nosuid: what the agent marks setuid means nothing inside either.
        options = {
            "type": "overlay",
            "device": "overlay",
            "o": f"{ov.mount_options()},nosuid,nodev",
        }
        mounts = [
            Mount(
                target=spec.mount_point,
                source=volume_name(spec.id),
                type="volume",
                no_copy=True,  # never copy the image's /workspace into the project
                driver_config=DriverConfig("local", options),
            ),
            Mount(target=f"{spec.mount_point}/.git", source=str(ov.gitdir), type="bind"),
        ]
    mounts += [
        Mount(target=m.dest, source=str(m.src), type="bind", read_only=not m.writable)
        for m in spec.mounts
    ]
    if spec.net is not None:
        mounts += [
            # Read-only: connect() works, planting a symlink in place of a socket does not.
            Mount(target=INSIDE_DIR, source=str(spec.net.socket_dir), type="bind", read_only=True),
            Mount(
                target=FORWARDER_INSIDE,
                source=str(spec.net.forwarder),
                type="bind",
                read_only=True,
            ),
        ]
    config: dict[str, Any] = {
        "image": image,
        "name": container_name(spec.id),
        "command": ["sleep", "infinity"],
        "labels": {LABEL: spec.id, MOUNTS_LABEL: mounts_key(spec, image)},
        "mounts": mounts,
        "working_dir": spec.mount_point,
        "hostname": f"so-{spec.id}",
        # No network but loopback: so's proxy and gateway through the forwarder. Sandboxes
        # made before the network policy keep the host's network.
        "network_mode": "none" if spec.net is not None else "host",
        "init": True,  # reap the zombies agents leave behind
        "cap_drop": ["ALL"],
        "cap_add": list(CAPS),
        "security_opt": ["no-new-privileges"],
        "detach": True,
    }
    if gpus:
        config["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    config["tmpfs"] = tmpfs_mounts(spec.limits)
    if spec.limits is not None:
        config |= docker_kwargs(spec.limits)
    return config


def tmpfs_mounts(limits: Limits | None) -> dict[str, str]:
    """Every tmpfs the agent can write is sized and has an inode cap (its pages are the
    host's RAM): ``/dev/shm`` always (Docker's own has no inode cap), ``/tmp`` under a
    disk limit (the container's, not the workspace's)."""
    opts = f"nr_inodes={TMPFS_INODES},mode=1777,nosuid,nodev"
    mounts = {"/dev/shm": f"size={SHM_SIZE},{opts},noexec"}
    if limits is not None and limits.disk is not None:
        mounts["/tmp"] = f"size={limits.disk},{opts}"
    return mounts


def supervised(uid: int, gid: int, token: str, cwd: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run as ``uid:gid`` in ``cwd`` under a root parent that kills whatever it
    leaves behind (an exec as ``0:0``, from ``/``)."""
    return [*PYTHON, SUPERVISE, "run", str(uid), str(gid), token, cwd, *argv]


def forwarder_euid(host_uid: int | None = None) -> int | None:
    """The uid the forwarder (root in the container) connects to the sockets with: their
    owner, so's own uid — none when that is root, which owns them already. Root in the
    container has no ``DAC_OVERRIDE``: a 0600 socket of another uid is closed to it."""
    uid = os.getuid() if host_uid is None else host_uid
    return None if uid == 0 else uid


def reaper(token: str | None = None) -> list[str]:
    """Kill every agent process no engine-started process owns; with ``token``, that run's
    processes too (see supervise.py)."""
    return [*PYTHON, SUPERVISE, "reap", *(("--end", token) if token else ())]


def exec_env(spec: SandboxSpec, env: Mapping[str, str]) -> dict[str, str]:
    """The image's agent user, whatever the spec names (the runner image has it)."""
    return sandbox_env(spec, env, proxied=spec.net is not None, home=PROMPT_DIR, user="agent")


def terminal_name(term: str | None) -> str:
    """The user's ``TERM`` when it is a terminal name, else ``xterm``: the one value of
    the user's environment a shell takes in."""
    if term and len(term) <= 64 and all(c.isascii() and (c.isalnum() or c in "._+-") for c in term):
        return term
    return "xterm"


def home_archive(seed: Path, uid: int, gid: int) -> bytes:
    """A tar of the credential seed, owned by the agent user, for ``put_archive``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(seed.rglob("*")):
            if path.is_symlink():
                continue
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(seed)))
            info.uid, info.gid, info.uname, info.gname = uid, gid, "agent", "agent"
            if path.is_file():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def file_archive(name: str, data: bytes, uid: int, gid: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.uid, info.gid, info.mode = len(data), uid, gid, 0o600
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerBackend:
    name: ClassVar[str] = "docker"

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> DockerBackend:
        return cls(base=settings.docker_base, progress=settings.progress)

    def __init__(
        self,
        *,
        base: str | None = None,
        project: Path | None = None,
        progress: Progress | None = None,
    ) -> None:
        self._base = base
        self._project = project
        self._progress = progress or (lambda line: None)
        self._client: Any = None
        self.uid, self.gid = agent_ids()
        # Checked once per process: image, mounts and state are verified on first use; a
        # container that vanishes later is noticed by the failing exec and recreated.
        self._live: dict[str, Any] = {}
        self._live_keys: dict[str, tuple[object, ...]] = {}  # what the live one was made for
        self._forwarding: set[str] = set()  # sandboxes whose container's forwarder runs
        self._seeded: dict[str, tuple[tuple[str, int, int], ...]] = {}

    # ---------------------------------------------------------------- engine and image

    def client(self) -> Any:
        if self._client is None:
            self._client = connect()
        return self._client

    def images(self) -> Images:
        return Images(self.client())

    def runner_spec(self, project: Path | None = None) -> RunnerSpec:
        base = self._base or self.images().default_base()
        project = project or self._project
        trusted = TrustStore.default(os.environ).trusted_context(project) if project else None
        return RunnerSpec(
            base=base, uid=self.uid, gid=self.gid, project=project, trusted_context=trusted
        )

    def image_for(self, spec: SandboxSpec) -> str:
        return self.images().ensure(self.runner_spec(spec.project), self._progress)

    # ---------------------------------------------------------------- containers

    def _find(self, spec: SandboxSpec) -> Any | None:
        found = self.client().containers.list(all=True, filters={"label": f"{LABEL}={spec.id}"})
        return found[0] if found else None

    def create(self, *, spec: SandboxSpec) -> None:
        spec.home_seed.mkdir(parents=True, exist_ok=True)
        if spec.overlay is None and (os.getuid(), os.getgid()) != (self.uid, self.gid):
            # Root on the host: hand so's own copy to the unprivileged container user.
            proc.run(["chown", "-R", f"{self.uid}:{self.gid}", str(spec.workspace)])
        self._container(spec)

    def _container(self, spec: SandboxSpec) -> Any:
        """The running container for ``spec``: started, or recreated from the workspace
        when it died, vanished or its mounts changed behind our back."""
        if spec.overlay is not None:
            spec.overlay.require_lower(spec.id)
        live = self._live.get(spec.id)
        if live is not None and self._live_keys.get(spec.id) == (spec.mounts, spec.limits):
            return live
        image = self.image_for(spec)
        container = self._find(spec)
        if container is not None and container.labels.get(MOUNTS_LABEL) != mounts_key(spec, image):
            container.remove(force=True)
            container = None
        if container is None:
            config = container_config(spec, image, gpus=self._gpus())
            container = self.client().containers.create(**config)
            container.start()
            self._seed_home(container, spec)
        elif container.status != "running":
            container.start()
        else:
            self._end_orphans(container, spec)
        self._forwarding.discard(spec.id)
        self._live[spec.id] = container
        self._live_keys[spec.id] = (spec.mounts, spec.limits)
        return container

    def _ensure_forwarder(self, container: Any, spec: SandboxSpec) -> None:
        """One forwarder per container, as root (the agent's pkill on a timeout, and the
        agent itself, cannot take the sandbox's way out down with it), started by the first
        agent run or shell that needs it — not at creation — in one exec that returns once
        it listens."""
        if spec.net is None or spec.id in self._forwarding:
            return
        result = container.exec_run(
            ["sh", "-c", FORWARDER_START, FORWARDER_READY, *forwarder_argv(euid=forwarder_euid())],
            user="0:0",
        )
        if result.exit_code != 0:
            raise SoError(f"the network forwarder did not start in container {container.name}")
        self._forwarding.add(spec.id)

    def _exec_create(self, spec: SandboxSpec, command: list[str], **kwargs: Any) -> str:
        """``exec_create`` on the live container, recreating it once if it went away."""
        import docker.errors

        for attempt in (1, 2):
            container = self._container(spec)
            try:
                return str(self.client().api.exec_create(container.id, command, **kwargs)["Id"])
            except docker.errors.APIError:
                if attempt == 2:
                    raise
                self._live.pop(spec.id, None)  # died or removed behind our back
                self._seeded.pop(spec.id, None)
        raise AssertionError("unreachable")

    def _gpus(self) -> bool:
        runtimes = self.client().info().get("Runtimes", {})
        return "nvidia" in runtimes

    def _seed_home(self, container: Any, spec: SandboxSpec) -> None:
        """Copy the credential seed in, unless this exact seed is already there."""
        signature = tuple(
            (str(p), p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(spec.home_seed.rglob("*"))
            if p.is_file() and not p.is_symlink()
        )
        if self._seeded.get(spec.id) == signature:
            return
        container.put_archive("/home/agent", home_archive(spec.home_seed, self.uid, self.gid))
        self._seeded[spec.id] = signature

    # ---------------------------------------------------------------- exec

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
        container = self._container(spec)
        self._seed_home(container, spec)  # fresh copies of the credentials every run
        self._ensure_forwarder(container, spec)
        command = list(argv)
        if stdin_text is not None:
            container.put_archive(
                PROMPT_DIR,
                file_archive(".so-stdin", stdin_text.encode(), self.uid, self.gid),
            )
            command = ["sh", "-c", f'exec "$@" < {PROMPT_PATH}', "so-init", *argv]
        token = secrets.token_hex(8)
        exec_id = self._exec_create(
            spec,
            supervised(self.uid, self.gid, token, spec.mount_point, command),
            user="0:0",
            environment={**exec_env(spec, env), RUN_MARK: token},
            workdir="/",
        )
        marker = _runs_dir(spec) / token  # whose run this is: see _end_orphans
        marker.parent.mkdir(mode=0o700, exist_ok=True)
        marker.write_text(str(os.getpid()))
        stream = self.client().api.exec_start(exec_id, stream=True)
        try:
            with self._guard(container, spec) as guard:
                return self._follow(
                    container,
                    exec_id,
                    stream,
                    timeout,
                    on_line,
                    guard=guard,
                    token=token,
                    stop=stop,
                )
        except BaseException:
            self._reap(container, token)
            raise
        finally:
            marker.unlink(missing_ok=True)
            strip_setid(spec.agent_writable)  # the supervisor reaped what the run left

    def _end_orphans(self, container: Any, spec: SandboxSpec) -> None:
        """A run whose so process died (kill -9) goes on in the engine: bwrap's agent dies
        with so, a container outlives its client. Before this process uses the container,
        each such run is ended, so a `so continue` never runs a second agent beside it."""
        runs = _runs_dir(spec)
        for marker in runs.iterdir() if runs.is_dir() else ():
            try:
                pid = int(marker.read_text())
            except (OSError, ValueError):
                pid = 0
            if pid_alive(pid) or not RUN_TOKEN.fullmatch(marker.name):
                continue
            self._reap(container, marker.name)
            marker.unlink(missing_ok=True)

    def _reap(self, container: Any, token: str | None = None) -> None:
        """End what so's commands left behind (daemons, ``setsid`` or ``env -i`` children,
        a hook's or fsmonitor's server): bwrap gets this from its pid namespace, a container
        outlives its execs. Each supervised command reaps after itself; this is for a run
        ended early (``token``) and after a shell. As root, from the image's own python."""
        with contextlib.suppress(Exception):
            container.exec_run(reaper(token), user="0:0", workdir="/", environment={"PATH": PATH})

    @contextlib.contextmanager
    def _guard(self, container: Any, spec: SandboxSpec) -> Iterator[Guard | None]:
        """The engine enforces memory/cpus/pids; this notices when one was hit (the
        container's cgroup counters) and watches the workspace's disk use."""
        limits = spec.limits
        if limits is None or not limits.any():
            yield None
            return
        dirs = cgroup_dirs(container.id)
        counters = (lambda: cgroup_counters(dirs)) if dirs else None
        also = container_layer(container) if limits.disk is not None else ()
        with disk_watch(spec, also=also) as disk:
            yield Guard(disk=disk, counters=counters)

    def _follow(
        self,
        container: Any,
        exec_id: str,
        stream: Any,
        timeout: float | None,
        on_line: Callable[[str], None],
        *,
        guard: Guard | None = None,
        token: str | None = None,
        stop: Callable[[], str | None] | None = None,
    ) -> proc.Streamed:
        stopper = Stopper(timeout, guard, stop)
        reader = threading.Thread(target=_pump, args=(stream, on_line), daemon=True)
        reader.start()
        try:
            while reader.is_alive():
                if stopper.should_stop():
                    self._reap(container, token)
                    break
                reader.join(timeout=0.05)
        except KeyboardInterrupt:
            self._reap(container, token)
            reader.join(timeout=5)
            raise
        reader.join(timeout=10)
        stopper.settle()
        code = (
            None if stopper.timed_out else self.client().api.exec_inspect(exec_id).get("ExitCode")
        )
        return stopper.result(code)

    def run(
        self,
        *,
        spec: SandboxSpec,
        argv: Sequence[str],
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> proc.Completed:
        api = self.client().api
        exec_id = self._exec_create(
            spec,
            supervised(self.uid, self.gid, secrets.token_hex(8), spec.mount_point, argv),
            user="0:0",
            environment=exec_env(spec, env or {}),
            workdir="/",
        )
        try:
            out, err = api.exec_start(exec_id, demux=True)
        finally:
            strip_setid(spec.agent_writable)
        code = api.exec_inspect(exec_id).get("ExitCode")
        done = proc.Completed(
            tuple(argv),
            int(code or 0),
            (out or b"").decode(errors="replace"),
            (err or b"").decode(errors="replace"),
        )
        if check and done.returncode != 0:
            raise proc.CommandError(done)
        return done

    def shell(self, *, spec: SandboxSpec, argv: Sequence[str] = ()) -> int:
        container = self._container(spec)
        self._ensure_forwarder(container, spec)
        cli = shutil.which("docker")
        if cli is None:
            raise SoError("so shell on Docker needs the docker CLI on PATH (apt install docker.io)")
        flags = ["-it"] if os.isatty(0) and os.isatty(1) else ["-i"]
        env = exec_env(
            spec, {"TERM": terminal_name(os.environ.get("TERM")), "PS1": f"(so:{spec.id}) \\w\\$ "}
        )
        command = list(argv) or ["bash", "--norc", "-i"]
        try:
            return self._attach(
                cli=cli, flags=flags, env=env, container=container, spec=spec, command=command
            )
        finally:
            self._reap(container)  # what the shell left running ends with it
            strip_setid(spec.agent_writable)

    def _attach(
        self,
        *,
        cli: str,
        flags: list[str],
        env: Mapping[str, str],
        container: Any,
        spec: SandboxSpec,
        command: list[str],
    ) -> int:
        """The user's terminal on ``command``, an exec as the agent: its parent is outside
        the container, which is how reaping knows it for a live shell."""
        env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        return proc.interactive(
            [
                cli,
                "exec",
                *flags,
                "-u",
                f"{self.uid}:{self.gid}",
                "-w",
                spec.mount_point,
                *env_args,
                container.id,
                *command,
            ]
        )

    def destroy(self, *, spec: SandboxSpec) -> None:
        try:
            container = self._find(spec)
        except SoError:
            return  # no engine: nothing of ours can be running there
        if container is not None:
            container.remove(force=True)
        if spec.overlay is not None:
            self._remove_volume(spec)

    def _remove_volume(self, spec: SandboxSpec) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            self.client().volumes.get(volume_name(spec.id)).remove(force=True)
        ov = spec.overlay
        if ov is not None and os.getuid() != 0 and ov.workdir.exists():
            # overlayfs (mounted by the root engine) left root-owned dirs in its work dir.
            with contextlib.suppress(Exception):
                self.client().containers.run(
                    self.image_for(spec),
                    ["rm", "-rf", "/w/work"],
                    user="0:0",
                    remove=True,
                    network_mode="none",
                    volumes={str(ov.workdir): {"bind": "/w", "mode": "rw"}},
                )

    def plan_limits(self, limits: Limits) -> dict[str, Enforcement]:
        return plan_limits(limits)

    def refresh(self, *, spec: SandboxSpec) -> None:
        """Restart the container: the engine unmounts the overlay volume and mounts it
        again, so the host's changes to the project are seen as they are now."""
        if spec.overlay is None:
            return
        container = self._container(spec)
        container.stop(timeout=2)
        container.start()
        self._forwarding.discard(spec.id)

    def overlay_owner(self) -> tuple[int, int] | None:
        if (os.getuid(), os.getgid()) == (self.uid, self.gid):
            return None
        return (self.uid, self.gid)

    def overlay_obstacle(self, project: Path, home: Path) -> str | None:
        host = os.environ.get("DOCKER_HOST", "")
        if host and not host.startswith("unix://"):
            return f"the Docker engine at {host} is not on this machine (it cannot see {home})"
        return static_obstacle(project, home, owner_uid=self.uid)

    def health(self) -> Health:
        try:
            client = self.client()
        except SoError as exc:
            return Health(False, str(exc), "start the Docker engine, or use -s bwrap")
        version = client.version().get("Version", "?")
        spec = self.runner_spec()
        images = self.images()
        if images.exists(images.runner_tag(spec)):
            return Health(True, f"engine {version}; runner image {images.runner_tag(spec)} ready")
        if images.exists(spec.base):
            return Health(True, f"engine {version}; runner image buildable from {spec.base}")
        return Health(
            True,
            f"engine {version}; base {spec.base} not present locally (pulled "
            "on first build; offline: `so image bootstrap`)",
        )


def _pump(stream: Any, on_line: Callable[[str], None]) -> None:
    splitter = proc.LineSplitter()  # a line without end must not grow this process
    with contextlib.suppress(Exception):
        for chunk in stream:
            for line in splitter.feed(chunk):
                on_line(line)
    for line in splitter.end():
        on_line(line)


def container_layer(container: Any) -> tuple[Path, ...]:
    """The container's own writable layer on the host (``$HOME``, ``/var/tmp``… of the
    agent), counted in the disk limit with the workspace; nothing where the storage
    driver keeps it elsewhere or so cannot read it (rootless engines)."""
    try:
        upper = container.attrs["GraphDriver"]["Data"]["UpperDir"]
    except (KeyError, TypeError):
        return ()
    path = Path(upper) if isinstance(upper, str) else None
    return (path,) if path is not None and os.access(path, os.R_OK | os.X_OK) else ()
