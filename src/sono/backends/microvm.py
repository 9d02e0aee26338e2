"""microVM backend: one microsandbox VM per sandbox, each exec a process in its guest.

Same contract as bwrap and Docker, behind a hardware boundary: the agent runs on its own
guest kernel (libkrun through KVM, or Hypervisor.framework on Apple Silicon), not on the
host's. The VM boots from the Docker runner image (``docker save`` → ``Image.load``, no
registry), the sandbox's workspace copy is shared in at ``/workspace`` over virtiofs, the
agent's home is the project's persistent volume (``$SO_HOME/volumes/<slug>-<hash>``) with
the credential seed copied into it before every exec, agent CLIs and git objects are
mounted read-only at their host paths, and everything runs as the unprivileged uid 1000.

Booting needs a host that can run a VM (:func:`sono.kvm.boot_support`): every operation
checks it first and fails at once with the precise reason, never waiting on a VM that
cannot start.

Network: the VM's own interface is closed by microsandbox's network policy (nothing in or
out) and so's proxy and model gateway — the host-side servers of every backend — are its
only way out, through vsock routes to their Unix sockets and a forwarder inside that
exposes them on 127.0.0.1:3128/3129. docs/microvm.md has the matrix.

All SDK calls go through :class:`MicrosandboxApi` (the real one is :class:`SdkApi`), so the
mapping is unit-tested against a fake where no VM can boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sono import proc
from sono.backends.base import BackendSettings, Health, SandboxSpec
from sono.backends.docker_engine import connect
from sono.backends.execution import PATH, Stopper, disk_watch, sandbox_env
from sono.backends.microvm_limits import (
    AGENT_GID,
    AGENT_UID,
    disk_mib,
    memory_mib,
    plan_limits,
    vcpus,
)
from sono.backends.microvm_volumes import home_volume
from sono.errors import SoError
from sono.home import home_dir, write_json_atomic
from sono.images import Images, RunnerSpec
from sono.kvm import RuntimeFinder, Support, boot_support, find_runtime
from sono.layout import GATEWAY_PORT, GATEWAY_SOCK, INSIDE_DIR, PROXY_PORT, PROXY_SOCK, socket_path
from sono.limits.model import Enforcement, Limits
from sono.limits.watch import Guard

if TYPE_CHECKING:
    from microsandbox import MountConfig

GUEST_HOME = "/home/agent"
SEED_DIR = ".so"  # per-sandbox files of the seed (the prompt): mounted, never shared
FORWARD_READY = "/run/so-forward.ready"
SOCKET_PATH_MAX = 107  # sun_path: msb connects to the host sockets by path
STATE_FILE = "microvm.json"
Progress = Callable[[str], None]
FIX = (
    "use -s docker or -s bwrap here; a microVM needs Linux with VT-x/AMD-V (kvm_intel or "
    "kvm_amd) or macOS on Apple Silicon"
)

# Inside the guest, as root: 127.0.0.1:TCP → vsock (host CID 2, PORT), where microsandbox
# connects each stream to a host Unix socket (a VsockRoute). Stdlib only; the runner image
# has python3.
VSOCK_FORWARDER = r"""
import os, socket, sys, threading
def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve(c, port):
    u = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    try:
        u.connect((2, port))
    except OSError as e:
        print("forward: vsock %d: %s" % (port, e), file=sys.stderr, flush=True)
        c.close(); u.close(); return
    t = threading.Thread(target=pump, args=(c, u), daemon=True)
    t.start(); pump(u, c); t.join(); c.close(); u.close()
def listen(tcp, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", tcp)); s.listen(128)
    def loop():
        while True:
            c, _ = s.accept()
            threading.Thread(target=serve, args=(c, port), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()
for m in sys.argv[2:]:
    tcp, _, port = m.partition("=")
    listen(int(tcp), int(port))
open(sys.argv[1] + ".tmp", "w").close(); os.replace(sys.argv[1] + ".tmp", sys.argv[1])
threading.Event().wait()
"""


def vm_name(sandbox_id: str) -> str:
    return f"so-{sandbox_id}"


def seed_home(seed: Path, home: Path) -> None:
    """Copy the credential seed into the agent's home (host side: the home is a shared
    directory); the per-sandbox ``.so/`` stays where it is, mounted on its own."""
    for src in sorted(seed.rglob("*")):
        rel = src.relative_to(seed)
        if rel.parts[0] == SEED_DIR or src.is_symlink():
            continue
        dest = home / rel
        if src.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)


# ---------------------------------------------------------------- image


def export_argv(ref: str, archive: Path) -> list[str]:
    """``docker save``: the image as a tar that microsandbox's ``Image.load`` reads (Docker
    archive layout, which Docker 25+ also writes as an OCI image layout)."""
    return ["docker", "save", "--output", str(archive), ref]


def ensure_vm_image(
    api: MicrosandboxApi,
    ref: str,
    cache: Path,
    progress: Progress,
    *,
    run: Callable[[Sequence[str]], object] = proc.run,
) -> str:
    """The Docker image ``ref`` in microsandbox's image cache (loaded once per content
    hash: runner tags are content hashes); returns the reference to boot from."""
    if api.image_exists(ref):
        return ref
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / (ref.replace("/", "_").replace(":", "_") + ".tar")
    progress(f"exporting {ref} from Docker for the microVM (docker save)")
    try:
        run(export_argv(ref, archive))
        progress(f"loading {ref} into microsandbox (no registry)")
        api.load_image(archive, ref)
    finally:
        archive.unlink(missing_ok=True)
    return ref


# ---------------------------------------------------------------- the VM's configuration


@dataclass(frozen=True)
class VmLayout:
    """Host paths the VM is built from, besides the spec."""

    image: str
    home: Path  # the agent's home on the host (the project's volume)


def create_kwargs(spec: SandboxSpec, layout: VmLayout) -> dict[str, Any]:
    """``Sandbox.create`` keyword arguments for ``spec``; pure, unit-tested."""
    from microsandbox import (
        Image,
        Network,
        NetworkProfile,
        Patch,
        PatchConfig,
        PullPolicy,
        RootDisk,
        Volume,
        VsockRoute,
    )

    def bind(src: Path, *, readonly: bool = False) -> MountConfig:
        return Volume.bind(str(src), readonly=readonly, uid=AGENT_UID, gid=AGENT_GID)

    volumes: dict[str, MountConfig] = {
        spec.mount_point: bind(spec.workspace),
        GUEST_HOME: bind(layout.home),
        f"{GUEST_HOME}/{SEED_DIR}": bind(spec.home_seed / SEED_DIR, readonly=True),
    }
    patches: list[PatchConfig] = []
    for m in spec.mounts:
        if not m.src.is_file():
            volumes[m.dest] = bind(m.src, readonly=not m.writable)
        elif m.writable:
            raise SoError(
                f"{m.src}: a microVM shares directories, not single files, read-write; "
                "list its directory in files.rw instead"
            )
        else:  # a lone script (an agent command, files.ro): copied in read-only at boot
            mode = m.src.stat().st_mode & 0o555
            patches.append(Patch.copy_file(str(m.src), m.dest, mode=mode, replace=True))
    vsock: list[VsockRoute] = []
    if spec.net is not None:
        volumes[INSIDE_DIR] = bind(spec.net.socket_dir, readonly=True)  # the session CA
        vsock += [
            VsockRoute.stream(str(socket_path(spec.net.socket_dir, GATEWAY_SOCK)), GATEWAY_PORT),
            VsockRoute.stream(str(socket_path(spec.net.socket_dir, PROXY_SOCK)), PROXY_PORT),
        ]
        network = Network.none()  # no interface out: the proxy is the only way
    else:  # made before the network policy: the public internet, as the host's network
        network = Network.from_profiles(NetworkProfile.PUBLIC)
    size = disk_mib(spec.limits)
    kwargs: dict[str, Any] = {
        "image": Image.oci(layout.image, root_disk=RootDisk.managed(size) if size else None),
        "pull_policy": PullPolicy.NEVER,  # loaded from Docker; never a registry
        "memory": memory_mib(spec.limits),
        "cpus": vcpus(spec.limits),
        "workdir": spec.mount_point,
        "hostname": f"so-{spec.id}",
        "user": f"{AGENT_UID}:{AGENT_GID}",
        "labels": {"so.sandbox": spec.id},
        "volumes": volumes,
        "network": network,
        "vsock": vsock,
        "replace": True,  # a leftover VM of this name can only be this sandbox's
        "detached": True,  # outlives this so process, like the Docker container
    }
    if patches:
        kwargs["patches"] = patches
    return kwargs


def config_key(kwargs: Mapping[str, Any]) -> str:
    """Changes of any of these need a new VM (image, mounts, network, limits, the files
    copied in at boot)."""
    shown = dict(kwargs)
    shown["secrets"] = []  # keeps the keys of VMs made before as they were
    shown["copied"] = [_stamp(Path(p.src)) for p in kwargs.get("patches", ()) if p.src]
    return hashlib.sha256(repr(sorted(shown.items())).encode()).hexdigest()[:16]


def exec_env(spec: SandboxSpec, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a process in the VM: so's proxy is its way out."""
    return sandbox_env(spec, env, proxied=spec.net is not None, home=GUEST_HOME, user="agent")


def shell_argv(
    msb: str, spec: SandboxSpec, env: Mapping[str, str], argv: Sequence[str], *, tty: bool
) -> list[str]:
    """``msb exec`` attached to the user's terminal, as the agent user in the workspace."""
    env_args = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
    command = list(argv) or ["bash", "--norc", "-i"]
    return [
        msb,
        "exec",
        "--tty" if tty else "--no-tty",
        "--user",
        f"{AGENT_UID}:{AGENT_GID}",
        "--workdir",
        spec.mount_point,
        *env_args,
        vm_name(spec.id),
        "--",
        *command,
    ]


# ---------------------------------------------------------------- the SDK seam


@dataclass(frozen=True)
class Captured:
    code: int
    stdout: str
    stderr: str


class MicrosandboxApi(Protocol):
    """Exactly the microsandbox calls this backend makes (synchronous; see :class:`SdkApi`)."""

    def cli(self) -> str:
        """The ``msb`` the SDK resolved (for ``so shell``)."""

    def image_exists(self, ref: str) -> bool:
        """``Image.get(ref)`` finds it in the local cache."""

    def load_image(self, archive: Path, tag: str) -> None:
        """``Image.load(archive, tag=tag)``."""

    def status(self, name: str) -> str | None:
        """``Sandbox.get(name).status`` (``None``: no such VM)."""

    def create(self, name: str, kwargs: Mapping[str, Any]) -> None:
        """``Sandbox.create(name, **kwargs)``, booted and detached."""

    def start(self, name: str) -> None:
        """``Sandbox.get(name).connect_or_start(detached=True)``."""

    def spawn(self, name: str, argv: Sequence[str], *, user: str) -> None:
        """``exec_detached``: a background process in the guest."""

    def run(
        self,
        name: str,
        argv: Sequence[str],
        *,
        user: str,
        cwd: str,
        env: Mapping[str, str],
        timeout: float | None = None,
    ) -> Captured:
        """``exec``: run to completion, capturing output."""

    def stream(
        self,
        name: str,
        argv: Sequence[str],
        *,
        user: str,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        nproc: int | None,
        on_line: Callable[[str], None],
        should_stop: Callable[[], bool],
    ) -> int | None:
        """``exec_stream``: merged output lines to ``on_line``; killed (``None``) as soon as
        ``should_stop()`` says so."""

    def remove(self, name: str) -> None:
        """``Sandbox.remove(name)`` (stopped first)."""


class SdkApi:
    """:class:`MicrosandboxApi` on the real SDK (async underneath, one event loop)."""

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None
        self._lock = threading.Lock()
        self._live: dict[str, Any] = {}

    def _run(self, coro: Any) -> Any:
        with self._lock:
            if self._runner is None:
                self._runner = asyncio.Runner()
            runner = self._runner
        return runner.run(coro)

    async def _sandbox(self, name: str) -> Any:
        from microsandbox import Sandbox

        live = self._live.get(name)
        if live is None:
            live = await (await Sandbox.get(name)).connect_or_start(detached=True)
            self._live[name] = live
        return live

    def cli(self) -> str:
        from microsandbox._microsandbox import resolved_cli_msb_path

        return resolved_cli_msb_path()

    def image_exists(self, ref: str) -> bool:
        from microsandbox import Image, MicrosandboxError

        async def get() -> bool:
            try:
                await Image.get(ref)
            except MicrosandboxError:
                return False
            return True

        return bool(self._run(get()))

    def load_image(self, archive: Path, tag: str) -> None:
        from microsandbox import Image

        async def load() -> None:  # SDK futures need the running loop to be made in
            await Image.load(str(archive), tag=tag)

        self._run(load())

    def status(self, name: str) -> str | None:
        from microsandbox import Sandbox, SandboxNotFoundError

        async def get() -> str | None:
            try:
                return str((await Sandbox.get(name)).status)
            except SandboxNotFoundError:
                return None

        result: str | None = self._run(get())
        return result

    def create(self, name: str, kwargs: Mapping[str, Any]) -> None:
        from microsandbox import Sandbox

        async def create() -> None:
            self._live[name] = await Sandbox.create(name, **kwargs)

        self._live.pop(name, None)
        self._run(create())

    def start(self, name: str) -> None:
        self._live.pop(name, None)
        self._run(self._sandbox(name))

    def spawn(self, name: str, argv: Sequence[str], *, user: str) -> None:
        async def spawn() -> None:
            sandbox = await self._sandbox(name)
            await sandbox.exec_detached(argv[0], list(argv[1:]), user=user)

        self._run(spawn())

    def run(
        self,
        name: str,
        argv: Sequence[str],
        *,
        user: str,
        cwd: str,
        env: Mapping[str, str],
        timeout: float | None = None,
    ) -> Captured:
        async def run() -> Captured:
            sandbox = await self._sandbox(name)
            out = await sandbox.exec(
                argv[0], list(argv[1:]), cwd=cwd, user=user, env=dict(env), timeout=timeout
            )
            return Captured(out.exit_code, out.stdout_text, out.stderr_text)

        result: Captured = self._run(run())
        return result

    def stream(
        self,
        name: str,
        argv: Sequence[str],
        *,
        user: str,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        nproc: int | None,
        on_line: Callable[[str], None],
        should_stop: Callable[[], bool],
    ) -> int | None:
        from microsandbox import ExecEventType, Rlimit

        async def stream() -> int | None:
            sandbox = await self._sandbox(name)
            handle = await sandbox.exec_stream(
                argv[0],
                list(argv[1:]),
                cwd=cwd,
                user=user,
                env=dict(env),
                stdin=stdin,
                rlimits=[Rlimit.nproc(nproc)] if nproc is not None else None,
            )
            code: list[int | None] = [None]
            buffers: dict[str, bytes] = {}

            async def read() -> None:
                async for event in handle:
                    if event.event_type in (ExecEventType.STDOUT, ExecEventType.STDERR):
                        key = str(event.event_type)
                        buffers[key] = buffers.get(key, b"") + (event.data or b"")
                        *lines, buffers[key] = buffers[key].split(b"\n")
                        for line in lines:
                            on_line(line.decode(errors="replace"))
                    elif event.event_type in (ExecEventType.EXITED, ExecEventType.FAILED):
                        code[0] = event.code
                        break

            reader = asyncio.ensure_future(read())
            try:
                while not reader.done():
                    if should_stop():
                        await handle.kill()
                        break
                    await asyncio.wait({reader}, timeout=0.05)
            except asyncio.CancelledError:  # Ctrl-C: the agent dies with the run
                with contextlib.suppress(Exception):
                    await handle.kill()
                raise
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(reader, timeout=10)
            for rest in buffers.values():
                if rest:
                    on_line(rest.decode(errors="replace"))
            return code[0] if reader.done() and not reader.cancelled() else None

        result: int | None = self._run(stream())
        return result

    def remove(self, name: str) -> None:
        from microsandbox import Sandbox, SandboxNotFoundError

        async def remove() -> None:
            try:
                handle = await Sandbox.get(name)
            except SandboxNotFoundError:
                return
            with contextlib.suppress(Exception):
                await handle.kill(timeout=10)
            await Sandbox.remove(name)

        self._live.pop(name, None)
        self._run(remove())


# ---------------------------------------------------------------- the backend


class MicrovmBackend:
    name: ClassVar[str] = "microvm"

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> MicrovmBackend:
        return cls(base=settings.docker_base, progress=settings.progress)

    def __init__(
        self,
        *,
        api: MicrosandboxApi | None = None,
        support: Callable[[], Support] | None = None,
        base: str | None = None,
        so_home: Path | None = None,
        progress: Progress | None = None,
        image: Callable[[SandboxSpec], str] | None = None,
        runtime: RuntimeFinder = find_runtime,
    ) -> None:
        self._api = api
        self._support_fn = support or (lambda: boot_support(runtime=runtime))
        self._support: Support | None = None
        self._base = base
        self._so_home = so_home
        self._progress = progress or (lambda line: None)
        self._image_fn = image
        self._live: dict[str, str] = {}  # sandbox id → config key of the VM running it

    # ------------------------------------------------------------ host and runtime

    def support(self) -> Support:
        if self._support is None:
            self._support = self._support_fn()
        return self._support

    def _require(self) -> MicrosandboxApi:
        """The SDK, once this host is known to boot microVMs; the reason otherwise."""
        support = self.support()
        if not support.ok:
            raise SoError(f"cannot boot a microVM here: {support.reason}; {FIX}")
        if self._api is None:
            self._api = SdkApi()
        return self._api

    def health(self) -> Health:
        support = self.support()
        if not support.ok:
            return Health(False, f"cannot boot a microVM here: {support.reason}", FIX)
        try:
            connect()
        except SoError as exc:
            return Health(
                False,
                f"a microVM can boot ({support.reason}), but its image is built with Docker: {exc}",
                "start the Docker engine (the runner image is exported from it)",
            )
        return Health(True, f"microVMs boot here: {support.reason}")

    def _home(self) -> Path:
        if self._so_home is None:
            self._so_home = Path(home_dir())
        return self._so_home

    def image_for(self, spec: SandboxSpec) -> str:
        if self._image_fn is not None:
            return self._image_fn(spec)
        images = Images(connect())
        base = self._base or images.default_base()
        # uid 1000 in the guest whoever runs so: the image is the VM's, not the host's.
        runner = RunnerSpec(base=base, uid=AGENT_UID, gid=AGENT_GID, project=spec.project)
        ref = images.ensure(runner, self._progress)
        cache = self._home() / "microvm" / "images"
        return ensure_vm_image(self._require(), str(ref), cache, self._progress)

    # ------------------------------------------------------------ the VM

    def agent_home(self, spec: SandboxSpec) -> Path:
        """The project's persistent volume; a sandbox without a project gets its own."""
        if spec.project is None:
            path = spec.writable_dir / "vm-home"
            path.mkdir(parents=True, exist_ok=True)
            return path
        return home_volume(self._home(), spec.project).path

    def _kwargs(self, spec: SandboxSpec) -> dict[str, Any]:
        home = self.agent_home(spec)
        (home / SEED_DIR).mkdir(parents=True, exist_ok=True)  # the mount point of .so/
        (spec.home_seed / SEED_DIR).mkdir(parents=True, exist_ok=True)
        layout = VmLayout(self.image_for(spec), home)
        if spec.net is not None:
            for sock in (GATEWAY_SOCK, PROXY_SOCK):
                path = socket_path(spec.net.socket_dir, sock)
                if len(str(path)) > SOCKET_PATH_MAX:
                    raise SoError(
                        f"the sandbox's socket path {path} is longer than a Unix socket "
                        "path may be; set SO_HOME to a shorter directory"
                    )
        return create_kwargs(spec, layout)

    def create(self, *, spec: SandboxSpec) -> None:
        self._require()
        spec.home_seed.mkdir(parents=True, exist_ok=True)
        (spec.home_seed / SEED_DIR).mkdir(exist_ok=True)
        self._vm(spec, fresh=True)

    def _vm(self, spec: SandboxSpec, *, fresh: bool = False) -> MicrosandboxApi:
        """The running VM for ``spec``: booted, started again when it stopped, or made
        anew from the workspace when it vanished or its configuration changed."""
        api = self._require()
        name = vm_name(spec.id)
        if not fresh and spec.id in self._live:
            return api
        kwargs = self._kwargs(spec)
        key = config_key(kwargs)
        state = spec.writable_dir / STATE_FILE
        status = api.status(name)
        if fresh or status is None or _read_key(state) != key:
            if status is not None:
                api.remove(name)
            api.create(name, kwargs)
            _write_key(state, key)
            self._start_forwarder(api, spec)
        elif status != "running":
            api.start(name)
            self._start_forwarder(api, spec)
        self._live[spec.id] = key
        return api

    def _start_forwarder(self, api: MicrosandboxApi, spec: SandboxSpec) -> None:
        """127.0.0.1:3128 and :3129 → vsock → the host's sockets."""
        if spec.net is None:
            return
        ports = [PROXY_PORT, GATEWAY_PORT]
        name = vm_name(spec.id)
        as_root(api, name, ["rm", "-f", FORWARD_READY])
        mappings = [f"{p}={p}" for p in ports]
        api.spawn(name, ["python3", "-c", VSOCK_FORWARDER, FORWARD_READY, *mappings], user="0:0")
        for _ in range(300):
            if as_root(api, name, ["test", "-e", FORWARD_READY]).code == 0:
                return
            time.sleep(0.02)
        raise SoError(f"the network forwarder did not start in microVM {name}")

    # ------------------------------------------------------------ exec

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
        api = self._vm(spec)
        seed_home(spec.home_seed, self.agent_home(spec))  # fresh credentials every run
        with self._guard(spec) as guard:
            stopper = Stopper(timeout, guard, stop)
            try:
                code = api.stream(
                    vm_name(spec.id),
                    argv,
                    user=f"{AGENT_UID}:{AGENT_GID}",
                    cwd=spec.mount_point,
                    env=exec_env(spec, env),
                    stdin=stdin_text.encode() if stdin_text is not None else None,
                    nproc=spec.limits.pids if spec.limits is not None else None,
                    on_line=on_line,
                    should_stop=stopper.should_stop,
                )
            except KeyboardInterrupt:
                self._kill_agent(api, spec)
                raise
            if stopper.stopped:
                self._kill_agent(api, spec)
            stopper.settle()
        return stopper.result(code)

    @contextlib.contextmanager
    def _guard(self, spec: SandboxSpec) -> Iterator[Guard | None]:
        """The VM itself bounds memory and CPUs; this watches the workspace's disk use."""
        with disk_watch(spec) as disk:
            yield Guard(disk=disk) if disk is not None else None

    def _kill_agent(self, api: MicrosandboxApi, spec: SandboxSpec) -> None:
        """Every process of the agent user dies: the whole tree, whatever it forked."""
        with contextlib.suppress(Exception):
            as_root(api, vm_name(spec.id), ["pkill", "-KILL", "-u", str(AGENT_UID)])

    def run(
        self,
        *,
        spec: SandboxSpec,
        argv: Sequence[str],
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> proc.Completed:
        api = self._vm(spec)
        out = api.run(
            vm_name(spec.id),
            argv,
            user=f"{AGENT_UID}:{AGENT_GID}",
            cwd=spec.mount_point,
            env=exec_env(spec, env or {}),
        )
        done = proc.Completed(tuple(argv), out.code, out.stdout, out.stderr)
        if check and done.returncode != 0:
            raise proc.CommandError(done)
        return done

    def shell(self, *, spec: SandboxSpec, argv: Sequence[str] = ()) -> int:
        api = self._vm(spec)
        seed_home(spec.home_seed, self.agent_home(spec))
        tty = os.isatty(0) and os.isatty(1)
        env = exec_env(
            spec, {"TERM": os.environ.get("TERM", "xterm"), "PS1": f"(so:{spec.id}) \\w\\$ "}
        )
        return proc.interactive(shell_argv(api.cli(), spec, env, argv, tty=tty))

    def destroy(self, *, spec: SandboxSpec) -> None:
        """Stop and remove the VM. Where none can boot, none of ours can be running:
        nothing to release (so ``so rm`` still works there)."""
        if not self.support().ok:
            return
        api = self._require()
        api.remove(vm_name(spec.id))
        self._live.pop(spec.id, None)
        (spec.writable_dir / STATE_FILE).unlink(missing_ok=True)

    # ------------------------------------------------------------ policy answers

    def plan_limits(self, limits: Limits) -> dict[str, Enforcement]:
        return plan_limits(limits)

    def refresh(self, *, spec: SandboxSpec) -> None:
        """Nothing to do: the workspace is always a copy, shared live over virtiofs."""

    def overlay_owner(self) -> tuple[int, int] | None:
        return None

    def overlay_obstacle(self, project: Path, home: Path) -> str | None:
        return (
            "a microVM sees host directories over virtiofs and cannot mount so's overlay "
            "(project + upper layer) in its guest kernel"
        )


def as_root(api: MicrosandboxApi, name: str, argv: Sequence[str]) -> Captured:
    """so's own plumbing in the guest (the forwarder, killing the agent): root, not the agent."""
    return api.run(name, argv, user="0:0", cwd="/", env={"PATH": PATH})


def _stamp(path: Path) -> tuple[str, int, int]:
    """A copied-in file changes → a new VM (it is copied at boot only)."""
    try:
        st = path.stat()
    except OSError:
        return (str(path), 0, 0)
    return (str(path), st.st_size, st.st_mtime_ns)


def _read_key(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return str(data.get("key")) if isinstance(data, dict) else None


def _write_key(path: Path, key: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"key": key})
