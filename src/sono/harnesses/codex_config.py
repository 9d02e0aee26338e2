"""codex's own configuration, read on the host as codex 0.171 reads it, and its
gateway-pointed, credential-free copy for the sandbox.

What codex does (codex-rs, @openai/codex 0.171.0):

- ``~/.codex/config.toml``: ``model_provider`` (or ``[profiles.<profile>].model_provider``
  with top-level ``profile = "<profile>"``), default ``openai``. Built-in providers
  (``model-provider-info/src/lib.rs``): ``openai`` (base ``openai_base_url``, else
  ``https://api.openai.com/v1`` with an API key, ``https://chatgpt.com/backend-api/codex``
  with a ChatGPT login; headers ``OpenAI-Organization``/``OpenAI-Project`` from
  ``OPENAI_ORGANIZATION``/``OPENAI_PROJECT``), ``ollama``/``lmstudio``
  (``CODEX_OSS_BASE_URL``, else ``http://localhost:<CODEX_OSS_PORT or 11434/1234>/v1``, no
  key) and ``amazon-bedrock`` (AWS SigV4). A ``[model_providers.<id>]`` with a built-in id
  is ignored (built-ins win). A custom provider sends ``Authorization: Bearer`` with the
  value of its ``env_key`` variable, else ``experimental_bearer_token``, else (with
  ``requires_openai_auth``) the login in ``auth.json`` — Azure included (codex sends no
  ``api-key`` header); ``query_params`` go on every URL, ``http_headers`` and
  ``env_http_headers`` (header -> variable) on every request.
- ``~/.codex/auth.json`` (``login/src/auth/storage.rs`` ``AuthDotJson``):
  ``OPENAI_API_KEY``, or ``tokens`` {``id_token``, ``access_token``, ``refresh_token``,
  ``account_id``} and ``last_refresh``. The ChatGPT backend gets ``Authorization: Bearer
  <access_token>`` and ``chatgpt-account-id: <account_id>``. codex refreshes when the access
  token's JWT ``exp`` has passed, or (no ``exp``) when ``last_refresh`` is older than 8 days
  (``login/src/auth/manager.rs``): a placeholder with a far ``exp`` is never refreshed.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sono.net import scrub
from sono.net.oauth import FileToken, Refresher, Tokens
from sono.net.upstream import NO_CREDENTIAL, PLACEHOLDER, Credential, Upstream

CONFIG = "config.toml"
AUTH = "auth.json"
LABEL = "~/.codex"
OPENAI = "openai"
API_BASE = "https://api.openai.com/v1"
CHATGPT_BASE = "https://chatgpt.com/backend-api/codex"
OSS_PORTS = {"ollama": 11434, "lmstudio": 1234}
BUILT_IN = frozenset({OPENAI, "amazon-bedrock", *OSS_PORTS})
# codex-rs/login/src/auth/manager.rs: REFRESH_TOKEN_URL, CLIENT_ID and the override variable.
REFRESH_URL = "https://auth.openai.com/oauth/token"
REFRESH_URL_VAR = "CODEX_REFRESH_TOKEN_URL_OVERRIDE"
CLIENT_ID = "app_EMoamEEZ73f0CkXaXp7hrann"
REFRESH_INTERVAL_S = 8 * 86400  # TOKEN_REFRESH_INTERVAL (days) when the token has no exp
AUTH_CLAIM = "https://api.openai.com/auth"
ACCOUNT_HEADER = "chatgpt-account-id"
PLACEHOLDER_ACCOUNT = "so-placeholder-account"
FAR_FUTURE_S = 10 * 365 * 86400
# Hosts codex treats as Azure (codex-api is_azure_responses_provider): behind the gateway
# the URL no longer says so, so the sandbox's copy is named "azure", which codex also reads.
AZURE_MARKERS = (
    "openai.azure.",
    "cognitiveservices.azure.",
    "aoai.azure.",
    "azure-api.",
    "azurefd.",
    "windows.net/openai",
)
LOGIN_HINT = "run `codex login` on the host"


class ConfigError(Exception):
    """The host's codex configuration cannot be used; the message says why and the fix."""


@dataclass(frozen=True)
class Choice:
    """The provider codex would use: its id, its table (None for a built-in), the
    upstream name ``so`` serves it under and where it was chosen."""

    id: str
    table: Mapping[str, Any] | None
    name: str
    source: str


def upstream_name(provider_id: str, table: Mapping[str, Any] | None) -> str:
    """``[a-z0-9_-]`` from the provider id; a custom id that would read as a built-in
    one (``OpenAI``) gets ``-custom`` so the two never share a route."""
    name = re.sub(r"[^a-z0-9_-]", "_", provider_id.lower()).lstrip("_-")[:50] or "provider"
    return f"{name}-custom" if table is not None and name in BUILT_IN else name


def read_config(codex_home: Path) -> dict[str, Any]:
    path = codex_home / CONFIG
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{LABEL}/{CONFIG} cannot be read ({exc}); fix it or move it") from None


def read_auth(codex_home: Path) -> dict[str, Any]:
    try:
        data = json.loads((codex_home / AUTH).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        raise ConfigError(f"{LABEL}/{AUTH} is not JSON; {LOGIN_HINT} again") from None
    return data if isinstance(data, dict) else {}


def choose(config: Mapping[str, Any]) -> Choice:
    """The provider codex would pick: the profile's ``model_provider``, the top-level
    one, else ``openai``."""
    where = f"{LABEL}/{CONFIG}"
    provider, source = None, "built-in default"
    profile = config.get("profile")
    profiles = config.get("profiles")
    if isinstance(profile, str) and isinstance(profiles, dict):
        chosen = profiles.get(profile)
        if isinstance(chosen, dict) and isinstance(chosen.get("model_provider"), str):
            provider, source = chosen["model_provider"], f"{where} [profiles.{profile}]"
    if provider is None and isinstance(config.get("model_provider"), str):
        provider, source = config["model_provider"], f"{where} model_provider"
    provider = provider or OPENAI
    if provider in BUILT_IN:
        return Choice(provider, None, upstream_name(provider, None), source)
    tables = config.get("model_providers")
    table = tables.get(provider) if isinstance(tables, dict) else None
    if not isinstance(table, dict):
        raise ConfigError(
            f"{where} selects model_provider {provider!r} but has no "
            f"[model_providers.{provider}]; add it or pick another provider"
        )
    return Choice(
        provider, table, upstream_name(provider, table), f"{where} [model_providers.{provider}]"
    )


# --- access: the real endpoint and credential (host only) --------------------------------


def upstream_for(
    choice: Choice,
    config: Mapping[str, Any],
    auth: Mapping[str, Any],
    host_env: Mapping[str, str],
    codex_home: Path,
) -> Upstream:
    if choice.table is not None:
        return _custom(choice, choice.table, auth, host_env, codex_home)
    if choice.id in OSS_PORTS:
        return _oss(choice, host_env)
    if choice.id != OPENAI:
        raise ConfigError(
            f"codex's {choice.id} provider signs requests with AWS credentials, which so cannot "
            "route through its gateway; use an OpenAI-compatible provider in ~/.codex/config.toml"
        )
    return _openai(choice, config, auth, host_env, codex_home)


def _custom(
    choice: Choice,
    table: Mapping[str, Any],
    auth: Mapping[str, Any],
    host_env: Mapping[str, str],
    codex_home: Path,
) -> Upstream:
    for key in ("auth", "aws"):
        if key in table:
            raise ConfigError(
                f"{choice.source} uses `{key}`, which so cannot run through its gateway; "
                "use env_key (the key stays on the host)"
            )
    base = _str(table.get("base_url")) or API_BASE
    headers = _headers(table, host_env)
    env_key = _str(table.get("env_key"))
    token = _str(table.get("experimental_bearer_token"))
    if env_key:
        value = host_env.get(env_key, "").strip()
        if not value:
            raise ConfigError(
                f"{choice.source} takes its key from ${env_key}, which is not set; set it"
            )
        cred = Credential("API key", f"env {env_key}", "bearer", value)
    elif token:
        cred = Credential(
            "bearer token", f"{choice.source} experimental_bearer_token", "bearer", token
        )
    elif table.get("requires_openai_auth"):
        cred, account = _login(auth, host_env, codex_home)
        headers += account
    else:
        cred = NO_CREDENTIAL
    return Upstream(choice.name, "openai", base.rstrip("/"), choice.source, cred, tuple(headers))


def _oss(choice: Choice, host_env: Mapping[str, str]) -> Upstream:
    base = host_env.get("CODEX_OSS_BASE_URL", "").strip()
    port = host_env.get("CODEX_OSS_PORT", "").strip()
    source = "env CODEX_OSS_BASE_URL" if base else f"{choice.source} (codex's {choice.id})"
    if not base:
        base = f"http://localhost:{port if port.isdigit() else OSS_PORTS[choice.id]}/v1"
    return Upstream(choice.name, "openai", base.rstrip("/"), source)


def _openai(
    choice: Choice,
    config: Mapping[str, Any],
    auth: Mapping[str, Any],
    host_env: Mapping[str, str],
    codex_home: Path,
) -> Upstream:
    headers = [
        (header, host_env[var].strip())
        for header, var in (
            ("OpenAI-Organization", "OPENAI_ORGANIZATION"),
            ("OpenAI-Project", "OPENAI_PROJECT"),
        )
        if host_env.get(var, "").strip()
    ]
    if host_env.get("CODEX_API_KEY", "").strip():  # codex exec prefers it to any login
        cred = Credential(
            "API key", "env CODEX_API_KEY", "bearer", host_env["CODEX_API_KEY"].strip()
        )
    elif auth:
        cred, account = _login(auth, host_env, codex_home)
        headers += account
    elif host_env.get("OPENAI_API_KEY", "").strip():
        cred = Credential(
            "API key", "env OPENAI_API_KEY", "bearer", host_env["OPENAI_API_KEY"].strip()
        )
    else:
        raise ConfigError(f"codex is not logged in ({LABEL}/{AUTH} is missing); {LOGIN_HINT}")
    configured = _str(config.get("openai_base_url"))
    from_env = host_env.get("OPENAI_BASE_URL", "").strip()
    if configured:
        base, source = configured, f"{LABEL}/{CONFIG} openai_base_url"
    elif from_env:  # so's own convention since the first release: still honoured
        base, source = responses_base(from_env), "env OPENAI_BASE_URL"
    else:
        chatgpt = cred.kind == "ChatGPT login"
        base, source = (CHATGPT_BASE if chatgpt else API_BASE), "built-in default"
    return Upstream(choice.name, "openai", base.rstrip("/"), source, cred, tuple(headers))


def _login(
    auth: Mapping[str, Any], host_env: Mapping[str, str], codex_home: Path
) -> tuple[Credential, list[tuple[str, str]]]:
    """The credential of ``auth.json``: its API key, or its ChatGPT login (a
    :class:`FileToken` refreshed on the host) with the account header."""
    where = f"{LABEL}/{AUTH}"
    key = _str(auth.get("OPENAI_API_KEY"))
    tokens = auth.get("tokens")
    if key:
        return Credential("API key", where, "bearer", key), []
    if not isinstance(tokens, dict) or not _str(tokens.get("access_token")):
        raise ConfigError(f"{where} holds no API key and no ChatGPT login; {LOGIN_HINT}")
    url = host_env.get(REFRESH_URL_VAR, "").strip() or REFRESH_URL
    refresher = Refresher(
        url,
        lambda refresh: {
            "client_id": CLIENT_ID,
            "grant_type": "refresh_token",
            "refresh_token": refresh,
        },
    )
    source = FileToken(
        codex_home / AUTH, AuthFormat(), refresher, label=where, login_hint=LOGIN_HINT
    )
    account = account_id(tokens)
    headers = [(ACCOUNT_HEADER, account)] if account else []
    return Credential("ChatGPT login", where, "bearer", source), headers


def responses_base(url: str) -> str:
    """A bare host means its ``/v1`` API, as the OpenAI SDKs read ``OPENAI_BASE_URL``."""
    url = url.rstrip("/")
    return url if urlsplit(url).path.strip("/") else url + "/v1"


def account_id(tokens: Mapping[str, Any]) -> str | None:
    account = _str(tokens.get("account_id"))
    if account:
        return account
    claim = jwt_claims(_str(tokens.get("id_token")) or "").get(AUTH_CLAIM)
    return _str(claim.get("chatgpt_account_id")) if isinstance(claim, dict) else None


def _headers(table: Mapping[str, Any], host_env: Mapping[str, str]) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    literal = table.get("http_headers")
    if isinstance(literal, dict):
        headers += [(str(k), str(v)) for k, v in literal.items()]
    from_env = table.get("env_http_headers")
    if isinstance(from_env, dict):
        headers += [
            (str(k), host_env[str(v)].strip())
            for k, v in from_env.items()
            if host_env.get(str(v), "").strip()
        ]
    return headers


class AuthFormat:
    """``auth.json``'s ChatGPT tokens for :class:`sono.net.oauth.FileToken`: expiry from
    the access token's JWT ``exp``, else ``last_refresh`` + 8 days, as codex decides."""

    def read(self, data: Mapping[str, Any]) -> Tokens | None:
        tokens = data.get("tokens")
        if not isinstance(tokens, dict) or not _str(tokens.get("access_token")):
            return None
        access = tokens["access_token"]
        exp = jwt_claims(access).get("exp")
        expires: float | None = float(exp) if isinstance(exp, int | float) else None
        if expires is None:
            last = _parse_time(data.get("last_refresh"))
            expires = last + REFRESH_INTERVAL_S if last is not None else None
        return Tokens(access, _str(tokens.get("refresh_token")), expires)

    def write(self, data: Mapping[str, Any], tokens: Tokens) -> dict[str, Any]:
        old = data.get("tokens")
        new = {**(old if isinstance(old, dict) else {}), "access_token": tokens.access}
        if tokens.refresh:
            new["refresh_token"] = tokens.refresh
        if tokens.extra.get("id_token"):  # codex keeps the new id token too
            new["id_token"] = tokens.extra["id_token"]
        return {**data, "tokens": new, "last_refresh": now_iso()}


# --- provision: the sandbox's copies ------------------------------------------------------


def sandbox_config(
    config: Mapping[str, Any], choice: Choice, endpoint: str | None
) -> dict[str, Any]:
    """``config`` for the sandbox: the chosen provider pointed at ``endpoint``, every
    provider's header tables and key variable dropped, bearer tokens as placeholders."""
    out = dict(config)
    for section in ("mcp_servers", "shell_environment_policy", "otel"):
        if section in out:  # MCP servers' env, headers, tokens; telemetry headers
            out[section] = scrub.scrub_json(out[section], key=section)
    tables = config.get("model_providers")
    if isinstance(tables, dict):
        out["model_providers"] = {
            pid: _scrubbed(t) if isinstance(t, dict) else t for pid, t in tables.items()
        }
    if endpoint is None:
        return out
    if choice.table is not None:
        table = _scrubbed(choice.table, keyed=True)
        if _is_azure(choice.table):
            table["name"] = "azure"
        table["base_url"] = endpoint
        providers = dict(out.get("model_providers") or {})
        providers.pop(choice.id, None)
        providers[choice.name] = table
        out["model_providers"] = providers
        _select(out, choice)
    elif choice.id == OPENAI:
        out["openai_base_url"] = endpoint
        out["chatgpt_base_url"] = endpoint  # its other calls end at the gateway (refused)
    return out


def _select(config: dict[str, Any], choice: Choice) -> None:
    """The sandbox names the provider by its upstream name (the flags pin it)."""
    config["model_provider"] = choice.name
    profiles = config.get("profiles")
    if isinstance(profiles, dict):
        config["profiles"] = {
            k: {**p, "model_provider": choice.name}
            if isinstance(p, dict) and p.get("model_provider") == choice.id
            else p
            for k, p in profiles.items()
        }


def _scrubbed(table: Mapping[str, Any], *, keyed: bool = False) -> dict[str, Any]:
    drop = {
        "http_headers",
        "env_http_headers",
        "env_key",
        "env_key_instructions",
        "experimental_bearer_token",
        "auth",
    }
    out = {k: v for k, v in table.items() if k not in drop}
    if keyed and (table.get("env_key") or table.get("experimental_bearer_token")):
        out["experimental_bearer_token"] = PLACEHOLDER  # the gateway sends the real key
    elif "experimental_bearer_token" in table:
        out["experimental_bearer_token"] = PLACEHOLDER
    return out


def _is_azure(table: Mapping[str, Any]) -> bool:
    base = (_str(table.get("base_url")) or "").lower()
    return str(table.get("name", "")).lower() == "azure" or any(m in base for m in AZURE_MARKERS)


def sandbox_auth(auth: Mapping[str, Any], clock: float | None = None) -> dict[str, Any]:
    """``auth.json`` with placeholders of the same shape: codex accepts it, never
    refreshes it (far ``exp``, ``last_refresh`` now) and holds nothing real."""
    out: dict[str, Any] = {}
    if "auth_mode" in auth:
        out["auth_mode"] = auth["auth_mode"]
    out["OPENAI_API_KEY"] = PLACEHOLDER if _str(auth.get("OPENAI_API_KEY")) else None
    tokens = auth.get("tokens")
    if isinstance(tokens, dict):
        now = time.time() if clock is None else clock
        claims = _kept_claims(jwt_claims(_str(tokens.get("id_token")) or ""), now)
        out["tokens"] = {
            "id_token": placeholder_jwt(claims),
            "access_token": placeholder_jwt(claims),
            "refresh_token": PLACEHOLDER,
            "account_id": PLACEHOLDER_ACCOUNT,
        }
        out["last_refresh"] = now_iso(now)
    return out


def _kept_claims(real: Mapping[str, Any], now: float) -> dict[str, Any]:
    """What codex reads from the id token (email, plan), no account id, a far ``exp``."""
    auth = real.get(AUTH_CLAIM)
    plan = auth.get("chatgpt_plan_type") if isinstance(auth, dict) else None
    claims: dict[str, Any] = {"exp": int(now + FAR_FUTURE_S), "iat": int(now)}
    if isinstance(real.get("email"), str):
        claims["email"] = real["email"]
    claims[AUTH_CLAIM] = {"chatgpt_account_id": PLACEHOLDER_ACCOUNT}
    if isinstance(plan, str):
        claims[AUTH_CLAIM]["chatgpt_plan_type"] = plan
    return claims


def placeholder_jwt(claims: Mapping[str, Any]) -> str:
    """An unsigned JWT: codex only decodes the payload."""
    return ".".join((_b64({"alg": "none", "typ": "JWT"}), _b64(claims), "so-placeholder"))


def jwt_claims(token: str) -> dict[str, Any]:
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        data = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _b64(data: Mapping[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def now_iso(now: float | None = None) -> str:
    moment = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.UTC)
    return moment.isoformat().replace("+00:00", "Z")


def _parse_time(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _str(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


# --- a small TOML writer (tomllib only reads) -----------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    return key if _BARE.fullmatch(key) else json.dumps(key)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def dumps(data: Mapping[str, Any], prefix: str = "") -> str:
    """TOML for ``data`` (tables as ``[a.b]`` sections; ``None`` values dropped)."""
    lines = [
        f"{_key(str(k))} = {_value(v)}"
        for k, v in data.items()
        if not isinstance(v, dict) and v is not None
    ]
    text = "\n".join(lines) + ("\n" if lines else "")
    for k, v in data.items():
        if isinstance(v, dict):
            name = f"{prefix}{_key(str(k))}"
            text += f"\n[{name}]\n" + dumps(v, name + ".")
    return text
