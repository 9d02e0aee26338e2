"""Any command line as an agent: prompt on stdin and in ``$SO_PROMPT_FILE``."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from sono.errors import SoError
from sono.events import Event, Text
from sono.harnesses.base import Access, AgentOptions, EventParser, NpmPackage
from sono.harnesses.claude_stream import ClaudeStreamParser
from sono.net.upstream import env_upstreams


class CustomParser:
    """Plain lines become text; Claude-style stream-json lines are understood too."""

    def __init__(self) -> None:
        self._json = ClaudeStreamParser()

    def feed(self, line: str) -> list[Event]:
        stripped = line.strip()
        if stripped.startswith("{"):
            try:
                data = json.loads(stripped)
            except ValueError:
                data = None
            if isinstance(data, dict) and "type" in data:
                return self._json.feed(line)
        return [Text(text=line)] if stripped else []


# What a shell would treat as syntax outside quotes; no shell runs the command, so each
# would silently become an argument. Longest first: "&&" is reported as itself.
OPERATORS = ("&&", "||", "$(", "|", ";", ">", "<", "&", "`")


def shell_operator(command: str) -> str | None:
    """The first shell operator in ``command`` outside quotes, or None. Backticks and
    ``$(`` count inside double quotes too (a shell expands them there)."""
    quote = ""
    i = 0
    while i < len(command):
        ch = command[i]
        if ch == "\\" and quote != "'":
            i += 2
            continue
        if quote and ch == quote:
            quote = ""
        elif not quote and ch in "'\"":
            quote = ch
        elif quote != "'":
            found = next((op for op in OPERATORS if command.startswith(op, i)), None)
            if found is not None and (not quote or found in ("$(", "`")):
                return found
        i += 1
    return None


class CustomHarness:
    name: ClassVar[str] = "custom"
    efforts: ClassVar[tuple[str, ...]] = ("*",)  # anything: passed on as $SO_EFFORT
    npm: ClassVar[NpmPackage | None] = None

    def executable_name(self, opts: AgentOptions) -> str | None:
        return self._argv(opts)[0]

    def _argv(self, opts: AgentOptions) -> list[str]:
        if not opts.agent_cmd:
            raise SoError(
                "the custom harness needs a command: pass --agent-cmd 'CMD ARGS' "
                "or set agent_cmd in config"
            )
        try:
            argv = shlex.split(opts.agent_cmd)
        except ValueError as exc:
            raise SoError(f"--agent-cmd: cannot parse {opts.agent_cmd!r}: {exc}") from exc
        if not argv:
            raise SoError("--agent-cmd is empty; give the agent's command line")
        operator = shell_operator(opts.agent_cmd)
        if operator is not None:
            raise SoError(
                f"--agent-cmd is not run by a shell, so its {operator!r} would reach the "
                "program as a plain argument; for shell syntax wrap it as "
                "--agent-cmd \"sh -c '…'\""
            )
        return argv

    def unattended_argv(self, opts: AgentOptions) -> list[str]:
        argv = self._argv(opts)
        return [opts.executable or argv[0], *argv[1:]]

    def interactive_argv(self, opts: AgentOptions, prompt: str | None) -> list[str]:
        return self.unattended_argv(opts)

    def env(self, host_env: Mapping[str, str], opts: AgentOptions) -> dict[str, str]:
        env = {}
        if opts.model:
            env["SO_MODEL"] = opts.model
        if opts.effort:
            env["SO_EFFORT"] = opts.effort
        return env

    def access(self, host_env: Mapping[str, str], host_home: Path) -> Access:
        return Access(env_upstreams(host_env))

    def provision(self, *, home_seed: Path, host_home: Path, opts: AgentOptions) -> list[str]:
        return []

    def parser(self) -> EventParser:
        return CustomParser()
