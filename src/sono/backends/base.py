"""The Backend contract: what every sandbox implementation provides.

Core code talks only to this protocol; it never branches on a backend's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from sono.proc import Completed, Streamed

if TYPE_CHECKING:
    from sono.limits import Enforcement, Limits
    from sono.overlay import Overlay


@dataclass(frozen=True)
class Mount:
    """A host path made visible inside the sandbox."""

    src: Path
    dest: str
    writable: bool = False


@dataclass(frozen=True)
class NetSpec:
    """The sandbox's only way out: host-side servers on Unix sockets in ``socket_dir``,
    bound at ``/run/so/net``, exposed on loopback inside by the ``forwarder`` script."""

    socket_dir: Path
    forwarder: Path


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to build one sandbox; pure data."""

    id: str
    workspace: Path  # host directory holding the sandbox's own copy of the project
    home_seed: Path  # host directory copied into the sandbox's fresh HOME on every exec
    mount_point: str = "/workspace"  # where the workspace appears inside
    mounts: tuple[Mount, ...] = ()  # extra read-only mounts: agent CLIs, git alternates
    home: str = "/home/agent"
    user: str = "agent"
    uid: int = 1000
    gid: int = 1000
    env: Mapping[str, str] = field(default_factory=dict)
    project: Path | None = None  # the host project (trusted files like .so/Dockerfile)
    overlay: Overlay | None = None  # copy-on-write workspace; ``workspace`` is unused then
    net: NetSpec | None = None  # None: the host's network (sandboxes made before the policy)
    limits: Limits | None = None  # enforced on agent runs and shells (not so's own git)
    # bwrap with a disk limit: host dirs under ``writable_dir`` standing in for /tmp, /home
    # and /dev/shm, so the one disk watch counts every writable place (None: sized tmpfs).
    scratch: Path | None = None

    @property
    def writable_dir(self) -> Path:
        """Everything the sandbox makes the host store (for the disk limit): its upper
        layer or copy, its git objects, its iteration logs — the sandbox's state dir."""
        return self.home_seed.parent

    @property
    def agent_writable(self) -> tuple[Path, ...]:
        """The host paths the agent writes through: its upper layer and git dir (or its
        copy) and the writable extra mounts (``files.rw``) — never the overlay's lower
        layer, whose files are the project's own (hard links)."""
        own = (self.overlay.upper, self.overlay.gitdir) if self.overlay else (self.workspace,)
        scratch = (self.scratch,) if self.scratch is not None else ()
        return (*own, *scratch, *(m.src for m in self.mounts if m.writable))


@dataclass(frozen=True)
class BackendSettings:
    """What the user configured for backends, handed to each one's ``from_settings``."""

    bwrap: str | None = None  # a system bwrap instead of the bundled one
    docker_base: str | None = None  # base image of the Docker runner image
    progress: Callable[[str], None] = field(default=lambda line: None)


@dataclass(frozen=True)
class Health:
    ok: bool
    detail: str
    fix: str = ""


class Backend(Protocol):
    name: ClassVar[str]

    def create(self, *, spec: SandboxSpec) -> None:
        """Prepare the sandbox (the workspace already exists)."""

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
    ) -> Streamed:
        """Run ``argv`` inside the sandbox, streaming merged output lines. ``stop`` is
        polled like the limits' guard: a reason ends the run (the result's ``killed``)."""

    def run(
        self,
        *,
        spec: SandboxSpec,
        argv: Sequence[str],
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> Completed:
        """Run a short command inside the sandbox and capture its output."""

    def shell(self, *, spec: SandboxSpec, argv: Sequence[str] = ()) -> int:
        """Attach the user's terminal to a shell (or ``argv``) inside the sandbox."""

    def destroy(self, *, spec: SandboxSpec) -> None:
        """Release whatever the backend holds for this sandbox."""

    def overlay_obstacle(self, project: Path, home: Path) -> str | None:
        """Why a copy-on-write workspace over ``project`` cannot work on this backend here
        (``None`` when it can); ``home`` is where upper layers live."""

    def plan_limits(self, limits: Limits) -> dict[str, Enforcement]:
        """How each set limit would be enforced here (``mechanism == "none"``: it cannot)."""

    def refresh(self, *, spec: SandboxSpec) -> None:
        """Show host-side changes under an overlay consistently before so repairs them
        (a long-lived mount may cache what the host has since changed)."""

    def overlay_owner(self) -> tuple[int, int] | None:
        """uid/gid that must own an overlay's upper layer and git dir (``None``: so's own)."""

    def health(self) -> Health:
        """Can this backend create sandboxes on this host, and if not, how to fix it."""
