"""pi's own configuration, read on the host the way pi 1.6.0 reads it, and its sandbox copy.

pi keeps everything in its agent directory (``$PI_CODING_AGENT_DIR``, else ``~/.pi/agent``,
``dist/config.js getAgentDir``):

- ``models.json`` ``providers.<id>``: ``baseUrl``, ``api`` (provider or model level),
  ``apiKey`` and ``headers`` values that are a literal, ``$NAME``/``${NAME}``
  interpolation or a ``!command`` (``dist/core/resolve-config-value.js``), ``authHeader``
  (send the key as ``Authorization: Bearer``). A built-in id (``anthropic``) changes that
  provider; any other id adds one.
- ``auth.json`` ``<id>``: ``{"type":"api_key","key","env"?}`` (``key`` resolves like
  ``apiKey``, with ``env`` first) or ``{"type":"oauth","access","refresh","expires"}``
  (``expires`` in epoch milliseconds; ``dist/core/auth-storage.js``).
- the provider's environment variables (``pi-ai/dist/env-api-keys.js``).

A stored ``auth.json`` credential wins over ``models.json`` ``apiKey``, which wins over the
environment (``docs/models.md`` "Authenticate"). ``settings.json`` ``defaultProvider``
says which provider a run starts with.

Each provider that speaks a model API the gateway forwards (Anthropic Messages, OpenAI
Responses or Chat Completions, ChatGPT's Codex Responses) becomes an :class:`Upstream`
named after it. The sandbox gets the same files with every ``baseUrl`` pointing at the
gateway, every key and token a placeholder of the same shape, and no ``headers``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sono import proc
from sono.errors import SoError
from sono.net.oauth import FileToken, Refresher, Tokens, tokens_of
from sono.net.upstream import (
    NAME_RE,
    NO_CREDENTIAL,
    PLACEHOLDER,
    ApiKind,
    AuthHeader,
    Credential,
    CredentialError,
    Upstream,
)

AGENT_DIR_VAR = "PI_CODING_AGENT_DIR"
MAX_FILE = 1 << 20
KEY_COMMAND_TIMEOUT_S = 10.0  # pi's own timeout for a "!command" key

# pi's model APIs the gateway can carry, by the API family it forwards.
API_KINDS: dict[str, ApiKind] = {
    "anthropic-messages": "anthropic",
    "openai-completions": "openai",
    "openai-responses": "openai",
    "openai-codex-responses": "openai",
}


@dataclass(frozen=True)
class Builtin:
    """A built-in pi provider ``so`` can route: its API, default base URL (what the
    gateway forwards to) and the environment variables pi takes its key from."""

    api: str
    base_url: str
    env_keys: tuple[tuple[str, AuthHeader], ...] = ()


# From pi-ai/dist/providers/{anthropic,openai,openai-codex}.js and env-api-keys.js. The
# Anthropic order is pi's resolve order: ANTHROPIC_AUTH_TOKEN as a bearer token first,
# then ANTHROPIC_OAUTH_TOKEN and ANTHROPIC_API_KEY as the SDK's key.
BUILTINS: dict[str, Builtin] = {
    "anthropic": Builtin(
        "anthropic-messages",
        "https://api.anthropic.com",
        (
            ("ANTHROPIC_AUTH_TOKEN", "bearer"),
            ("ANTHROPIC_OAUTH_TOKEN", "x-api-key"),
            ("ANTHROPIC_API_KEY", "x-api-key"),
        ),
    ),
    "openai": Builtin(
        "openai-responses", "https://api.openai.com/v1", (("OPENAI_API_KEY", "bearer"),)
    ),
    # pi posts to <baseUrl>/codex/responses; the route ends in /codex (see route_name).
    "openai-codex": Builtin("openai-codex-responses", "https://chatgpt.com/backend-api/codex"),
}

# An Anthropic key holding this is an OAuth token: pi sends it as a bearer token with
# Claude Code's headers (pi-ai/dist/api/anthropic-messages.js isOAuthToken).
ANTHROPIC_OAUTH_MARK = "sk-ant-oat"
CODEX_CLAIM = "https://api.openai.com/auth"  # the JWT claim holding chatgpt_account_id
FAR_EXPIRY_MS = 4_102_444_800_000  # 2100-01-01: pi never refreshes the placeholder login
PLACEHOLDER_ACCOUNT = "so-placeholder-account"


def route_name(provider: str) -> str:
    """The gateway route (upstream name) for a pi provider id. ``openai-codex`` is
    ``codex``: pi appends ``/responses`` to a base URL ending in ``/codex`` and
    ``/codex/responses`` to any other, and the gateway forwards ``/responses`` only."""
    if provider == "openai-codex":
        return "codex"
    if NAME_RE.fullmatch(provider) and provider != "codex":
        return provider
    return "pi-" + (re.sub(r"[^a-z0-9_-]+", "-", provider.lower()).strip("-_") or "provider")[:59]


def agent_dir(host_env: Mapping[str, str], host_home: Path) -> Path:
    configured = host_env.get(AGENT_DIR_VAR)
    if not configured:
        return host_home / ".pi" / "agent"
    if configured == "~" or configured.startswith("~/"):
        return host_home / configured[2:]
    return Path(configured)


def shown(path: Path, host_home: Path) -> str:
    """``~/.pi/agent/models.json`` rather than the full host path, for messages."""
    try:
        return "~/" + str(path.relative_to(host_home))
    except ValueError:
        return str(path)


def read_user_json(path: Path, label: str) -> dict[str, Any]:
    """One of the user's own pi files: missing → empty; there but not a JSON object →
    an error that says so (pi would run without it, or refuse with less to go on)."""
    try:
        with path.open("rb") as fh:
            data = json.loads(fh.read(MAX_FILE).decode("utf-8-sig"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise SoError(f"pi: {label} cannot be read ({exc}); fix it") from None
    except ValueError as exc:
        raise SoError(f"pi: {label} is not valid JSON ({exc}); fix it") from None
    if not isinstance(data, dict):
        raise SoError(f"pi: {label} is not a JSON object; fix it")
    return data


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; missing or unreadable → empty (pi reports those itself)."""
    try:
        with path.open("rb") as fh:
            data = json.loads(fh.read(MAX_FILE).decode("utf-8-sig"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


# --- resolving config values like pi -------------------------------------------------


_ENV_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*)|([$!]))")


def interpolate(value: str, env: Mapping[str, str]) -> str | None:
    """pi's template: ``$NAME``/``${NAME}`` from ``env``, ``$$``/``$!`` literal; None when
    a named variable is unset or empty (pi then has no value)."""
    missing = False

    def sub(match: re.Match[str]) -> str:
        nonlocal missing
        literal = match.group(3)
        if literal:
            return literal
        found = env.get(match.group(1) or match.group(2) or "")
        if not found:
            missing = True
        return found or ""

    out = _ENV_REF.sub(sub, value)
    return None if missing else out


class KeyCommand:
    """A ``!command`` key from the user's own pi config, run on the host when the gateway
    first needs it and kept for the session, as pi caches it for its process."""

    def __init__(self, command: str, label: str) -> None:
        self.command = command
        self.label = label
        self._lock = threading.Lock()
        self._value: str | None = None

    def token(self) -> str:
        with self._lock:
            if self._value is None:
                self._value = self._run()
            return self._value

    def _run(self) -> str:
        try:
            result = proc.run(
                ["sh", "-c", self.command], check=False, timeout=KEY_COMMAND_TIMEOUT_S
            )
        except SoError as exc:
            raise CredentialError(f"{self.label}: the key command failed: {exc}") from None
        value = result.stdout.strip()
        if result.returncode != 0 or not value:
            why = f"exited {result.returncode}" if result.returncode else "printed nothing"
            raise CredentialError(f"{self.label}: the key command {why}; fix it or the key")
        return value


def resolve_value(raw: str, env: Mapping[str, str], label: str) -> str | KeyCommand | None:
    if raw.startswith("!"):
        return KeyCommand(raw[1:], label)
    return interpolate(raw, env)


# --- OAuth logins in auth.json --------------------------------------------------------


class PiLogin:
    """``auth.json``'s entry for one provider as a :class:`sono.net.oauth.TokenFormat`.
    ``expires`` is epoch milliseconds; pi stores it ``margin_ms`` early."""

    def __init__(self, provider: str, margin_ms: int = 0) -> None:
        self.provider = provider
        self.margin_ms = margin_ms

    def read(self, data: Mapping[str, Any]) -> Tokens | None:
        entry = _dict(data.get(self.provider))
        if entry.get("type") != "oauth":
            return None
        expires = entry.get("expires")
        if isinstance(expires, int | float):
            expires += self.margin_ms
        return tokens_of(entry.get("access"), entry.get("refresh"), expires)

    def write(self, data: Mapping[str, Any], tokens: Tokens) -> dict[str, Any]:
        entry = dict(_dict(data.get(self.provider)))
        entry.update(type="oauth", access=tokens.access, refresh=tokens.refresh or "")
        if tokens.expires_at is not None:
            entry["expires"] = int(tokens.expires_at * 1000) - self.margin_ms
        if self.provider == "openai-codex":
            account = codex_account(tokens.access)
            if account:
                entry["accountId"] = account
        return {**data, self.provider: entry}


# pi-ai/dist/auth/oauth/anthropic.js: TOKEN_URL, CLIENT_ID (base64 in the source), JSON
# body; it stores the expiry five minutes early.
ANTHROPIC_REFRESH = Refresher(
    "https://platform.claude.com/v1/oauth/token",
    lambda refresh: {
        "grant_type": "refresh_token",
        "client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
        "refresh_token": refresh,
    },
)
# pi-ai/dist/auth/oauth/openai-codex.js: TOKEN_URL, CLIENT_ID, form-encoded body.
CODEX_REFRESH = Refresher(
    "https://auth.openai.com/oauth/token",
    lambda refresh: {
        "grant_type": "refresh_token",
        "refresh_token": refresh,
        "client_id": "app_EMoamEEZ73f0CkXaXp7hrann",
    },
    form=True,
)


def chatgpt_refresh(client_id: str) -> Refresher:
    """pi-ai/dist/auth/oauth/openai-chatgpt.js (Sign in with ChatGPT on the ``openai``
    provider): the client id is the one issued at login, stored in the entry."""
    return Refresher(
        "https://auth.openai.com/api/accounts/oauth/token",
        lambda refresh: {
            "grant_type": "refresh_token",
            "client_id": client_id,
            "refresh_token": refresh,
            "resource": "https://api.openai.com/v1",
        },
        form=True,
    )


# Provider -> (how to refresh its login given the auth.json entry, the expiry margin pi
# subtracts when it stores ``expires``).
OAUTH: dict[str, tuple[Callable[[Mapping[str, Any]], Refresher], int]] = {
    "anthropic": (lambda entry: ANTHROPIC_REFRESH, 5 * 60 * 1000),
    "openai-codex": (lambda entry: CODEX_REFRESH, 0),
    "openai": (lambda entry: chatgpt_refresh(_str(entry.get("clientId"))), 3 * 60 * 1000),
}


def jwt_claims(token: str) -> dict[str, Any]:
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        return _dict(json.loads(payload))
    except (ValueError, UnicodeDecodeError):
        return {}


def codex_account(access: str) -> str:
    return _str(_dict(jwt_claims(access).get(CODEX_CLAIM)).get("chatgpt_account_id"))


def placeholder_jwt(claims: Mapping[str, Any]) -> str:
    def part(obj: Mapping[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.{part({'so': PLACEHOLDER})}"


def placeholder_access(provider: str) -> str:
    """An access token pi treats like the real one: an Anthropic OAuth token keeps its
    mark (pi sends it as a bearer token with Claude Code's headers); a ChatGPT one is a
    JWT (pi reads the account id from it)."""
    if provider == "anthropic":
        return f"{ANTHROPIC_OAUTH_MARK}01-{PLACEHOLDER}"
    if provider == "openai-codex":
        return placeholder_jwt(
            {CODEX_CLAIM: {"chatgpt_account_id": PLACEHOLDER_ACCOUNT}, "exp": FAR_EXPIRY_MS // 1000}
        )
    return PLACEHOLDER


# --- access: the upstreams pi would use -----------------------------------------------


@dataclass(frozen=True)
class PiConfig:
    """The agent directory's files, parsed."""

    root: Path
    models: dict[str, Any]
    auth: dict[str, Any]
    settings: dict[str, Any]

    @classmethod
    def load(cls, root: Path) -> PiConfig:
        def read(name: str) -> dict[str, Any]:
            return read_user_json(root / name, str(root / name))

        return cls(
            root,
            _dict(read("models.json").get("providers")),
            read("auth.json"),
            read("settings.json"),
        )

    def providers(self) -> Iterator[str]:
        """Every provider id the files or the environment could make usable, once."""
        seen: dict[str, None] = dict.fromkeys(self.models)
        seen.update(dict.fromkeys(p for p in self.auth if isinstance(p, str)))
        seen.update(dict.fromkeys(BUILTINS))
        default = _str(self.settings.get("defaultProvider"))
        if default:
            seen[default] = None
        return iter(seen)


def provider_api(provider: str, config: Mapping[str, Any]) -> str:
    models = [_dict(m) for m in config.get("models") or [] if isinstance(m, dict)]
    builtin = BUILTINS.get(provider)
    return (
        _str(config.get("api"))
        or next((_str(m.get("api")) for m in models if m.get("api")), "")
        or (builtin.api if builtin else "")
    )


def provider_base(provider: str, config: Mapping[str, Any]) -> str:
    models = [_dict(m) for m in config.get("models") or [] if isinstance(m, dict)]
    builtin = BUILTINS.get(provider)
    return (
        _str(config.get("baseUrl"))
        or next((_str(m.get("baseUrl")) for m in models if m.get("baseUrl")), "")
        or (builtin.base_url if builtin else "")
    )


@dataclass(frozen=True)
class Reader:
    """Reads one agent directory into upstreams; ``host_env`` is the real environment."""

    cfg: PiConfig
    host_env: Mapping[str, str]
    host_home: Path

    def where(self, name: str) -> str:
        return shown(self.cfg.root / name, self.host_home)

    def upstream(self, provider: str) -> Upstream | None:
        config = _dict(self.cfg.models.get(provider))
        kind = API_KINDS.get(provider_api(provider, config))
        base = provider_base(provider, config)
        if kind is None or not base:
            return None
        credential = self.credential(provider, kind, config)
        builtin = provider in BUILTINS
        if credential is None:
            if provider not in self.cfg.models:
                return None  # a built-in nobody logged in to: pi would not offer it
            credential = NO_CREDENTIAL
        if provider == "openai-codex" and not base.rstrip("/").endswith("/codex"):
            base = base.rstrip("/") + "/codex"  # what pi appends before /responses
        source = (
            f"{self.where('models.json')} [providers.{provider}]"
            if config.get("baseUrl") or not builtin
            else f"pi built-in provider {provider}"
        )
        headers = self.headers(provider, config)
        return Upstream(route_name(provider), kind, base, source, credential, headers)

    def credential(
        self, provider: str, kind: ApiKind, config: Mapping[str, Any]
    ) -> Credential | None:
        """pi's order: the stored auth.json credential, models.json apiKey, the env."""
        bearer = config.get("authHeader") is True or kind == "openai"
        stored = _dict(self.cfg.auth.get(provider))
        if stored.get("type") == "oauth":
            return self.oauth(provider)
        if stored.get("type") == "api_key" and _str(stored.get("key")):
            env = {**self.host_env, **{k: v for k, v in _dict(stored.get("env")).items() if v}}
            label = f"{self.where('auth.json')} [{provider}].key"
            return self.key(_str(stored["key"]), env, label, bearer)
        raw = _str(config.get("apiKey"))
        if raw:
            label = f"{self.where('models.json')} [providers.{provider}].apiKey"
            return self.key(raw, self.host_env, label, bearer)
        builtin = BUILTINS.get(provider)
        for var, style in builtin.env_keys if builtin else ():
            value = self.host_env.get(var)
            if value:
                header: AuthHeader = "bearer" if bearer or ANTHROPIC_OAUTH_MARK in value else style
                what = "auth token" if header == "bearer" and kind == "anthropic" else "API key"
                return Credential(what, f"env {var}", header, value)
        return None

    def key(self, raw: str, env: Mapping[str, str], label: str, bearer: bool) -> Credential | None:
        value = resolve_value(raw, env, label)
        if value is None:  # pi leaves the provider without a key too: say which variable
            names = [
                a or b for a, b, _ in _ENV_REF.findall(raw) if (a or b) and not env.get(a or b)
            ]
            unset = ", ".join(f"${n}" for n in names) or "a variable"
            return Credential("none", f"{label} names {unset}, which is not set", "none")
        if isinstance(value, KeyCommand):
            return Credential("key command", label, "bearer" if bearer else "x-api-key", value)
        header: AuthHeader = "bearer" if bearer or ANTHROPIC_OAUTH_MARK in value else "x-api-key"
        only = _ENV_REF.fullmatch(raw)
        name = (only.group(1) or only.group(2)) if only else None
        if name and env.get(name) != self.host_env.get(name):  # the entry's own "env"
            label = label.removesuffix(".key") + f".env.{name}"
        elif name:  # "$NAME": the value is the variable's
            label = f"env {name} (named in {label})"
        return Credential("API key", label, header, value)

    def oauth(self, provider: str) -> Credential | None:
        if provider not in OAUTH:
            return None
        refresher, margin = OAUTH[provider]
        label = self.where("auth.json")
        token = FileToken(
            self.cfg.root / "auth.json",
            PiLogin(provider, margin),
            refresher(_dict(self.cfg.auth.get(provider))),
            label=f"{label} [{provider}]",
            login_hint=f"run `pi` on the host and /login {provider}",
        )
        return Credential("OAuth login", f"{label} [{provider}]", "bearer", token)

    def headers(self, provider: str, config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        """models.json ``headers`` resolved on the host; ChatGPT's account id header."""
        out: list[tuple[str, str]] = []
        for name, raw in _dict(config.get("headers")).items():
            if not isinstance(raw, str):
                continue
            value = resolve_value(raw, self.host_env, f"header {name}")
            if isinstance(value, KeyCommand):
                try:
                    value = value.token()
                except CredentialError:
                    value = None
            if value:
                out.append((name, value))
        if provider == "openai-codex":
            account = self.codex_account()
            if account:
                out.append(("chatgpt-account-id", account))
        if _dict(config).get("api", "") == "anthropic-messages" or provider == "anthropic":
            # pi's Anthropic SDK sends ANTHROPIC_CUSTOM_HEADERS; inside it is dropped (it may
            # carry auth), so the gateway sends them.
            for line in self.host_env.get("ANTHROPIC_CUSTOM_HEADERS", "").splitlines():
                name, sep, value = line.partition(":")
                if sep and name.strip() and value.strip():
                    out.append((name.strip(), value.strip()))
        return tuple(out)

    def codex_account(self) -> str:
        entry = _dict(self.cfg.auth.get("openai-codex"))
        return _str(entry.get("accountId")) or codex_account(_str(entry.get("access")))


def read_upstreams(cfg: PiConfig, host_env: Mapping[str, str], host_home: Path) -> list[Upstream]:
    reader = Reader(cfg, host_env, host_home)
    found: list[Upstream] = []
    for provider in cfg.providers():
        upstream = reader.upstream(provider)
        # Two ids on one route (ids that sanitise alike): the first wins.
        if upstream is not None and all(u.name != upstream.name for u in found):
            found.append(upstream)
    default = _str(cfg.settings.get("defaultProvider"))
    # The provider pi starts with first: `so doctor` shows it at the top.
    found.sort(key=lambda u: u.name != route_name(default) if default else False)
    return found


def config_notes(cfg: PiConfig, host_home: Path, upstreams: list[Upstream]) -> list[str]:
    """What the user configured that will not work inside, each in one line."""
    routed = {u.name for u in upstreams}
    notes: list[str] = []
    for provider in cfg.providers():
        if route_name(provider) in routed:
            continue
        config = _dict(cfg.models.get(provider))
        where = (
            shown(cfg.root / "models.json", host_home)
            if provider in cfg.models
            else shown(cfg.root / "auth.json", host_home)
        )
        if provider not in cfg.models and provider not in cfg.auth:
            continue
        api = provider_api(provider, config) or "its own API"
        if api in API_KINDS:
            notes.append(f"pi: provider {provider!r} ({where}) has no key or login: not used")
            continue
        notes.append(
            f"pi: provider {provider!r} ({where}) speaks {api}, which so's model gateway "
            "cannot carry: it is not available inside; use an Anthropic- or "
            "OpenAI-compatible endpoint for it in models.json"
        )
    for provider, raw in cfg.models.items():
        bases = {_str(_dict(m).get("baseUrl")) for m in _dict(raw).get("models") or []}
        if route_name(provider) in routed and len(bases - {""}) > 1:
            notes.append(
                f"pi: provider {provider!r} gives its models different baseUrls; inside, all "
                "of them go to the provider's first one: use one provider per endpoint"
            )
    if _dict(cfg.auth.get("openai")).get("type") == "oauth" and "openai" in routed:
        notes.append(
            "pi: Sign in with ChatGPT on the openai provider: pi trims its requests for it "
            "only when it talks to api.openai.com itself, so through so some may be refused; "
            "an OpenAI API key or the openai-codex login (/login openai-codex) avoids that"
        )
    if not upstreams:
        notes.append(
            f"pi: no model provider with a key or login in {shown(cfg.root, host_home)} or "
            "the environment; run `pi` and /login, or add a provider to models.json"
        )
    return notes


def default_refusal(cfg: PiConfig, host_home: Path, upstreams: list[Upstream]) -> str | None:
    default = _str(cfg.settings.get("defaultProvider"))
    if not default or any(u.name == route_name(default) for u in upstreams):
        return None
    where = shown(cfg.root / "settings.json", host_home)
    api = provider_api(default, _dict(cfg.models.get(default))) or "its own API"
    if API_KINDS.get(api):
        return (
            f"pi: the default provider {default!r} ({where}) has no key or login; "
            f"run `pi` and /login {default}, or set its key"
        )
    return (
        f"pi: the default provider {default!r} ({where}) speaks {api}, which so's model "
        "gateway cannot carry; set defaultProvider to an Anthropic- or OpenAI-compatible "
        "provider (models.json) and run again"
    )


def project_notes(project: Path) -> list[str]:
    """The project's ``.pi`` is agent-writable: what it names is never used on the host."""
    notes: list[str] = []
    settings = read_json(project / ".pi" / "settings.json")
    named = [k for k in ("defaultProvider", "defaultModel") if settings.get(k)]
    if named:
        notes.append(
            f"pi: the project's .pi/settings.json sets {', '.join(named)}: not used to pick "
            "the model endpoint (the agent can write that file); set it in "
            "~/.pi/agent/settings.json or pass --model"
        )
    extensions = project / ".pi" / "extensions"
    if extensions.is_dir() and any(
        "registerProvider" in _head(p) for p in sorted(extensions.rglob("*"))[:50] if p.is_file()
    ):
        notes.append(
            "pi: an extension in the project's .pi/extensions registers a provider: not "
            "used on the host, and so's routing outranks it inside; register providers in "
            "~/.pi/agent"
        )
    for name in ("models.json", "auth.json"):
        if (project / ".pi" / name).exists():
            notes.append(
                f"pi: the project's .pi/{name} is not used (pi reads it only from its agent "
                f"directory, and the agent can write the project); put it in ~/.pi/agent/{name}"
            )
    return notes


def _head(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(MAX_FILE).decode(errors="replace")
    except OSError:
        return ""


# --- provision: the sandbox's copy ----------------------------------------------------


def sandbox_models(models: Mapping[str, Any], endpoints: Mapping[str, str]) -> dict[str, Any]:
    """models.json for the sandbox: each routed provider's ``baseUrl`` (and its models')
    is the gateway, every ``apiKey`` a placeholder, no ``headers`` anywhere."""
    out = dict(models)
    providers: dict[str, Any] = {}
    for provider, raw in _dict(models.get("providers")).items():
        config = dict(_dict(raw))
        endpoint = endpoints.get(route_name(provider))
        if endpoint and config.get("baseUrl"):
            config["baseUrl"] = endpoint
        if "apiKey" in config:
            config["apiKey"] = PLACEHOLDER
        config.pop("headers", None)
        config["models"] = [_sandbox_model(m, endpoint) for m in config.get("models") or []]
        if not config["models"]:
            del config["models"]
        overrides = {k: _without_headers(v) for k, v in _dict(config.get("modelOverrides")).items()}
        if overrides:
            config["modelOverrides"] = overrides
        providers[provider] = config
    if providers:
        out["providers"] = providers
    return out


def _sandbox_model(model: object, endpoint: str | None) -> object:
    entry = _without_headers(model)
    if isinstance(entry, dict) and endpoint and entry.get("baseUrl"):
        entry["baseUrl"] = endpoint
    return entry


def _without_headers(value: object) -> object:
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if k != "headers"}


def sandbox_auth(auth: Mapping[str, Any]) -> dict[str, Any]:
    """auth.json for the sandbox: the same entries, every key and token a placeholder;
    an OAuth login never expires there, so pi never tries to refresh it inside."""
    out: dict[str, Any] = {}
    for provider, raw in auth.items():
        entry = _dict(raw)
        if entry.get("type") == "oauth":
            out[provider] = {
                "type": "oauth",
                "access": placeholder_access(provider),
                "refresh": PLACEHOLDER,
                "expires": FAR_EXPIRY_MS,
            }
            if "accountId" in entry:
                out[provider]["accountId"] = PLACEHOLDER_ACCOUNT
        elif entry.get("type") == "api_key":
            # A key-less entry stays key-less (pi then falls back to the env, as outside).
            out[provider] = {
                "type": "api_key",
                **({"key": PLACEHOLDER} if entry.get("key") else {}),
            }
    return out


SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|AUTH|CREDENTIAL|COOKIE", re.IGNORECASE)


def _kept(name: str, value: object, always_secret: bool) -> object:
    """An MCP ``headers``/``env`` value for the sandbox: a ``${VAR}`` reference stays
    (the variable is a placeholder inside); a literal that may be a credential or a
    ``!command`` (whose output is one) becomes the placeholder."""
    if not isinstance(value, str):
        return value
    if value.startswith("!"):
        return PLACEHOLDER
    if _ENV_REF.search(value) and interpolate(value, {}) is None:
        return value
    return PLACEHOLDER if always_secret or SECRET_NAME.search(name) else value


def sandbox_mcp(data: Mapping[str, Any]) -> dict[str, Any]:
    """mcp.json for the sandbox: MCP servers' header values, credential-named env values
    and OAuth client secrets are placeholders (their logins, mcp-auth.json, stay out)."""
    servers: dict[str, Any] = {}
    for name, raw in _dict(data.get("mcpServers")).items():
        server = dict(_dict(raw))
        if isinstance(server.get("headers"), dict):
            server["headers"] = {k: _kept(k, v, True) for k, v in server["headers"].items()}
        if isinstance(server.get("env"), dict):
            server["env"] = {k: _kept(k, v, False) for k, v in server["env"].items()}
        oauth = _dict(server.get("oauth"))
        if "clientSecret" in oauth:
            server["oauth"] = {
                **oauth,
                "clientSecret": _kept("secret", oauth["clientSecret"], True),
            }
        servers[name] = server
    return {**data, "mcpServers": servers} if servers else dict(data)


def sandbox_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """settings.json without ``apiKeys`` (keys pi 0.x kept there; pi moves them to
    auth.json when it finds no auth.json, which the sandbox may not have), and with the
    ``sse`` transport: the gateway carries HTTP requests, not WebSockets (pi's ChatGPT
    provider tries one first)."""
    return {**{k: v for k, v in data.items() if k != "apiKeys"}, "transport": "sse"}


def routes(cfg: PiConfig, endpoints: Mapping[str, str]) -> dict[str, str]:
    """pi provider id → gateway URL, for the routing extension: every provider whose
    route the gateway serves."""
    return {p: endpoints[route_name(p)] for p in cfg.providers() if endpoints.get(route_name(p))}


def write_private(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
