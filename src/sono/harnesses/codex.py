"""OpenAI Codex CLI: ``codex exec --json`` with the prompt on stdin (``-``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from sono.harnesses.base import Access, AgentOptions, EventParser, NpmPackage
from sono.harnesses.codex_json import CodexJsonParser
from sono.net.upstream import env_upstreams

ENV_VARS = ("OPENAI_API_KEY", "CODEX_API_KEY", "OPENAI_BASE_URL")
# Credentials and settings only: sessions/, log/, history and caches stay on the host.
COPIED_FILES = ("auth.json", "config.toml")
PROVIDER = "so"  # the model provider `so` defines when the user gives a base URL
KEY_VAR = "OPENAI_API_KEY"
# codex refuses to start a turn when the provider's env_key is unset; a local endpoint
# usually needs no key, so it gets a placeholder rather than a failed run.
PLACEHOLDER_KEY = "sk-so-placeholder"


def config_flag(key: str, value: str | bool) -> list[str]:
    """``-c key=value`` with the value as TOML (a JSON string is a valid TOML string)."""
    text = ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
    return ["-c", f"{key}={text}"]


def responses_base_url(url: str) -> str:
    """codex POSTs ``<base_url>/responses``. A bare host gets ``/v1``; a URL with a path
    (``https://host/v1``, ``https://gw/openai/v1``) is taken as the full API base, as the
    OpenAI SDKs read ``OPENAI_BASE_URL``."""
    url = url.rstrip("/")
    return url if urlsplit(url).path else url + "/v1"


def provider_flags(base_url: str) -> list[str]:
    """A custom Responses API provider; the built-in one would try WebSockets first."""
    prefix = f"model_providers.{PROVIDER}"
    return [
        *config_flag("model_provider", PROVIDER),
        *config_flag(f"{prefix}.name", PROVIDER),
        *config_flag(f"{prefix}.base_url", responses_base_url(base_url)),
        *config_flag(f"{prefix}.env_key", KEY_VAR),
        *config_flag(f"{prefix}.wire_api", "responses"),
    ]


class CodexHarness:
    name: ClassVar[str] = "codex"
    # What codex 0.171 passes on as reasoning.effort (it clamps to what the model supports).
    efforts: ClassVar[tuple[str, ...]] = (
        "none",
        "minimal",
        "low",
        "medium",
        "high",
        "xhigh",
        "max",
        "ultra",
    )
    npm: ClassVar[NpmPackage | None] = NpmPackage("@openai/codex", "0.171.0", "codex")

    def executable_name(self, opts: AgentOptions) -> str | None:
        return "codex"

    def _flags(self, opts: AgentOptions) -> list[str]:
        args: list[str] = []
        if opts.model:
            args += ["-m", opts.model]
        if opts.effort:
            args += config_flag("model_reasoning_effort", opts.effort)
        # The sandbox's HOME is fresh every run: nobody could act on an update notice.
        args += config_flag("check_for_update_on_startup", False)
        base_url = opts.endpoints.get("openai")
        if base_url:
            args += provider_flags(base_url)
        return args

    def unattended_argv(self, opts: AgentOptions) -> list[str]:
        return [
            opts.executable or "codex",
            "exec",
            "--json",
            # `so`'s sandbox is the sandbox; codex's own (landlock/bwrap) cannot nest in it.
            "--dangerously-bypass-approvals-and-sandbox",
            # The workspace is a git repo, but a detached or odd checkout must not stop a run.
            "--skip-git-repo-check",
            *self._flags(opts),
            "-",  # the prompt is read from stdin
        ]

    def interactive_argv(self, opts: AgentOptions, prompt: str | None) -> list[str]:
        return [opts.executable or "codex", *self._flags(opts), *([prompt] if prompt else [])]

    def env(self, host_env: Mapping[str, str], opts: AgentOptions) -> dict[str, str]:
        env = {k: host_env[k] for k in ENV_VARS if host_env.get(k)}
        if opts.endpoints.get("openai") and KEY_VAR not in env:
            env[KEY_VAR] = env.get("CODEX_API_KEY", PLACEHOLDER_KEY)
        return env

    def access(self, host_env: Mapping[str, str], host_home: Path) -> Access:
        return Access(env_upstreams(host_env))

    def provision(self, *, home_seed: Path, host_home: Path, opts: AgentOptions) -> list[str]:
        copied: list[str] = []
        for name in COPIED_FILES:
            src = host_home / ".codex" / name
            if src.is_file() and not src.is_symlink():
                dest = home_seed / ".codex" / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
                copied.append(f"~/.codex/{name}")
        return copied

    def parser(self) -> EventParser:
        return CodexJsonParser()
