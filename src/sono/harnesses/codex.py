"""OpenAI Codex CLI: ``codex exec --json`` with the prompt on stdin (``-``)."""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from sono.harnesses import codex_config as cc
from sono.harnesses.base import Access, AgentOptions, EventParser, NpmPackage
from sono.harnesses.codex_json import CodexJsonParser

# The key variables codex reads itself; they reach the sandbox only as placeholders.
ENV_VARS = ("OPENAI_API_KEY", "CODEX_API_KEY")
COPIED_FILES = (cc.AUTH, cc.CONFIG)  # sessions/, log/, history and caches stay on the host
PROJECT_KEYS = (
    "model_provider",
    "model_providers",
    "openai_base_url",
    "chatgpt_base_url",
    "profile",
    "profiles",
)


def config_flag(key: str, value: str | bool) -> list[str]:
    """``-c key=value`` with the value as TOML (a JSON string is a valid TOML string)."""
    text = ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
    return ["-c", f"{key}={text}"]


def provider_flags(name: str, url: str) -> list[str]:
    """Pin the provider ``so`` serves under ``name`` to the gateway's ``url``: ``-c`` is
    the highest layer codex has, above a project's ``.codex/config.toml``."""
    if name == cc.OPENAI:
        return [
            *config_flag("model_provider", cc.OPENAI),
            *config_flag("openai_base_url", url),
            *config_flag("chatgpt_base_url", url),
            # With a ChatGPT login codex zstd-compresses request bodies; plain JSON lets
            # the gateway read the model it meters (the upstream takes either).
            *config_flag("features.enable_request_compression", False),
        ]
    if name in cc.OSS_PORTS:  # its base URL comes from CODEX_OSS_BASE_URL (see env())
        return config_flag("model_provider", name)
    return [
        *config_flag("model_provider", name),
        *config_flag(f"model_providers.{name}.base_url", url),
    ]


def codex_endpoint(opts: AgentOptions) -> tuple[str, str] | None:
    """codex talks to one provider: the one upstream its access() named."""
    return next(iter(opts.endpoints.items()), None)


def project_notes(start: Path) -> tuple[str, ...]:
    """A project's ``.codex/config.toml`` is agent-writable: never used on the host."""
    for directory in (start, *start.parents):
        path = directory / ".codex" / cc.CONFIG
        if path.is_file():
            try:
                data = tomllib.loads(path.read_text())
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                data = {}
            keys = [k for k in PROJECT_KEYS if k in data]
            if keys:
                return (
                    f"{path} sets {', '.join(keys)}: not used (the project is agent-writable); "
                    "put providers in ~/.codex/config.toml",
                )
            return ()
        if (directory / ".git").exists():
            return ()
    return ()


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
        endpoint = codex_endpoint(opts)
        if endpoint:
            args += provider_flags(*endpoint)
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
        endpoint = codex_endpoint(opts)
        if endpoint and endpoint[0] in cc.OSS_PORTS:
            env["CODEX_OSS_BASE_URL"] = endpoint[1]
        return env

    def access(self, host_env: Mapping[str, str], host_home: Path) -> Access:
        notes = project_notes(Path.cwd())
        if host_env.get("CODEX_HOME"):
            notes += ("CODEX_HOME is set: so reads ~/.codex only (unset it or link it there)",)
        codex_home = host_home / ".codex"
        try:
            config = cc.read_config(codex_home)
            choice = cc.choose(config)
            auth = cc.read_auth(codex_home)
            upstream = cc.upstream_for(choice, config, auth, host_env, codex_home)
        except cc.ConfigError as exc:
            return Access(notes=notes, refusal=f"codex: {exc}")
        return Access((upstream,), notes)

    def provision(self, *, home_seed: Path, host_home: Path, opts: AgentOptions) -> list[str]:
        """The sandbox's ``~/.codex``: ``config.toml`` pointed at the gateway and
        ``auth.json`` with placeholders. Without a gateway (a sandbox made before the
        network policy, on the host's network) the files are copied as they are."""
        src, dest = host_home / ".codex", home_seed / ".codex"
        endpoint = codex_endpoint(opts)
        copied: list[str] = []
        for name in COPIED_FILES:
            if not (src / name).is_file() or (src / name).is_symlink():
                continue
            dest.mkdir(parents=True, exist_ok=True)
            if endpoint is None:
                shutil.copy2(src / name, dest / name)
            else:
                (dest / name).write_text(self._sandbox_file(src, name, endpoint))
                (dest / name).chmod(0o600)
            copied.append(f"~/.codex/{name}")
        return copied

    def _sandbox_file(self, src: Path, name: str, endpoint: tuple[str, str]) -> str:
        if name == cc.AUTH:
            return json.dumps(cc.sandbox_auth(cc.read_auth(src)), indent=2)
        config = cc.read_config(src)
        choice = cc.choose(config)
        url = endpoint[1] if choice.name == endpoint[0] else None
        return cc.dumps(cc.sandbox_config(config, choice, url))

    def parser(self) -> EventParser:
        return CodexJsonParser()
