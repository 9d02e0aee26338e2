"""opencode (``opencode-ai``): ``opencode run --format json`` with the prompt on stdin.

``opencode run`` reads stdin when it is not a terminal and appends it to the message, so
the loop's prompt needs no argument.

Model endpoints (:mod:`sono.harnesses.opencode_config` reads them on the host as opencode
does): every provider of the user's config (``~/.config/opencode``, ``OPENCODE_CONFIG``,
``OPENCODE_CONFIG_CONTENT``), every login in ``auth.json`` and every vendor key in the
environment becomes an upstream ``opencode-<provider id>``; the sandbox gets the config
with those providers' ``baseURL`` at the gateway, placeholder keys, no headers, and an
``auth.json`` of placeholders. The same overrides travel in ``OPENCODE_CONFIG_CONTENT``,
which opencode merges last, above a project's ``opencode.json``. Plain-env setups keep
so's own providers, as opencode has no ``*_BASE_URL`` variables of its own:

- ``openai`` → provider ``so-openai`` on ``@ai-sdk/openai-compatible`` (Chat Completions,
  ``<base>/chat/completions``; a bare host gets ``/v1``, as codex does);
- ``anthropic`` → provider ``so-anthropic`` on ``@ai-sdk/anthropic`` (Messages API; the SDK
  wants ``…/v1`` where ``ANTHROPIC_BASE_URL`` has none).

Provisioning copies of the config directory only :data:`COPIED_FILES` and the user's
customisation directories :data:`CUSTOM_DIRS` (agents, commands, modes, plugins, tools,
skills, themes), minus symlinks and key-looking files; nothing else goes inside, so a
key file that ``{file:…}`` points to stays home.

A bare ``-m NAME`` names a model of that provider; ``-m provider/model`` is passed as is.

``--format json`` shapes (opencode 1.18.33), one object per line, each with ``type``,
``timestamp`` and ``sessionID``; ``part`` is opencode's message part:

- ``step_start`` per model request (no model name, no session banner of its own);
- ``text`` / ``reasoning`` (``reasoning`` only with ``--thinking``) with ``part.text``;
- ``tool_use`` once a tool finished: ``part.tool``, ``part.callID``, ``part.state``
  ``{status: completed|error, input, output, error, metadata: {exit…}, title}``;
- ``step_finish`` with ``part.reason`` (``tool-calls``, ``stop``, …), ``part.cost`` and
  ``part.tokens {input, output, reasoning, cache: {read, write}}`` (input excludes cache);
- ``error`` with ``error {name, data: {message, statusCode…}}``; the exit code is then 1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from sono.events import (
    Error,
    Event,
    FileChanged,
    Result,
    SessionStarted,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Usage,
    summarize,
)
from sono.harnesses.base import Access, AgentOptions, EventParser, NpmPackage
from sono.harnesses.homecopy import copy_allowed
from sono.harnesses.jsonread import as_dict as _dict
from sono.harnesses.jsonread import as_int as _int
from sono.harnesses.jsonread import as_num as _num
from sono.harnesses.jsonread import as_str as _str
from sono.harnesses.jsonread import parse_line
from sono.harnesses.opencode_config import (
    REFRESHERS,
    UNROUTABLE_OAUTH,
    AuthJsonFormat,
    ConfigError,
    Provider,
    UserConfig,
    api_of,
    auth_header,
    chosen_provider,
    config_dir,
    host_home,
    merge,
    parse_jsonc,
    placeholder_auth,
    project_endpoint_notes,
    providers,
    read_auth,
    read_user_config,
    sdk_base,
    upstream_base,
    upstream_name,
    wellknown_notes,
)
from sono.net import scrub
from sono.net.oauth import FileToken
from sono.net.upstream import PLACEHOLDER, Credential, Upstream, env_upstreams

PROVIDER_KEYS = frozenset(
    {
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENROUTER_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_GENERATIVE_AI_API_KEY",
        "GROQ_API_KEY",
        "XAI_API_KEY",
        "DEEPSEEK_API_KEY",
        "MISTRAL_API_KEY",
    }
)
# Host paths (meaningless in the sandbox's fresh HOME) and opencode's own process markers.
HOST_ONLY_VARS = frozenset(
    {
        "OPENCODE_CONFIG",
        "OPENCODE_CONFIG_DIR",
        "OPENCODE_TUI_CONFIG",
        "OPENCODE_DB",
        "OPENCODE_MODELS_PATH",
        "OPENCODE_GIT_BASH_PATH",
        "OPENCODE_PLUGIN_META_FILE",
        "OPENCODE_PID",
        # A login (auth.json's content): provisioned as a file of placeholders instead.
        "OPENCODE_AUTH_CONTENT",
    }
)
# Every exec starts with an empty HOME, so anything opencode would download at start
# (update check, models.dev catalogue, LSP servers) is refetched every iteration; the
# binary ships a models snapshot, so the catalogue fetch is not needed.
QUIET_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
}
# The sandbox is the boundary; "ask" would make `opencode run` auto-reject the tool.
ALLOW_ALL = '{"*":"allow"}'
BASE_CONFIG: dict[str, Any] = {
    "$schema": "https://opencode.ai/config.json",
    "autoupdate": False,
    "share": "disabled",
    # opencode snapshots the worktree into a shadow git repo under HOME (a tmpfs here) at
    # every step for its own undo; the loop already commits and records every iteration.
    "snapshot": False,
}
PROVIDERS = {
    "openai": ("so-openai", "@ai-sdk/openai-compatible", "OPENAI_API_KEY"),
    "anthropic": ("so-anthropic", "@ai-sdk/anthropic", "ANTHROPIC_API_KEY"),
}
DEFAULT_MODELS = {"openai": "gpt-5", "anthropic": "claude-sonnet-4-5"}
# Anthropic thinking budgets are derived from the output limit (high = output/2 - 1): an
# undeclared limit gives budget_tokens -1, which the API rejects.
MODEL_LIMITS: dict[str, dict[str, Any]] = {
    "anthropic": {"limit": {"context": 200_000, "output": 64_000}}
}
# What of the config directory goes inside: an allow-list, nothing else is copied. The
# config files themselves (opencode.json, opencode.jsonc, config.json) are written merged,
# with every provider's secrets replaced; plugin installs (node_modules, lock files), and
# any key file a config points to (``{file:./keys/x.txt}``) stay home.
COPIED_FILES = ("tui.json", "tui.jsonc", "AGENTS.md", "package.json")
# The user's own customisation, in the singular and plural names opencode globs.
CUSTOM_DIRS = (
    "agent",
    "agents",
    "command",
    "commands",
    "mode",
    "modes",
    "plugin",
    "plugins",
    "tool",
    "tools",
    "skill",
    "skills",
    "themes",
)
USER_PREFIX = "opencode-"  # upstreams named after a provider of the user's own config
LOGIN_HINT = "run `opencode auth login` on the host"


class OpencodeHarness:
    name: ClassVar[str] = "opencode"
    # The union of what ``--variant`` maps to across opencode's providers (reasoning
    # effort for OpenAI-style models, thinking budgets "high"/"max" for Anthropic);
    # a variant the chosen model lacks is ignored by opencode.
    efforts: ClassVar[tuple[str, ...]] = (
        "none",
        "minimal",
        "low",
        "medium",
        "high",
        "xhigh",
        "max",
    )
    npm: ClassVar[NpmPackage | None] = NpmPackage("opencode-ai", "1.18.33", "opencode")

    def executable_name(self, opts: AgentOptions) -> str | None:
        return "opencode"

    def unattended_argv(self, opts: AgentOptions) -> list[str]:
        # --auto approves what a rule still leaves at "ask" (never an explicit deny).
        args = [opts.executable or "opencode", "run", "--format", "json", "--thinking", "--auto"]
        model = model_ref(opts)
        if model:
            args += ["-m", model]
        if opts.effort:
            args += ["--variant", opts.effort]
        return args

    def interactive_argv(self, opts: AgentOptions, prompt: str | None) -> list[str]:
        # The TUI's positional argument is a project path; the prompt goes in --prompt.
        # It has no --variant flag: the effort is picked inside the TUI.
        args = [opts.executable or "opencode"]
        model = model_ref(opts)
        if model:
            args += ["-m", model]
        return [*args, *(["--prompt", prompt] if prompt else [])]

    def env(self, host_env: Mapping[str, str], opts: AgentOptions) -> dict[str, str]:
        env = {
            k: v
            for k, v in host_env.items()
            if k in PROVIDER_KEYS or (k.startswith("OPENCODE_") and k not in HOST_ONLY_VARS)
        }
        for key, value in QUIET_ENV.items():
            env.setdefault(key, value)
        if opts.task == "code":  # plan/learn run attached to a person, who answers asks
            env.setdefault("OPENCODE_PERMISSION", ALLOW_ALL)
        host_inline = sanitized(_json_object(host_env.get("OPENCODE_CONFIG_CONTENT")), opts)
        config = merge(host_inline, merge(config_for(opts), routed_overrides(host_env, opts)))
        env["OPENCODE_CONFIG_CONTENT"] = json.dumps(config, separators=(",", ":"))
        return env

    def access(self, host_env: Mapping[str, str], host_home: Path) -> Access:
        notes = project_endpoint_notes(Path.cwd())
        try:
            user = read_user_config(host_env, host_home)
        except ConfigError as exc:
            return Access(refusal=f"opencode: {exc}; fix it (opencode itself would not start)")
        notes += wellknown_notes(user.auth)
        notes += [
            f"{label} names {{env:{var}}}, which is not set: opencode gets an empty value there"
            for var, label in user.unset
        ]
        found = user_upstreams(user, host_env)
        covered = {u.name.removeprefix(USER_PREFIX) for u in found.upstreams}
        legacy = tuple(
            u
            for u in env_upstreams(host_env)
            if u.name not in covered and (not found.upstreams or _named_by_env(u, host_env))
        )
        return Access((*found.upstreams, *legacy), (*notes, *found.notes), found.refusal)

    def provision(self, *, home_seed: Path, host_home: Path, opts: AgentOptions) -> list[str]:
        copied: list[str] = []
        env = _home_env(host_home)
        config = config_dir(env, host_home)
        if config.is_dir():
            copy_allowed(config, home_seed / ".config" / "opencode", COPIED_FILES, CUSTOM_DIRS)
            copied.append("~/.config/opencode")
        merged = _raw_user_config(config)
        if merged:
            dest = home_seed / ".config" / "opencode" / "opencode.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(json.dumps(sanitized(merged, opts), indent=2))
        auth, _, _ = read_auth(env, host_home)
        if auth:
            dest = home_seed / ".local" / "share" / "opencode" / "auth.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(json.dumps(placeholder_auth(auth, PLACEHOLDER), indent=2))
            dest.chmod(0o600)
            copied.append("~/.local/share/opencode/auth.json")
        return copied

    def parser(self) -> EventParser:
        return OpencodeJsonParser()


# --- configuration ----------------------------------------------------------------------


def endpoint_family(opts: AgentOptions) -> str | None:
    """The endpoint that provides the default model: Chat Completions first, being the
    format most OpenAI-compatible servers (and gateways) speak."""
    return next((f for f in PROVIDERS if opts.endpoints.get(f)), None)


def user_mode(opts: AgentOptions) -> bool:
    """The user's own providers are routed: their config chooses the model."""
    return any(name.startswith(USER_PREFIX) for name in opts.endpoints)


def model_ref(opts: AgentOptions) -> str | None:
    """``provider/model`` for ``-m``: a bare model name belongs to the endpoint provider
    (when ``so`` made that provider; the user's own config names its model itself)."""
    family = endpoint_family(opts)
    if opts.model and ("/" in opts.model or family is None or user_mode(opts)):
        return opts.model
    if family is None or user_mode(opts):
        return None
    return f"{PROVIDERS[family][0]}/{opts.model or DEFAULT_MODELS[family]}"


def config_for(opts: AgentOptions) -> dict[str, Any]:
    """The inline config: quiet defaults plus one provider per model endpoint."""
    config: dict[str, Any] = dict(BASE_CONFIG)
    providers = {
        PROVIDERS[family][0]: provider_config(family, url, opts)
        for family, url in opts.endpoints.items()
        if family in PROVIDERS and url
    }
    if providers:
        config["provider"] = providers
    model = model_ref(opts)
    if endpoint_family(opts) is not None and model and not user_mode(opts):
        # Titles and summaries use the "small model"; it must not be a vendor's default.
        config["small_model"] = model
    return config


def provider_config(family: str, url: str, opts: AgentOptions) -> dict[str, Any]:
    provider_id, package, key_var = PROVIDERS[family]
    base = api_base_url(family, url)
    ref = model_ref(opts) or ""
    model = ref.partition("/")[2] if ref.startswith(f"{provider_id}/") else DEFAULT_MODELS[family]
    # A model must be declared reasoning-capable for --variant to select an effort.
    model_info: dict[str, Any] = {"reasoning": True} if opts.effort else {}
    model_info |= MODEL_LIMITS.get(family, {})
    return {
        "npm": package,
        "name": f"so endpoint ({family})",
        # {env:…} is substituted by opencode, so the key never lands in the argv or config.
        "options": {"baseURL": base, "apiKey": f"{{env:{key_var}}}"},
        "models": {model: {"name": model, **model_info}},
    }


def api_base_url(family: str, url: str) -> str:
    """The SDK's base URL. OpenAI: a bare host gets ``/v1``, a URL with a path is the full
    base (``https://gw/openai/v1``), as for codex. Anthropic: ``ANTHROPIC_BASE_URL`` never
    has the ``/v1`` that ``@ai-sdk/anthropic`` wants (claude appends it itself)."""
    base = url.rstrip("/")
    if family == "anthropic":
        return base if base.endswith("/v1") else base + "/v1"
    return base if urlsplit(base).path else base + "/v1"


@dataclass(frozen=True)
class Found:
    upstreams: tuple[Upstream, ...]
    notes: tuple[str, ...]
    refusal: str | None


def user_upstreams(user: UserConfig, host_env: Mapping[str, str]) -> Found:
    """An upstream per provider the user set up in opencode (config, login, vendor key);
    the built-in anthropic/openai with only an environment key stay with the plain-env
    reading (:func:`env_upstreams`), as before."""
    chosen = chosen_provider(user.config)
    ups: list[Upstream] = []
    notes: list[str] = []
    refusal: str | None = None
    for provider in providers(user, host_env):
        if _env_only(provider) and provider.id != chosen:
            continue
        why = unroutable(provider)
        if why is None:
            upstream = _upstream(provider, user)
            if any(u.name == upstream.name for u in ups):
                why = f"its route name {upstream.name} is taken by another provider"
            else:
                ups.append(upstream)
                continue
        line = f"opencode: provider {provider.id!r} is not routed: {why}"
        if provider.id == chosen and refusal is None:
            refusal = f"{line}; choose a model of another provider (`model` or -m)"
        else:
            notes.append(line)
    return Found(tuple(ups), tuple(notes), refusal)


def _named_by_env(upstream: Upstream, host_env: Mapping[str, str]) -> bool:
    """so's own providers for the plain environment are added next to the user's only
    when the environment names that endpoint (a base URL or a key variable)."""
    return upstream.source.startswith("env ") or upstream.credential.source.startswith("env ")


def _env_only(provider: Provider) -> bool:
    return (
        provider.id in ("anthropic", "openai")
        and not provider.configured
        and provider.login is None
        and provider.key_source.startswith("env ")
    )


def unroutable(provider: Provider) -> str | None:
    if provider.api is None:
        return (
            f"its package {provider.npm or '(none)'} speaks no API the gateway forwards "
            "(Anthropic Messages, OpenAI Responses/Chat Completions)"
        )
    if not provider.base_url:
        return "it has no options.baseURL"
    if provider.login is not None and provider.id in UNROUTABLE_OAUTH:
        return f"{UNROUTABLE_OAUTH[provider.id]}; use an API key (`opencode auth login`)"
    return None


def _upstream(provider: Provider, user: UserConfig) -> Upstream:
    api = provider.api
    assert api is not None  # unroutable() said so
    if provider.login is not None:
        credential = _login_credential(provider, user)
    elif provider.key:
        kind = "auth token" if provider.key_source.startswith("env OPENCODE_AUTH") else "API key"
        credential = Credential(kind, provider.key_source, auth_header(provider), provider.key)
    else:
        credential = Credential("none", "none configured")
    return Upstream(
        upstream_name(provider.id),
        api,
        upstream_base(provider),
        provider.source,
        credential,
        tuple(provider.headers.items()),
    )


def _login_credential(provider: Provider, user: UserConfig) -> Credential:
    login = provider.login or {}
    if user.auth_path is None:  # OPENCODE_AUTH_CONTENT: nothing to refresh or write back
        return Credential("OAuth login", user.auth_source, "bearer", str(login.get("access", "")))
    token = FileToken(
        user.auth_path,
        AuthJsonFormat(provider.id),
        REFRESHERS.get(provider.id),
        label=user.auth_source,
        login_hint=LOGIN_HINT,
    )
    return Credential("OAuth login", f"{user.auth_source} [{provider.id}]", "bearer", token)


def routed_overrides(host_env: Mapping[str, str], opts: AgentOptions) -> dict[str, Any]:
    """``provider.<id>`` for every routed provider of the user's config: its definition
    (for providers only the host's OPENCODE_CONFIG names) with the gateway as baseURL and a
    placeholder key. Inline config has the highest precedence opencode offers, above the
    project's opencode.json."""
    if not user_mode(opts):
        return {}
    try:
        user = read_user_config(host_env, host_home(host_env))
    except ConfigError:
        return {}
    cfg_providers = user.config.get("provider")
    defined = cfg_providers if isinstance(cfg_providers, dict) else {}
    out: dict[str, Any] = {}
    for provider in providers(user, host_env):
        url = opts.endpoints.get(upstream_name(provider.id))
        if url is None or provider.api is None:
            continue
        base = _json_dict(defined.get(provider.id))
        out[provider.id] = _routed(base, sdk_base(provider.api, url))
    return {"provider": out} if out else {}


def _routed(cfg: dict[str, Any], base_url: str) -> dict[str, Any]:
    options = {k: v for k, v in _json_dict(cfg.get("options")).items() if k not in SECRET_OPTIONS}
    return {
        **_without_model_headers(cfg),
        "options": {**options, "baseURL": base_url, "apiKey": PLACEHOLDER},
    }


def _without_model_headers(cfg: dict[str, Any]) -> dict[str, Any]:
    """A model's own ``headers`` may hold a credential too: they stay on the host."""
    models = cfg.get("models")
    if not isinstance(models, dict):
        return cfg
    clean = {
        name: {k: v for k, v in m.items() if k != "headers"} if isinstance(m, dict) else m
        for name, m in models.items()
    }
    return {**cfg, "models": clean}


SECRET_OPTIONS = frozenset({"apiKey", "headers", "baseURL"})


def sanitized(config: dict[str, Any], opts: AgentOptions) -> dict[str, Any]:
    """``config`` with no provider credential: keys become placeholders, headers go;
    routed providers' baseURL is the gateway."""
    if "mcp" in config:  # MCP servers' headers, environment, tokens in their commands
        config = {**config, "mcp": scrub.scrub_json(config["mcp"], key="mcp")}
    cfg_providers = config.get("provider")
    if not isinstance(cfg_providers, dict):
        return config
    out: dict[str, Any] = {}
    for pid, cfg in cfg_providers.items():
        cfg = _json_dict(cfg)  # noqa: PLW2901
        options = _json_dict(cfg.get("options"))
        url = opts.endpoints.get(upstream_name(pid))
        api = api_of(cfg, pid)
        if url is not None and api is not None:
            out[pid] = _routed(cfg, sdk_base(api, url))
            continue
        kept = {k: v for k, v in options.items() if k not in ("apiKey", "headers")}
        if "apiKey" in options:
            kept["apiKey"] = PLACEHOLDER
        cfg = _without_model_headers(cfg)  # noqa: PLW2901
        out[pid] = {**cfg, "options": kept} if "options" in cfg else cfg
    return {**config, "provider": out}


def _raw_user_config(config: Path) -> dict[str, Any]:
    """The user's config files merged as written (``{env:…}`` left for opencode inside,
    where credential variables are placeholders)."""
    merged: dict[str, Any] = {}
    for name in ("config.json", "opencode.json", "opencode.jsonc"):
        path = config / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            merged = merge(merged, parse_jsonc(path.read_text(errors="replace"), name))
        except (ConfigError, OSError):
            continue
    return merged


def _home_env(home: Path) -> Mapping[str, str]:
    """The variables that relocate opencode's files (XDG_*, OPENCODE_AUTH_CONTENT) apply
    to the running user's home only."""
    return os.environ if home == Path.home() else {}


def _json_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _json_object(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}  # opencode itself would reject it; ours must still apply
    return value if isinstance(value, dict) else {}


# --- output parsing -----------------------------------------------------------------------

KINDS = frozenset({"step_start", "text", "reasoning", "tool_use", "step_finish", "error"})
FILE_TOOLS = frozenset({"write", "edit", "multiedit", "patch", "apply_patch"})
_PATH_KEYS = ("filePath", "file_path", "path")
_PATCH_HEADERS = ("*** Add File: ", "*** Update File: ", "*** Delete File: ", "*** Move to: ")


class OpencodeJsonParser:
    """Turns ``opencode run --format json`` lines into :mod:`sono.events`; never raises."""

    def __init__(self) -> None:
        self._session = ""
        self._steps = 0
        self._last_text = ""
        self._failed = False

    def feed(self, line: str) -> list[Event]:
        return parse_line(line, self._dispatch)

    def _dispatch(self, obj: dict[str, Any]) -> list[Event] | None:
        kind = obj.get("type")
        if kind not in KINDS:
            return None
        part = _dict(obj.get("part"))
        events = self._session_start(obj)
        if kind == "step_start":
            self._steps += 1
        elif kind == "text":
            events += self._text(part)
        elif kind == "reasoning":
            events += [Thinking(text=_str(part.get("text")))]
        elif kind == "tool_use":
            events += _tool(part)
        elif kind == "step_finish":
            events += self._step_finish(part)
        elif kind == "error":
            self._failed = True
            events += [Error(message=_error_message(obj.get("error")))]
        return events

    def _session_start(self, obj: dict[str, Any]) -> list[Event]:
        """opencode prints no session banner: the first line naming a session starts it."""
        session = _str(obj.get("sessionID"))
        if not session or self._session:
            return []
        self._session = session
        return [SessionStarted(session_id=session)]

    def _text(self, part: dict[str, Any]) -> list[Event]:
        text = _str(part.get("text"))
        if text.strip():
            self._last_text = text
        return [Text(text=text)] if text else []

    def _step_finish(self, part: dict[str, Any]) -> list[Event]:
        tokens = _dict(part.get("tokens"))
        cache = _dict(tokens.get("cache"))
        events: list[Event] = [
            Usage(
                # Cache writes are billed as fresh input, reasoning as output.
                input_tokens=_int(tokens.get("input")) + _int(cache.get("write")),
                output_tokens=_int(tokens.get("output")) + _int(tokens.get("reasoning")),
                cached_tokens=_int(cache.get("read")),
                cost_usd=_num(part.get("cost")),
            )
        ]
        reason = _str(part.get("reason"))
        if reason in ("tool-calls", "tool_calls", ""):
            return events  # the agent loop goes on with another step
        ok = reason == "stop" and not self._failed
        return [*events, Result(ok=ok, text=self._last_text, num_turns=self._steps)]


def _tool(part: dict[str, Any]) -> list[Event]:
    name = _str(part.get("tool"))
    call_id = _str(part.get("callID")) or _str(part.get("id"))
    state = _dict(part.get("state"))
    tool_input = state.get("input")
    events: list[Event] = [ToolCall(name=name, summary=_summary(tool_input), call_id=call_id)]
    metadata = _dict(state.get("metadata"))
    if name in FILE_TOOLS and isinstance(tool_input, dict):
        events += [FileChanged(path=p) for p in _changed_paths(tool_input, metadata)]
    status = _str(state.get("status"))
    if status in ("completed", "error"):
        exit_code = metadata.get("exit")
        failed = status == "error" or (isinstance(exit_code, int) and exit_code != 0)
        detail = state.get("error") if status == "error" else state.get("output")
        events.append(ToolResult(call_id=call_id, ok=not failed, summary=summarize(detail or "")))
    return events


def _summary(tool_input: object) -> str:
    """opencode names paths ``filePath``, which the generic summary does not know."""
    if isinstance(tool_input, dict) and isinstance(tool_input.get("filePath"), str):
        return summarize(tool_input["filePath"])
    return summarize(tool_input if tool_input is not None else "")


def _changed_paths(tool_input: dict[str, Any], metadata: dict[str, Any]) -> list[str]:
    """write/edit name ``filePath``; apply_patch lists absolute paths in its metadata,
    else (failed or older versions) the patch's own file headers say which files."""
    paths = [p for p in (tool_input.get(k) for k in _PATH_KEYS) if isinstance(p, str) and p]
    files = metadata.get("files")
    if isinstance(files, list):
        paths += [f["filePath"] for f in files if isinstance(f, dict) and _str(f.get("filePath"))]
    patch = tool_input.get("patchText")
    if isinstance(patch, str) and not paths:
        for line in patch.splitlines():
            header = next((h for h in _PATCH_HEADERS if line.startswith(h)), None)
            if header and line[len(header) :].strip():
                paths.append(line[len(header) :].strip())
    return list(dict.fromkeys(paths))


def _error_message(error: object) -> str:
    if not isinstance(error, dict):
        return summarize(error) if error is not None else "unknown error"
    message = _str(_dict(error.get("data")).get("message")) or _str(error.get("message"))
    name = _str(error.get("name"))
    if message:
        return f"{name}: {message}" if name else message
    return name or summarize(error)
