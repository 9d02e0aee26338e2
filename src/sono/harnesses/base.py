"""The Harness contract: how to run one agent CLI and read its output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from sono.events import Event
from sono.net.upstream import Upstream


@dataclass(frozen=True)
class AgentOptions:
    model: str | None = None
    effort: str | None = None
    agent_cmd: str | None = None  # the custom harness's command line
    executable: str | None = None  # resolved CLI path (host path, mounted read-only)
    # The model gateway's URL inside the sandbox for each upstream of the harness's
    # :meth:`Harness.access`, by upstream name: the agent must use these, never the
    # endpoints its own config names (empty: no gateway, e.g. a sandbox without network).
    endpoints: Mapping[str, str] = field(default_factory=dict)
    task: str = "code"  # code | plan | learn — per-task defaults (effort) key on it


@dataclass(frozen=True)
class NpmPackage:
    """How ``so agents install`` gets a harness's CLI at a pinned version."""

    name: str
    version: str
    bin: str
    # More packages installed into the same prefix, e.g. a Node runtime ("node@22.x").
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class Access:
    """How the harness's CLI, as the user configured it on the host, reaches its models:
    every endpoint it would call, with the real credential (host-only data), plus
    ``notes`` for the user (settings read but not used, and why) and ``refusal``: why the
    configured setup cannot run through ``so`` at all (the run does not start)."""

    upstreams: tuple[Upstream, ...] = ()
    notes: tuple[str, ...] = ()
    refusal: str | None = None

    def upstream(self, name: str) -> Upstream | None:
        return next((u for u in self.upstreams if u.name == name), None)


class EventParser(Protocol):
    def feed(self, line: str) -> list[Event]:
        """Parse one output line; never raises, unknown lines become ``Raw``."""


class Harness(Protocol):
    name: ClassVar[str]
    # Accepted --effort values; () = the harness takes none (an effort is an error);
    # ("*",) = anything, passed through.
    efforts: ClassVar[tuple[str, ...]]
    npm: ClassVar[NpmPackage | None]

    def unattended_argv(self, opts: AgentOptions) -> list[str]:
        """Command line for one loop iteration; the prompt arrives on stdin."""

    def interactive_argv(self, opts: AgentOptions, prompt: str | None) -> list[str]:
        """Command line for plan/learn/step sessions attached to a terminal."""

    def access(self, host_env: Mapping[str, str], host_home: Path) -> Access:
        """Read the CLI's own configuration on the host, as the CLI does (its env
        variables, its user config and credential files under ``host_home``): every model
        endpoint it would use, with the credential. Never runs anything from the project
        (agent-writable); may run a user-configured key helper on the host."""

    def env(self, host_env: Mapping[str, str], opts: AgentOptions) -> dict[str, str]:
        """Environment the agent gets: its settings, ``opts.endpoints`` in the variables
        it reads, placeholders for credentials (``host_env`` has them replaced already)."""

    def provision(self, *, home_seed: Path, host_home: Path, opts: AgentOptions) -> list[str]:
        """Copy the agent's settings and login files into ``home_seed``, each model
        endpoint rewritten to ``opts.endpoints`` and every credential replaced by a
        placeholder of the same shape (the CLI must still accept the file); returns what
        was copied (names only)."""

    def parser(self) -> EventParser:
        """A fresh parser for one run's output."""

    def executable_name(self, opts: AgentOptions) -> str | None:
        """The CLI to locate on PATH or in the agents dir (None: nothing to locate)."""
