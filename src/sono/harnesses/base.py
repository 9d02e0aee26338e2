"""The Harness contract: how to run one agent CLI and read its output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from sono.events import Event


@dataclass(frozen=True)
class AgentOptions:
    model: str | None = None
    effort: str | None = None
    agent_cmd: str | None = None  # the custom harness's command line
    executable: str | None = None  # resolved CLI path (host path, mounted read-only)
    # Model API base URLs the agent must use instead of the vendor's, by wire family:
    # "anthropic" (Messages API), "openai" (Responses / Chat Completions). Filled from
    # ANTHROPIC_BASE_URL / OPENAI_BASE_URL today; the model gateway later.
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

    def env(self, host_env: Mapping[str, str], opts: AgentOptions) -> dict[str, str]:
        """Environment the agent needs (credentials it reads from env)."""

    def provision(self, *, home_seed: Path, host_home: Path) -> list[str]:
        """Copy credentials into ``home_seed``; returns what was copied (names only)."""

    def parser(self) -> EventParser:
        """A fresh parser for one run's output."""

    def executable_name(self, opts: AgentOptions) -> str | None:
        """The CLI to locate on PATH or in the agents dir (None: nothing to locate)."""
