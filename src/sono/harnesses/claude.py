"""Claude Code: ``claude -p --verbose --output-format stream-json`` with the prompt on stdin.

Its model endpoint and credential are read on the host from its own configuration
(:mod:`sono.harnesses.claude_config`); inside, ``--settings`` points it at the gateway and
its files hold placeholders.

Provisioning is an allow-list (:data:`COPIED_FILES`, :data:`CUSTOM_DIRS`, the rewritten
:data:`REWRITTEN`): settings and the login are written with placeholders, the user's own
customisation directories (agents, commands, skills, output styles, plugins, hooks,
rules, themes, workflows) are copied minus symlinks and key-looking files. Nothing else
of ``~/.claude`` goes inside: not history, transcripts, memory (``CLAUDE.md``), caches,
``backups/`` (rotated copies of ``~/.claude.json`` with its API key), ``session-env/``,
``daemon/``, nor a script or key file a setting points to (``apiKeyHelper``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from sono.harnesses import claude_config as cfg
from sono.harnesses.base import Access, AgentOptions, EventParser, NpmPackage
from sono.harnesses.claude_stream import ClaudeStreamParser
from sono.harnesses.homecopy import copy_allowed
from sono.net.upstream import PLACEHOLDER

ENV_PREFIXES = ("ANTHROPIC_", "CLAUDE_CODE_")
# What of ~/.claude goes inside besides REWRITTEN: an allow-list, nothing else is copied.
COPIED_FILES = ("keybindings.json",)
# The user's own customisation, as documented by Claude Code.
CUSTOM_DIRS = (
    "agents",
    "commands",
    "skills",
    "output-styles",
    "plugins",
    "hooks",
    "rules",
    "themes",
    "workflows",
)

# Files of ~/.claude that hold endpoints or credentials: rewritten, never copied as is
# (one that cannot be parsed is left out).
REWRITTEN: dict[str, Callable[[dict[str, Any], str | None], dict[str, Any] | None]] = {
    "settings.json": cfg.sandbox_settings,
    "settings.local.json": cfg.sandbox_settings,
    ".credentials.json": lambda data, _endpoint: cfg.sandbox_credentials(data),
}


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
    path.chmod(0o600)


class ClaudeHarness:
    name: ClassVar[str] = "claude"
    efforts: ClassVar[tuple[str, ...]] = ("low", "medium", "high", "xhigh", "max")
    npm: ClassVar[NpmPackage | None] = NpmPackage("@anthropic-ai/claude-code", "2.1.197", "claude")

    def executable_name(self, opts: AgentOptions) -> str | None:
        return "claude"

    def _common(self, opts: AgentOptions) -> list[str]:
        args = [opts.executable or "claude", "--settings", json.dumps(self.overrides(opts))]
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

    def overrides(self, opts: AgentOptions) -> dict[str, Any]:
        """``--settings``: the CLI's flag settings override the project's
        ``.claude/settings*.json`` (only managed settings, host-only, rank higher), so the
        agent cannot point claude elsewhere. A provider switch would bypass the gateway."""
        env = dict.fromkeys(cfg.PROVIDER_VARS, "0")
        endpoint = opts.endpoints.get(cfg.UPSTREAM)
        if endpoint:
            env["ANTHROPIC_BASE_URL"] = endpoint
        return {"env": env}

    def env(self, host_env: Mapping[str, str], opts: AgentOptions) -> dict[str, str]:
        env = {
            k: v
            for k, v in host_env.items()
            if k.startswith(ENV_PREFIXES) and k != "ANTHROPIC_CUSTOM_HEADERS"
        }
        endpoint = opts.endpoints.get(cfg.UPSTREAM)
        if endpoint:
            env["ANTHROPIC_BASE_URL"] = endpoint
        for var in cfg.CREDENTIAL_KEYS:
            if env.get(var):
                env[var] = PLACEHOLDER
        env.setdefault("DISABLE_AUTOUPDATER", "1")
        # No telemetry or title side-requests from an unattended, fresh-context run.
        env.setdefault("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        # The agent runs as an unprivileged uid inside; this only matters under Docker-as-root.
        env.setdefault("IS_SANDBOX", "1")
        return env

    def access(self, host_env: Mapping[str, str], host_home: Path) -> Access:
        upstream, notes, refusal = cfg.find_upstream(host_env, host_home, project=Path.cwd())
        return Access((upstream,) if upstream else (), notes, refusal)

    def provision(self, *, home_seed: Path, host_home: Path, opts: AgentOptions) -> list[str]:
        """``~/.claude`` and ``~/.claude.json`` as the CLI needs them to run as the user
        configured it (the allow-list of the module docstring), with every credential a
        placeholder:
        ``settings.json`` (env keys, no helper, the gateway's URL), ``.credentials.json``
        (a placeholder login with a far expiry), ``~/.claude.json`` (no API key)."""
        endpoint = opts.endpoints.get(cfg.UPSTREAM)
        copied: list[str] = []
        src = host_home / ".claude"
        if src.is_dir():
            dest = home_seed / ".claude"
            copy_allowed(src, dest, COPIED_FILES, CUSTOM_DIRS)
            for name, rewrite in REWRITTEN.items():
                data = cfg.read_json(src / name) if (src / name).is_file() else None
                rewritten = rewrite(data, endpoint) if data is not None else None
                if rewritten is not None:
                    _write_json(dest / name, rewritten)
            copied.append("~/.claude")
        data = cfg.read_json(host_home / ".claude.json")
        if data is not None:
            # Written, never bind-mounted: Claude rewrites it by atomic rename.
            _write_json(home_seed / ".claude.json", cfg.sandbox_global(data, endpoint))
            copied.append("~/.claude.json")
        return copied

    def parser(self) -> EventParser:
        return ClaudeStreamParser()
