"""opencode's own configuration, read on the host the way opencode 1.18.33 reads it.

Config (``Config.loadInstanceState``), deep-merged in this order:
``$XDG_CONFIG_HOME/opencode/`` (``~/.config/opencode``) ``config.json`` < ``opencode.json``
< ``opencode.jsonc``, the ``OPENCODE_CONFIG`` file, the project's files (agent-writable:
never used on the host), ``$OPENCODE_CONFIG_DIR/opencode.json(c)``,
``OPENCODE_CONFIG_CONTENT``. Each text gets ``{env:VAR}`` (empty when unset) and
``{file:path}`` (relative to the file, ``~/`` = home, trimmed; not on ``//`` comment
lines) substituted before it is parsed as JSONC (``config/variable.ts``).

Logins: ``$XDG_DATA_HOME/opencode/auth.json`` (``~/.local/share/opencode``), or
``OPENCODE_AUTH_CONTENT`` instead of the file (``auth/index.ts``): per provider id
``{"type": "api", "key"}`` or ``{"type": "oauth", "refresh", "access", "expires" (ms)}``;
``{"type": "wellknown", "key", "token"}`` keys a remote config by URL.

A provider's endpoint is its ``options.baseURL`` or the vendor's default; its key is
``options.apiKey``, else the login in auth.json, else the vendor's environment variable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sono.net.oauth import Refresher, Tokens, tokens_of
from sono.net.upstream import ApiKind, AuthHeader

CONFIG_FILES = ("config.json", "opencode.json", "opencode.jsonc")
PROJECT_FILES = ("opencode.json", "opencode.jsonc")
MAX_FILE = 1 << 20

# The SDK package of a provider → the model API it speaks (what the gateway forwards).
NPM_API: dict[str, ApiKind] = {
    "@ai-sdk/anthropic": "anthropic",
    "@ai-sdk/openai": "openai",
    "@ai-sdk/openai-compatible": "openai",
    "@openrouter/ai-sdk-provider": "openai",
    "@ai-sdk/groq": "openai",
    "@ai-sdk/xai": "openai",
    "@ai-sdk/deepseek": "openai",
    "@ai-sdk/mistral": "openai",
}


@dataclass(frozen=True)
class BuiltIn:
    """A provider opencode knows without config: its entry in the models.dev snapshot
    opencode 1.18.33 ships (``npm``, ``api`` or the SDK's default, ``env``)."""

    npm: str
    base_url: str  # the SDK's base URL (anthropic's with /v1, as @ai-sdk/anthropic has it)
    env: tuple[str, ...]


BUILT_INS: dict[str, BuiltIn] = {
    "anthropic": BuiltIn(
        "@ai-sdk/anthropic", "https://api.anthropic.com/v1", ("ANTHROPIC_API_KEY",)
    ),
    "openai": BuiltIn("@ai-sdk/openai", "https://api.openai.com/v1", ("OPENAI_API_KEY",)),
    "openrouter": BuiltIn(
        "@openrouter/ai-sdk-provider", "https://openrouter.ai/api/v1", ("OPENROUTER_API_KEY",)
    ),
    "groq": BuiltIn("@ai-sdk/groq", "https://api.groq.com/openai/v1", ("GROQ_API_KEY",)),
    "xai": BuiltIn("@ai-sdk/xai", "https://api.x.ai/v1", ("XAI_API_KEY",)),
    "deepseek": BuiltIn(
        "@ai-sdk/openai-compatible", "https://api.deepseek.com", ("DEEPSEEK_API_KEY",)
    ),
    "poe": BuiltIn("@ai-sdk/openai-compatible", "https://api.poe.com/v1", ("POE_API_KEY",)),
    "opencode": BuiltIn(
        "@ai-sdk/openai-compatible", "https://opencode.ai/zen/v1", ("OPENCODE_API_KEY",)
    ),
    "mistral": BuiltIn("@ai-sdk/mistral", "https://api.mistral.ai/v1", ("MISTRAL_API_KEY",)),
    "google": BuiltIn(
        "@ai-sdk/google",
        "https://generativelanguage.googleapis.com/v1beta",
        ("GOOGLE_API_KEY", "GOOGLE_GENERATIVE_AI_API_KEY", "GEMINI_API_KEY"),
    ),
}
# Refresh endpoints of the OAuth logins the gateway refreshes on the host.
REFRESHERS: dict[str, Refresher] = {
    # opencode-anthropic-auth (index.mjs, the plugin behind "Claude Pro/Max" logins).
    "anthropic": Refresher(
        "https://console.anthropic.com/v1/oauth/token",
        lambda refresh: {
            "grant_type": "refresh_token",
            "refresh_token": refresh,
            "client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
        },
    ),
}
# Logins whose requests opencode's built-in plugin sends elsewhere than the provider's
# baseURL (opencode 1.18.33: the ChatGPT login goes to chatgpt.com/backend-api/codex).
UNROUTABLE_OAUTH = {"openai": "a ChatGPT login, which opencode sends to chatgpt.com itself"}
# Far in the future (ms), so opencode never refreshes a placeholder login inside.
FAR_EXPIRY_MS = 4_102_444_800_000  # 2100-01-01

_COMMENT_LINE = re.compile(r"^\s*//")


class ConfigError(Exception):
    """A config file opencode itself would reject; the message names it."""


@dataclass(frozen=True)
class Source:
    label: str  # "~/.config/opencode/opencode.json", "env OPENCODE_CONFIG_CONTENT"
    text: str
    base_dir: Path  # where {file:relative} is resolved


@dataclass
class Provider:
    """One provider as opencode would assemble it (host-only: holds credentials)."""

    id: str
    npm: str | None
    base_url: str | None
    source: str  # where the endpoint comes from
    key: str | None = field(default=None, repr=False)
    key_source: str = ""
    login: dict[str, Any] | None = field(default=None, repr=False)  # auth.json entry
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    configured: bool = False  # named in the user's config (not only a login or env key)

    @property
    def api(self) -> ApiKind | None:
        return NPM_API.get(self.npm or "")


@dataclass
class UserConfig:
    config: dict[str, Any]
    provider_sources: dict[str, str]  # provider id -> the source that named it last
    auth: dict[str, Any]
    auth_source: str
    auth_path: Path | None
    unset: tuple[tuple[str, str], ...] = ()  # ({env:VAR} left empty, the file naming it)


# --- files ---------------------------------------------------------------------------------


def config_dir(host_env: Mapping[str, str], home: Path) -> Path:
    xdg = host_env.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else home / ".config") / "opencode"


def data_dir(host_env: Mapping[str, str], home: Path) -> Path:
    xdg = host_env.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else home / ".local" / "share") / "opencode"


def tilde(path: Path, home: Path) -> str:
    try:
        return f"~/{path.relative_to(home)}"
    except ValueError:
        return str(path)


def _read(path: Path) -> str | None:
    try:
        if not path.is_file():
            return None
        with path.open("rb") as fh:
            return fh.read(MAX_FILE).decode("utf-8", "replace")
    except OSError:
        return None


def sources(host_env: Mapping[str, str], home: Path) -> Iterator[Source]:
    """The user's config texts, lowest precedence first (the project's are not among them)."""
    cdir = config_dir(host_env, home)
    for name in CONFIG_FILES:
        text = _read(cdir / name)
        if text is not None:
            yield Source(tilde(cdir / name, home), text, cdir)
    custom = host_env.get("OPENCODE_CONFIG")
    if custom:
        path = Path(custom).expanduser()
        text = _read(path)
        if text is not None:
            yield Source(f"{tilde(path, home)} (OPENCODE_CONFIG)", text, path.parent)
    custom_dir = host_env.get("OPENCODE_CONFIG_DIR")
    if custom_dir:  # read after the project's files, as a directory of its own
        folder = Path(custom_dir).expanduser()
        for name in PROJECT_FILES:
            text = _read(folder / name)
            if text is not None:
                yield Source(f"{tilde(folder / name, home)} (OPENCODE_CONFIG_DIR)", text, folder)
    inline = host_env.get("OPENCODE_CONFIG_CONTENT")
    if inline:
        yield Source("env OPENCODE_CONFIG_CONTENT", inline, Path.cwd())


def substitute(text: str, env: Mapping[str, str], base_dir: Path, home: Path) -> str:
    """``{env:VAR}`` and ``{file:path}`` as opencode's ``ConfigVariable.substitute`` does
    (values JSON-escaped, as they land inside JSON strings)."""

    def escape(value: str) -> str:
        return json.dumps(value)[1:-1]

    text = re.sub(r"\{env:([^}]+)\}", lambda m: escape(env.get(m.group(1), "")), text)
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        if _COMMENT_LINE.match(line):
            out.append(line)
            continue
        out.append(
            re.sub(r"\{file:[^}]+\}", lambda m: escape(_file(m.group(0), base_dir, home)), line)
        )
    return "".join(out)


def _file(token: str, base_dir: Path, home: Path) -> str:
    ref = token[len("{file:") : -1]
    path = home / ref[2:] if ref.startswith("~/") else base_dir / ref
    text = _read(path)
    if text is None:
        raise ConfigError(f'bad file reference: "{token}" ({path} does not exist)')
    return text.strip()


def parse_jsonc(text: str, label: str) -> dict[str, Any]:
    """JSON with comments and trailing commas, as opencode's parser accepts it."""
    try:
        value = json.loads(_strip_jsonc(text))
    except ValueError as exc:
        raise ConfigError(f"{label}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{label}: not a JSON object")
    return value


def _strip_jsonc(text: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(c)
            i += 1
    return re.sub(r",(\s*[}\]])", r"\1", "".join(out))


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of JSON objects; ``override`` wins (opencode's ``mergeDeep``)."""
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        out[key] = merge(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def read_user_config(host_env: Mapping[str, str], home: Path) -> UserConfig:
    config: dict[str, Any] = {}
    named: dict[str, str] = {}
    unset: dict[str, str] = {}
    for src in sources(host_env, home):
        for var in re.findall(r"\{env:([^}]+)\}", src.text):
            if not host_env.get(var):
                unset.setdefault(var, src.label)
        data = parse_jsonc(substitute(src.text, host_env, src.base_dir, home), src.label)
        for pid in _dict(data.get("provider")):
            named[pid] = src.label
        config = merge(config, data)
    auth, auth_source, auth_path = read_auth(host_env, home)
    return UserConfig(config, named, auth, auth_source, auth_path, tuple(unset.items()))


def read_auth(host_env: Mapping[str, str], home: Path) -> tuple[dict[str, Any], str, Path | None]:
    inline = host_env.get("OPENCODE_AUTH_CONTENT")
    if inline:
        try:
            value = json.loads(inline)
        except ValueError:
            value = None  # opencode falls back to the file
        if isinstance(value, dict):
            return value, "env OPENCODE_AUTH_CONTENT", None
    path = data_dir(host_env, home) / "auth.json"
    text = _read(path)
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        value = {}
    return (value if isinstance(value, dict) else {}), tilde(path, home), path


# --- providers -----------------------------------------------------------------------------


def providers(user: UserConfig, host_env: Mapping[str, str]) -> list[Provider]:
    """Every provider the user set up: in the config, with a login, or by a vendor key."""
    cfg_providers = _dict(user.config.get("provider"))
    model_provider = chosen_provider(user.config)
    ids = list(cfg_providers)
    ids += [p for p in user.auth if p not in ids and _login_type(user.auth[p]) in LOGIN_TYPES]
    ids += [p for p, b in BUILT_INS.items() if p not in ids and any(host_env.get(v) for v in b.env)]
    if model_provider and model_provider not in ids:
        ids.append(model_provider)
    return [_provider(pid, user, host_env) for pid in ids]


def _provider(pid: str, user: UserConfig, host_env: Mapping[str, str]) -> Provider:
    cfg = _dict(_dict(user.config.get("provider")).get(pid))
    options = _dict(cfg.get("options"))
    builtin = BUILT_INS.get(pid)
    npm = _str(cfg.get("npm")) or (builtin.npm if builtin else None)
    label = user.provider_sources.get(pid, "")
    base = _str(options.get("baseURL"))
    source = f"{label} provider.{pid}.options.baseURL" if base else "built-in default"
    provider = Provider(
        pid,
        npm,
        base or (builtin.base_url if builtin else None),
        source,
        configured=pid in user.provider_sources,
        headers={k: v for k, v in _dict(options.get("headers")).items() if isinstance(v, str)},
    )
    login = user.auth.get(pid)
    key = _str(options.get("apiKey"))
    if key:
        provider.key, provider.key_source = key, f"{label} provider.{pid}.options.apiKey"
    elif isinstance(login, dict) and login.get("type") == "api":
        provider.key, provider.key_source = _str(login.get("key")), user.auth_source
    elif isinstance(login, dict) and login.get("type") == "oauth":
        provider.login = login
    else:
        env_vars = builtin.env if builtin else _env_vars(cfg)
        var = next((v for v in env_vars if host_env.get(v)), None)
        if var:
            provider.key, provider.key_source = host_env[var], f"env {var}"
    return provider


LOGIN_TYPES = frozenset({"api", "oauth"})  # "wellknown" keys a remote config, not a provider


def _login_type(entry: object) -> str | None:
    return _str(entry.get("type")) if isinstance(entry, dict) else None


def wellknown_notes(auth: Mapping[str, Any]) -> list[str]:
    return [
        f"opencode: the login to {url} (remote config) is not taken inside: opencode would "
        "fetch that config over the network at start; put what it provides in "
        "~/.config/opencode/opencode.json"
        for url, entry in auth.items()
        if _login_type(entry) == "wellknown"
    ]


def _env_vars(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    env = cfg.get("env")
    return tuple(v for v in env if isinstance(v, str)) if isinstance(env, list) else ()


def api_of(cfg: Mapping[str, Any], provider_id: str) -> ApiKind | None:
    """The API a provider's config entry speaks (its npm, or the built-in's)."""
    npm = cfg.get("npm")
    if not isinstance(npm, str):
        npm = BUILT_INS[provider_id].npm if provider_id in BUILT_INS else ""
    return NPM_API.get(npm)


def chosen_provider(config: Mapping[str, Any]) -> str | None:
    model = _str(config.get("model"))
    return model.partition("/")[0] if model and "/" in model else None


def upstream_name(provider_id: str) -> str:
    """``opencode-<id>``, reduced to what a gateway route may be called."""
    clean = re.sub(r"[^a-z0-9_-]+", "-", provider_id.lower()).strip("-_") or "provider"
    return f"opencode-{clean}"[:63]


def auth_header(provider: Provider) -> AuthHeader:
    if provider.login is not None:
        return "bearer"
    return "x-api-key" if provider.api == "anthropic" else "bearer"


def upstream_base(provider: Provider) -> str:
    """The gateway's base for the provider: an Anthropic base without the SDK's ``/v1``
    (the gateway's anthropic paths carry it)."""
    base = (provider.base_url or "").rstrip("/")
    if provider.api == "anthropic" and base.endswith("/v1"):
        return base[: -len("/v1")]
    return base


def sdk_base(api: ApiKind, gateway_url: str) -> str:
    """The ``options.baseURL`` inside for a gateway route of kind ``api``."""
    base = gateway_url.rstrip("/")
    return base + "/v1" if api == "anthropic" else base


# --- logins --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuthJsonFormat:
    """One provider's OAuth entry in opencode's auth.json (``expires`` in milliseconds)."""

    provider_id: str

    def read(self, data: Mapping[str, Any]) -> Tokens | None:
        entry = data.get(self.provider_id)
        if not isinstance(entry, dict) or entry.get("type") != "oauth":
            return None
        return tokens_of(entry.get("access"), entry.get("refresh"), entry.get("expires"))

    def write(self, data: Mapping[str, Any], tokens: Tokens) -> dict[str, Any]:
        out = dict(data)
        entry = dict(_dict(out.get(self.provider_id)))
        entry["access"] = tokens.access
        if tokens.refresh:
            entry["refresh"] = tokens.refresh
        if tokens.expires_at is not None:
            entry["expires"] = int(tokens.expires_at * 1000)
        out[self.provider_id] = entry
        return out


def placeholder_auth(auth: Mapping[str, Any], placeholder: str) -> dict[str, Any]:
    """auth.json with every credential a placeholder of the same shape: API keys and
    OAuth tokens (far expiry, so opencode never refreshes inside). Well-known logins are
    left out: with one, opencode fetches a remote config at start, which cannot succeed
    inside."""
    out: dict[str, Any] = {}
    for pid, entry in auth.items():
        if not isinstance(entry, dict):
            continue
        kind = entry.get("type")
        if kind == "api":
            out[pid] = {"type": "api", "key": placeholder}
        elif kind == "oauth":
            out[pid] = {
                "type": "oauth",
                "refresh": placeholder,
                "access": placeholder,
                "expires": FAR_EXPIRY_MS,
            }
    return out


# --- the project's own config (agent-writable) ------------------------------------------------


def project_endpoint_notes(start: Path) -> list[str]:
    """A note per provider endpoint or key the project's opencode.json names: opencode
    reads it inside, but it is the agent's to write, so it never picks an upstream."""
    notes: list[str] = []
    for path in _project_files(start):
        try:
            data = parse_jsonc(_read(path) or "{}", str(path))
        except ConfigError:
            continue
        for pid, cfg in _dict(data.get("provider")).items():
            options = _dict(_dict(cfg).get("options"))
            named = [k for k in ("baseURL", "apiKey", "headers") if k in options]
            if named:
                notes.append(
                    f"opencode: {path.name} provider {pid!r} sets {', '.join(named)}: not used "
                    "(the project is the agent's to edit); "
                    "put it in ~/.config/opencode/opencode.json"
                )
    return notes


def _project_files(start: Path) -> Iterator[Path]:
    here = start.resolve()
    for folder in (here, *here.parents):
        for name in PROJECT_FILES:
            for path in (folder / name, folder / ".opencode" / name):
                if path.is_file():
                    yield path
        if (folder / ".git").exists():
            return


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def host_home(host_env: Mapping[str, str]) -> Path:
    return Path(host_env.get("HOME") or Path.home())
