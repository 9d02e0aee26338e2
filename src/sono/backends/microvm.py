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
exposes them on 127.0.0.1:3128/3129. When the backend is given the network policy and the
secrets (:class:`MicrovmNet`), the policy is instead mapped onto microsandbox's own
(:func:`native_network`), secrets become microsandbox secret placeholders substituted
host-side per allowed host (:func:`native_secrets`), and only the model gateway goes
through vsock. docs/microvm.md has the matrix.

All SDK calls go through :class:`MicrosandboxApi` (the real one is :class:`SdkApi`), so the
mapping is unit-tested against a fake where no VM can boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sono import proc
from sono.backends.base import Health, SandboxSpec
from sono.errors import SoError
from sono.kvm import RuntimeFinder, Support, boot_support, find_runtime
from sono.limits import DiskWatch, Enforcement, Guard, Limits, _disk, _value
from sono.net.policy import METADATA_HOSTS, NetworkPolicy, parse_entry
from sono.net.session import (
    GATEWAY_PORT,
    GATEWAY_SOCK,
    INSIDE_DIR,
    PROXY_PORT,
    PROXY_SOCK,
    socket_path,
)
from sono.net.session import proxy_env as _proxy_env

if TYPE_CHECKING:
    from microsandbox import MountConfig, Network, SecretEntry

    from sono.net.secrets import BoundSecret, Secret

AGENT_UID = AGENT_GID = 1000
GUEST_HOME = "/home/agent"
SEED_DIR = ".so"  # per-sandbox files of the seed (the prompt): mounted, never shared
FORWARD_READY = "/run/so-forward.ready"
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
DEFAULT_MEMORY_MIB = 4096  # without limits: enough for node-based agent CLIs
DEFAULT_CPUS = 2
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


# ---------------------------------------------------------------- per-project home volumes


@dataclass(frozen=True)
class HomeVolume:
    """The agent's home for one project, kept across sandboxes (``so volume``)."""

    id: str
    path: Path
    project: str

    def size_bytes(self) -> int:
        from sono.limits import tree_size

        return tree_size(self.path)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "project": self.project,
            "path": str(self.path),
            "size_bytes": self.size_bytes(),
        }


def volumes_root(so_home: Path) -> Path:
    return so_home / "volumes"


def volume_id(project: Path) -> str:
    from sono.sandbox import slug

    digest = hashlib.sha256(str(project).encode()).hexdigest()[:12]
    return f"{slug(project.name)}-{digest}"


def home_volume(so_home: Path, project: Path) -> HomeVolume:
    """The project's volume, made on first use; its metadata sits next to it (the agent
    can write the volume, never the record of whose it is)."""
    vid = volume_id(project)
    root = volumes_root(so_home)
    path = root / vid
    path.mkdir(parents=True, exist_ok=True)
    meta = root / f"{vid}.json"
    if not meta.is_file():
        from sono.state import write_json_atomic

        write_json_atomic(meta, {"id": vid, "project": str(project)})
    return HomeVolume(vid, path, str(project))


def list_volumes(so_home: Path) -> list[HomeVolume]:
    root = volumes_root(so_home)
    found = []
    for path in sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []:
        project = ""
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((root / f"{path.name}.json").read_text())
            project = str(data.get("project", "")) if isinstance(data, dict) else ""
        found.append(HomeVolume(path.name, path, project))
    return found


def find_volume(so_home: Path, name: str) -> HomeVolume:
    """A volume by id or unique id prefix."""
    volumes = list_volumes(so_home)
    exact = [v for v in volumes if v.id == name]
    matches = exact or [v for v in volumes if v.id.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise SoError(f"no volume {name!r}; see `so volume list`")
    names = ", ".join(v.id for v in matches)
    raise SoError(f"volume {name!r} is ambiguous ({names}); give more of its id")


def empty_dir(path: Path) -> None:
    """Remove everything inside ``path``, keeping ``path`` itself."""
    from sono.overlay import remove_tree

    for child in path.iterdir() if path.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            remove_tree(child)
        else:
            child.unlink()


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


# ---------------------------------------------------------------- limits


def vcpus(limits: Limits | None) -> int:
    if limits is None or limits.cpus is None:
        return DEFAULT_CPUS
    return max(1, math.floor(limits.cpus))


def memory_mib(limits: Limits | None) -> int:
    if limits is None or limits.memory is None:
        return DEFAULT_MEMORY_MIB
    return max(1, limits.memory // (1 << 20))


def disk_mib(limits: Limits | None) -> int | None:
    if limits is None or limits.disk is None:
        return None
    return max(1, limits.disk // (1 << 20))


def plan_microvm(limits: Limits) -> dict[str, Enforcement]:
    """How each set limit is enforced for a microVM sandbox (see :func:`create_kwargs`)."""
    plan: dict[str, Enforcement] = {}
    if limits.memory is not None:
        plan["memory"] = Enforcement(
            "memory",
            "microvm",
            f"the VM has {memory_mib(limits)} MiB of RAM (memory=) and no swap; the guest "
            "kernel OOM-kills inside it, the host never sees more",
            _value("memory", limits),
        )
    if limits.cpus is not None:
        if limits.cpus < 1:
            plan["cpus"] = Enforcement(
                "cpus",
                "none",
                f"a VM has whole vCPUs: {limits.cpus:g} CPU cannot be expressed (1 is the least)",
                _value("cpus", limits),
            )
        else:
            n = vcpus(limits)
            rounded = "" if n == limits.cpus else f"; {limits.cpus:g} rounded down to whole vCPUs"
            plan["cpus"] = Enforcement(
                "cpus", "microvm", f"{n} vCPU(s) (cpus=){rounded}", _value("cpus", limits)
            )
    if limits.pids is not None:
        plan["pids"] = Enforcement(
            "pids",
            "rlimit",
            f"RLIMIT_NPROC={limits.pids} on every exec as uid {AGENT_UID}; the guest kernel "
            "counts that user's processes, and only the agent runs as it in the VM",
            _value("pids", limits),
        )
    if limits.disk is not None:
        base = _disk(limits, fsize=False)
        plan["disk"] = Enforcement(
            "disk",
            base.mechanism,
            f"{base.detail}; the VM's own root disk holds {disk_mib(limits)} MiB",
            base.value,
        )
    return plan


# ---------------------------------------------------------------- network and secrets


@dataclass(frozen=True)
class MicrovmNet:
    """The network policy and secrets to hand to microsandbox itself (native mode)."""

    policy: NetworkPolicy
    secrets: tuple[Secret, ...] = ()


def native_network(policy: NetworkPolicy) -> Network:
    """Our policy as microsandbox's (first matching rule wins, egress denied by default):

    deny entries → deny rules (names, ``.suffix`` as the domain and its subdomains, CIDRs);
    IP/CIDR allow entries → allow rules (the only way to reach private ranges, as in
    ours); private, loopback, link-local, metadata and multicast → denied; then
    ``allowlist``: each name or suffix allowed, ``open``: the public internet. DNS goes
    to microsandbox's resolver, whose rebind protection drops private answers for names
    (ours: a name never unlocks a private address). Ingress is closed.
    """
    from microsandbox import (
        Action,
        DestGroup,
        Destination,
        Network,
        NetworkDestination,
        Rule,
    )
    from microsandbox import NetworkPolicy as SdkPolicy

    if policy.mode == "none":
        return Network(policy=SdkPolicy.none())

    def destinations(text: str) -> list[NetworkDestination]:
        entry = parse_entry(text)
        if entry.kind == "network":
            return [Destination.cidr(entry.value)]
        if entry.kind == "suffix":
            return [Destination.domain(entry.value), Destination.domain_suffix(f".{entry.value}")]
        return [Destination.domain(entry.value)]

    rules: list[Rule] = [*Rule.allow_dns()]
    rules += [Rule.deny(destination=d) for text in policy.deny for d in destinations(text)]
    listed = {parse_entry(t).value for t in policy.allow}
    rules += [Rule.deny(destination=Destination.domain(h)) for h in sorted(METADATA_HOSTS - listed)]
    rules += [
        Rule.allow(destination=d)
        for text in policy.allow
        if parse_entry(text).kind == "network"
        for d in destinations(text)
    ]
    rules += [
        Rule.deny(destination=Destination.group(g))
        for g in (
            DestGroup.PRIVATE,
            DestGroup.LOOPBACK,
            DestGroup.LINK_LOCAL,
            DestGroup.METADATA,
            DestGroup.MULTICAST,
        )
    ]
    if policy.mode == "open":
        rules.append(Rule.allow(destination=Destination.group(DestGroup.PUBLIC)))
    else:
        rules += [
            Rule.allow(destination=d)
            for text in policy.allow
            if parse_entry(text).kind != "network"
            for d in destinations(text)
        ]
    return Network(
        policy=SdkPolicy(
            default_egress=Action.DENY, default_ingress=Action.DENY, rules=tuple(rules)
        )
    )


def secret_hosts(hosts: Sequence[str]) -> tuple[list[str], list[str]]:
    """Our secret host entries as microsandbox allowed-host patterns, and the entries it
    cannot express (address ranges: its secrets match the request's host name)."""
    patterns: list[str] = []
    unsupported: list[str] = []
    for text in hosts:
        entry = parse_entry(text)
        if entry.kind == "suffix":
            patterns += [entry.value, f"*.{entry.value}"]
        elif entry.kind == "host":
            patterns.append(entry.value)
        elif entry.network is not None and entry.network.num_addresses == 1:
            patterns.append(str(entry.network.network_address))
        else:
            unsupported.append(entry.text)
    return patterns, unsupported


def native_secrets(bound: Sequence[BoundSecret]) -> list[SecretEntry]:
    """Each secret as a microsandbox placeholder: the guest sees ``NAME=<placeholder>``,
    microsandbox swaps in the value host-side on requests to its hosts only (headers, as
    our proxy does) and blocks it anywhere else."""
    from microsandbox import Secret as SdkSecret
    from microsandbox import ViolationAction

    entries = []
    for b in bound:
        patterns, unsupported = secret_hosts(b.hosts)
        if unsupported:
            raise SoError(
                f"secret {b.name}: microsandbox binds secrets to host names, not to "
                f"{', '.join(unsupported)}; list host names in [secrets.{b.name}] hosts"
            )
        entries.append(
            SdkSecret.env(
                b.name,
                value=b.value,
                allow=patterns,
                placeholder=b.placeholder,
                violation_action=ViolationAction.BLOCK_AND_LOG,
            )
        )
    return entries


# ---------------------------------------------------------------- the VM's configuration


@dataclass(frozen=True)
class VmLayout:
    """Host paths the VM is built from, besides the spec."""

    image: str
    home: Path  # the agent's home on the host (the project's volume)


def create_kwargs(
    spec: SandboxSpec,
    layout: VmLayout,
    *,
    native: Network | None = None,
    secrets: Sequence[SecretEntry] = (),
) -> dict[str, Any]:
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
        vsock.append(
            VsockRoute.stream(str(socket_path(spec.net.socket_dir, GATEWAY_SOCK)), GATEWAY_PORT)
        )
        if native is None:
            vsock.append(
                VsockRoute.stream(str(socket_path(spec.net.socket_dir, PROXY_SOCK)), PROXY_PORT)
            )
            network = Network.none()  # no interface out: the proxy is the only way
        else:
            network = native
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
    if secrets:
        kwargs["secrets"] = list(secrets)
        kwargs["intercept_tls"] = True  # substitution happens inside TLS, host-side
    return kwargs


def config_key(kwargs: Mapping[str, Any], secrets: Sequence[Secret] = ()) -> str:
    """Changes of any of these need a new VM (image, mounts, network, limits, which
    secrets go where); secret values never enter the key (it is written to a file)."""
    shown = {k: v for k, v in kwargs.items() if k not in ("secrets", "intercept_tls")}
    shown["secrets"] = sorted((s.name, tuple(s.hosts)) for s in secrets)
    shown["copied"] = [_stamp(Path(p.src)) for p in kwargs.get("patches", ()) if p.src]
    return hashlib.sha256(repr(sorted(shown.items())).encode()).hexdigest()[:16]


def exec_env(
    spec: SandboxSpec, env: Mapping[str, str], *, native: frozenset[str] | None = None
) -> dict[str, str]:
    """The environment of a process in the VM. ``native``: the names of the secrets
    microsandbox holds (the VM's own placeholders stand; the session's CA files are not
    used) — ``None`` when so's proxy is the way out."""
    proxied = spec.net is not None and native is None
    merged = {
        "HOME": GUEST_HOME,
        "USER": "agent",
        "LOGNAME": "agent",
        "PATH": PATH,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",  # noqa: S108  the guest's /tmp, not the host's
        "SO_SANDBOX_ID": spec.id,
        **spec.env,
        **env,
        **(_proxy_env() if proxied else {}),
    }
    if native is not None:
        merged = {
            k: v
            for k, v in merged.items()
            if k not in native and not v.startswith(f"{INSIDE_DIR}/")
        }
    return merged


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

    def __init__(
        self,
        *,
        api: MicrosandboxApi | None = None,
        support: Callable[[], Support] | None = None,
        base: str | None = None,
        so_home: Path | None = None,
        net: MicrovmNet | None = None,
        progress: Progress | None = None,
        image: Callable[[SandboxSpec], str] | None = None,
        runtime: RuntimeFinder = find_runtime,
    ) -> None:
        self._api = api
        self._support_fn = support or (lambda: boot_support(runtime=runtime))
        self._support: Support | None = None
        self._base = base
        self._so_home = so_home
        self._net = net
        self._progress = progress or (lambda line: None)
        self._image_fn = image
        self._live: dict[str, str] = {}  # sandbox id → config key of the VM running it
        self._native: dict[str, frozenset[str]] = {}  # sandbox id → secrets microsandbox holds

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
            self._docker().client()
        except SoError as exc:
            return Health(
                False,
                f"a microVM can boot ({support.reason}), but its image is built with Docker: {exc}",
                "start the Docker engine (the runner image is exported from it)",
            )
        return Health(True, f"microVMs boot here: {support.reason}")

    def _home(self) -> Path:
        if self._so_home is None:
            from sono.state import so_home

            self._so_home = so_home()
        return self._so_home

    def _docker(self) -> Any:
        from sono.backends.docker import DockerBackend

        return DockerBackend(base=self._base, progress=self._progress)

    def image_for(self, spec: SandboxSpec) -> str:
        if self._image_fn is not None:
            return self._image_fn(spec)
        from sono.images import RunnerSpec

        docker = self._docker()
        images = docker.images()
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

    def _kwargs(self, spec: SandboxSpec) -> tuple[dict[str, Any], frozenset[str] | None]:
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
        if self._net is None or spec.net is None:
            return create_kwargs(spec, layout), None
        kwargs = create_kwargs(spec, layout, native=native_network(self._net.policy))
        return kwargs, frozenset(s.name for s in self._net.secrets)

    def _secret_kwargs(self, spec: SandboxSpec) -> dict[str, Any]:
        """The secrets' values, read from the host only when a VM is made (so a later
        ``so diff`` needs none of them exported)."""
        if self._net is None or spec.net is None or not self._net.secrets:
            return {}
        from sono.net.secrets import resolve

        entries = native_secrets(resolve(self._net.secrets, os.environ))
        return {"secrets": entries, "intercept_tls": True}

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
        kwargs, native = self._kwargs(spec)
        key = config_key(kwargs, self._net.secrets if self._net is not None else ())
        state = spec.writable_dir / STATE_FILE
        status = api.status(name)
        if fresh or status is None or _read_key(state) != key:
            if status is not None:
                api.remove(name)
            api.create(name, {**kwargs, **self._secret_kwargs(spec)})
            _write_key(state, key)
            self._start_forwarder(api, spec, native)
        elif status != "running":
            api.start(name)
            self._start_forwarder(api, spec, native)
        self._live[spec.id] = key
        if native is not None:
            self._native[spec.id] = native
        return api

    def _start_forwarder(
        self, api: MicrosandboxApi, spec: SandboxSpec, native: frozenset[str] | None
    ) -> None:
        """127.0.0.1:3129 (and :3128 without native networking) → vsock → host sockets."""
        if spec.net is None:
            return
        ports = [GATEWAY_PORT] if native is not None else [PROXY_PORT, GATEWAY_PORT]
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

    def _env(self, spec: SandboxSpec, env: Mapping[str, str]) -> dict[str, str]:
        return exec_env(spec, env, native=self._native.get(spec.id))

    def exec(
        self,
        *,
        spec: SandboxSpec,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdin_text: str | None,
        timeout: float | None,
        on_line: Callable[[str], None],
    ) -> proc.Streamed:
        api = self._vm(spec)
        seed_home(spec.home_seed, self.agent_home(spec))  # fresh credentials every run
        start = time.monotonic()
        timed_out = [False]
        killed: list[str | None] = [None]
        with self._guard(spec) as guard:

            def should_stop() -> bool:
                if timeout is not None and time.monotonic() - start >= timeout:
                    timed_out[0] = True
                    return True
                killed[0] = guard.check() if guard is not None else None
                return killed[0] is not None

            try:
                code = api.stream(
                    vm_name(spec.id),
                    argv,
                    user=f"{AGENT_UID}:{AGENT_GID}",
                    cwd=spec.mount_point,
                    env=self._env(spec, env),
                    stdin=stdin_text.encode() if stdin_text is not None else None,
                    nproc=spec.limits.pids if spec.limits is not None else None,
                    on_line=on_line,
                    should_stop=should_stop,
                )
            except KeyboardInterrupt:
                self._kill_agent(api, spec)
                raise
            if timed_out[0] or killed[0]:
                self._kill_agent(api, spec)
            elif guard is not None:
                killed[0] = guard.check()
        return proc.Streamed(
            returncode=None if timed_out[0] else code,
            timed_out=timed_out[0],
            interrupted=False,
            duration_s=time.monotonic() - start,
            killed=killed[0],
        )

    @contextlib.contextmanager
    def _guard(self, spec: SandboxSpec) -> Iterator[Guard | None]:
        """The VM itself bounds memory and CPUs; this watches the workspace's disk use."""
        limits = spec.limits
        if limits is None or limits.disk is None:
            yield None
            return
        disk = DiskWatch(spec.writable_dir, limits.disk, lambda size: None, interval=0.5)
        disk.start()
        try:
            yield Guard(disk=disk)
        finally:
            disk.stop()

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
            env=self._env(spec, env or {}),
        )
        done = proc.Completed(tuple(argv), out.code, out.stdout, out.stderr)
        if check and done.returncode != 0:
            raise proc.CommandError(done)
        return done

    def shell(self, *, spec: SandboxSpec, argv: Sequence[str] = ()) -> int:
        api = self._vm(spec)
        seed_home(spec.home_seed, self.agent_home(spec))
        tty = os.isatty(0) and os.isatty(1)
        env = self._env(
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
        return plan_microvm(limits)

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
    from sono.state import write_json_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"key": key})
