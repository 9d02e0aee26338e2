"""Claude Code: ``claude -p --verbose --output-format stream-json`` with the prompt on stdin."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from sono.harnesses.base import Access, AgentOptions, EventParser, NpmPackage
from sono.harnesses.claude_stream import ClaudeStreamParser
from sono.net.upstream import env_upstreams

ENV_PREFIXES = ("ANTHROPIC_", "CLAUDE_CODE_")
# Host state that is not a credential or setting: history, transcripts, caches.
SKIP_IN_DOT_CLAUDE = frozenset(
    {
        "CLAUDE.md",
        "history.jsonl",
        "todos",
        "projects",
        "sessions",
        "shell-snapshots",
        "statsig",
        "logs",
        "ide",
        "local",
        "debug",
        "file-history",
        "plans",
        "cache",
    }
)


class ClaudeHarness:
    name: ClassVar[str] = "claude"
    efforts: ClassVar[tuple[str, ...]] = ("low", "medium", "high", "xhigh", "max")
    npm: ClassVar[NpmPackage | None] = NpmPackage("@anthropic-ai/claude-code", "2.1.197", "claude")

    def executable_name(self, opts: AgentOptions) -> str | None:
        return "claude"

    def _common(self, opts: AgentOptions) -> list[str]:
        args = [opts.executable or "claude"]
        if opts.model:
            args += ["--model", opts.model]
        if opts.effort:
            args += ["--effort", opts.effort]
        return args

    def unattended_argv(self, opts: AgentOptions) -> list[str]:
        exe, *rest = self._common(opts)
        return [
            exe,
            "-p",
            "--verbose",
            "--output-format",
            "stream-json",
            "--dangerously-skip-permissions",
            *rest,
        ]

    def interactive_argv(self, opts: AgentOptions, prompt: str | None) -> list[str]:
        return [*self._common(opts), *([prompt] if prompt else [])]

    def env(self, host_env: Mapping[str, str], opts: AgentOptions) -> dict[str, str]:
        env = {k: v for k, v in host_env.items() if k.startswith(ENV_PREFIXES)}
        env.setdefault("DISABLE_AUTOUPDATER", "1")
        # No telemetry or title side-requests from an unattended, fresh-context run.
        env.setdefault("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        # The agent runs as an unprivileged uid inside; this only matters under Docker-as-root.
        env.setdefault("IS_SANDBOX", "1")
        return env

    def access(self, host_env: Mapping[str, str], host_home: Path) -> Access:
        return Access(env_upstreams(host_env))

    def provision(self, *, home_seed: Path, host_home: Path, opts: AgentOptions) -> list[str]:
        copied: list[str] = []
        src = host_home / ".claude"
        if src.is_dir():
            dest = home_seed / ".claude"
            dest.mkdir(parents=True, exist_ok=True)
            for child in src.iterdir():
                if child.name in SKIP_IN_DOT_CLAUDE or child.is_symlink():
                    continue
                target = dest / child.name
                if child.is_dir():
                    shutil.copytree(child, target, dirs_exist_ok=True, symlinks=True)
                else:
                    shutil.copy2(child, target)
            copied.append("~/.claude")
        if (host_home / ".claude.json").is_file():
            # Copied, never bind-mounted: Claude rewrites it by atomic rename.
            shutil.copy2(host_home / ".claude.json", home_seed / ".claude.json")
            copied.append("~/.claude.json")
        return copied

    def parser(self) -> EventParser:
        return ClaudeStreamParser()
