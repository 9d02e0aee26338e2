"""Claude Code's own configuration, read on the host the way the CLI reads it, and the
sandbox's copy of it with every credential replaced by a placeholder.

What the pinned CLI does (@anthropic-ai/claude-code 2.1.197: the JavaScript bundled in
``@anthropic-ai/claude-code-linux-x64/claude``; its settings, auth and OAuth code):

- **Environment**: the process environment, then the ``env`` of ``~/.claude.json``, of the
  user settings ``~/.claude/settings.json``, of the project's ``.claude/settings.json`` and
  ``.claude/settings.local.json``, of ``--settings`` and last of the managed settings
  (``/etc/claude-code/managed-settings.json`` and ``managed-settings.d/*.json``) are
  assigned over ``process.env`` in that order: a settings ``env`` overrides the shell,
  ``--settings`` overrides the project, the managed settings override everything.
- **Provider**: ``CLAUDE_CODE_USE_BEDROCK``/``_VERTEX``/``_FOUNDRY``/``_ANTHROPIC_AWS``/
  ``_MANTLE``/``_GATEWAY`` pick a provider other than the Anthropic API.
- **Credential** (first party): ``x-api-key`` is ``ANTHROPIC_API_KEY``, else the
  ``apiKeyHelper``'s output, else ``primaryApiKey`` of ``~/.claude.json`` (a key made by
  a Console ``/login``); ``Authorization: Bearer`` is ``ANTHROPIC_AUTH_TOKEN``, else the
  ``apiKeyHelper``'s output. Only when neither ``ANTHROPIC_API_KEY``,
  ``ANTHROPIC_AUTH_TOKEN`` nor an ``apiKeyHelper`` is set does the subscription login
  count: ``CLAUDE_CODE_OAUTH_TOKEN``, else ``claudeAiOauth`` of
  ``~/.claude/.credentials.json`` (with the ``user:inference`` scope), sent as ``Bearer``
  and without ``x-api-key``.
- **apiKeyHelper**: run with the shell, stdout trimmed, cached for
  ``CLAUDE_CODE_API_KEY_HELPER_TTL_MS`` (default 5 minutes), 10 minutes to answer.
- **OAuth refresh**: POST ``https://platform.claude.com/v1/oauth/token`` (JSON
  ``grant_type=refresh_token``, ``refresh_token``, ``client_id``, ``scope``), client id
  ``9d1c250a-e61b-44d9-88ed-5944d1962f5e`` (the login's ``clientId`` or
  ``CLAUDE_CODE_OAUTH_CLIENT_ID`` instead when set); the answer's ``expires_in`` is
  seconds, ``expiresAt`` is stored in milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sono.errors import SoError
from sono.net import scrub
from sono.net.oauth import FileToken, Refresher, Tokens, tokens_of
from sono.net.upstream import PLACEHOLDER, Credential, CredentialError, Upstream

UPSTREAM = "anthropic"
DEFAULT_BASE_URL = "https://api.anthropic.com"
MANAGED_DIR = Path("/etc/claude-code")
MAX_FILE = 1 << 22

TOKEN_URL = "https://platform.claude.com/v1/oauth/token"  # noqa: S105  a URL
CLIENT_ID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
INFERENCE_SCOPE = "user:inference"
DEFAULT_SCOPES = (
    "user:profile",
    "user:inference",
    "user:sessions:claude_code",
    "user:mcp_servers",
    "user:file_upload",
)
PRESERVED_SCOPES = (
    "user:design:read",
    "user:design:write",
    "user:projects:read",
    "user:projects:write",
)
# The placeholder login's expiry: far enough that the CLI inside never refreshes it (ms).
FAR_EXPIRY_MS = 4102444800000  # 2100-01-01

HELPER_TTL_MS = 300_000
HELPER_TIMEOUT_S = 600.0

# The provider switches the gateway cannot serve (it speaks the Anthropic API only).
PROVIDER_VARS = {
    "CLAUDE_CODE_USE_BEDROCK": "Amazon Bedrock",
    "CLAUDE_CODE_USE_VERTEX": "Google Vertex AI",
    "CLAUDE_CODE_USE_FOUNDRY": "Microsoft Foundry",
    "CLAUDE_CODE_USE_ANTHROPIC_AWS": "Claude on AWS",
    "CLAUDE_CODE_USE_MANTLE": "Bedrock Mantle",
    "CLAUDE_CODE_USE_GATEWAY": "a cloud gateway",
}
CREDENTIAL_KEYS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
ENDPOINT_KEYS = ("ANTHROPIC_BASE_URL", "ANTHROPIC_CUSTOM_HEADERS", *CREDENTIAL_KEYS)
# Settings that run a host command to get a credential: never copied inside.
HELPER_KEYS = (
    "apiKeyHelper",
    "awsAuthRefresh",
    "awsCredentialExport",
    "gcpAuthRefresh",
    "otelHeadersHelper",
    "proxyAuthHelper",
)
SECRET_SUFFIXES = ("_API_KEY", "_AUTH_TOKEN", "_ACCESS_TOKEN", "_SECRET_KEY", "_SECRET", "_TOKEN")


def truthy(value: str | None) -> bool:
    """The CLI's reading of a boolean variable."""
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as fh:
            data = json.loads(fh.read(MAX_FILE))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_user_json(path: Path, label: str) -> dict[str, Any] | None:
    """One of the user's own files: missing is None, but a file that is there and does not
    parse is an error (claude would silently run without it: "Not logged in" every
    iteration)."""
    try:
        with path.open("rb") as fh:
            data = json.loads(fh.read(MAX_FILE))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SoError(f"claude: {label} cannot be read ({exc.strerror}); fix it") from None
    except ValueError as exc:
        raise SoError(
            f"claude: {label} is not valid JSON ({exc}); fix it (claude itself would ignore "
            "the whole file)"
        ) from None
    if not isinstance(data, dict):
        raise SoError(f"claude: {label} is not a JSON object; fix it")
    return data


def env_of(data: Mapping[str, Any] | None) -> dict[str, str]:
    env = data.get("env") if data else None
    if not isinstance(env, dict):
        return {}
    return {str(k): str(v) for k, v in env.items() if isinstance(v, str | int | float | bool)}


def managed_settings(managed_dir: Path) -> dict[str, Any]:
    """``managed-settings.json`` with the ``managed-settings.d/*.json`` drop-ins over it
    (sorted by name, as the CLI does); only ``env`` and ``apiKeyHelper`` matter here."""
    merged: dict[str, Any] = {}
    paths = [managed_dir / "managed-settings.json"]
    with contextlib.suppress(OSError):
        drop_in = managed_dir / "managed-settings.d"
        paths += sorted(
            p for p in drop_in.iterdir() if p.name.endswith(".json") and not p.name.startswith(".")
        )
    for path in paths:
        data = read_json(path)
        if data is None:
            continue
        env = {**env_of(merged), **env_of(data)}
        merged.update(data)
        if env:
            merged["env"] = env
    return merged


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``ANTHROPIC_CUSTOM_HEADERS``: one ``Name: value`` a line, as the CLI splits it."""
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            found.append((name.strip(), value.strip()))
    return tuple(found)


@dataclass
class HelperToken:
    """An ``apiKeyHelper`` run on the host with the shell, as the CLI runs it; its output
    is kept for the CLI's TTL."""

    command: str
    source: str
    env: Mapping[str, str]
    ttl_s: float = HELPER_TTL_MS / 1000
    cwd: Path | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._value: str | None = None
        self._at = 0.0

    def token(self) -> str:
        with self._lock:
            now = time.monotonic()
            if self._value is None or now - self._at >= self.ttl_s:
                self._value, self._at = self._run(), now
            return self._value

    def _run(self) -> str:
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", self.command],
                env=dict(self.env),
                cwd=self.cwd,
                capture_output=True,
                timeout=HELPER_TIMEOUT_S,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise CredentialError(f"{self.source}: timed out; fix the helper") from None
        except OSError as exc:
            raise CredentialError(f"{self.source}: cannot run it ({exc})") from None
        if proc.returncode != 0:
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
            why = f"exited {proc.returncode}" + (f": {tail[0]}" if tail else "")
            raise CredentialError(f"{self.source}: {why}; fix the helper")
        value = proc.stdout.decode(errors="replace").strip()
        if not value:
            raise CredentialError(f"{self.source}: did not return a value; fix the helper")
        return value


class ClaudeCredentials:
    """``~/.claude/.credentials.json``: ``{"claudeAiOauth": {"accessToken", "refreshToken",
    "expiresAt" (epoch ms), "scopes", "subscriptionType", ...}}``."""

    def read(self, data: Mapping[str, Any]) -> Tokens | None:
        login = data.get("claudeAiOauth")
        if not isinstance(login, dict):
            return None
        return tokens_of(
            login.get("accessToken"), login.get("refreshToken"), login.get("expiresAt")
        )

    def write(self, data: Mapping[str, Any], tokens: Tokens) -> dict[str, Any]:
        login = dict(data.get("claudeAiOauth") or {})
        login["accessToken"] = tokens.access
        if tokens.refresh:
            login["refreshToken"] = tokens.refresh
        if tokens.expires_at is not None:
            login["expiresAt"] = int(tokens.expires_at * 1000)
        return {**data, "claudeAiOauth": login}


def refresher(login: Mapping[str, Any], env: Mapping[str, str]) -> Refresher:
    """The CLI's refresh request, JSON: a claude.ai login without its own client id asks
    for the CLI's default scopes plus the design/projects ones it holds; any other login
    for its own scopes (the defaults when it has none). The client id is the login's, else
    ``CLAUDE_CODE_OAUTH_CLIENT_ID``, else the CLI's."""
    stored = login.get("scopes")
    scopes = [x for x in stored if isinstance(x, str)] if isinstance(stored, list) else []
    client = login.get("clientId")
    own_client = isinstance(client, str) and bool(client)
    if not own_client and (INFERENCE_SCOPE in scopes or login.get("subscriptionType")):
        wanted = [*DEFAULT_SCOPES, *(x for x in scopes if x in PRESERVED_SCOPES)]
    else:
        wanted = scopes or list(DEFAULT_SCOPES)
    scope = " ".join(dict.fromkeys(wanted))
    client_id = str(client) if own_client else env.get("CLAUDE_CODE_OAUTH_CLIENT_ID") or CLIENT_ID

    def body(refresh_token: str) -> dict[str, str]:
        return {
            "grant_type": "refresh_token",
            "refresh_token": refresh_token,
            "client_id": client_id,
            "scope": scope,
        }

    return Refresher(TOKEN_URL, body)


@dataclass(frozen=True)
class Found:
    """What the host configuration says: the merged environment, where each variable
    came from, and the apiKeyHelper with where it is set."""

    env: dict[str, str]
    origin: dict[str, str]
    helper: tuple[str, str] | None


def read_host(host_env: Mapping[str, str], host_home: Path, managed_dir: Path) -> Found:
    env: dict[str, str] = dict(host_env)
    origin = {k: f"env {k}" for k in host_env}
    layers = [
        ("~/.claude.json env", read_user_json(host_home / ".claude.json", "~/.claude.json")),
        (
            "~/.claude/settings.json env",
            read_user_json(host_home / ".claude" / "settings.json", "~/.claude/settings.json"),
        ),
        (f"{managed_dir}/managed-settings.json env", managed_settings(managed_dir)),
    ]
    helper: tuple[str, str] | None = None
    for label, data in layers:
        for key, value in env_of(data).items():
            env[key], origin[key] = value, f"{label} {key}"
        cmd = data.get("apiKeyHelper") if data else None
        if isinstance(cmd, str) and cmd.strip() and not label.startswith("~/.claude.json"):
            helper = (cmd, label.removesuffix(" env") + " apiKeyHelper")
    return Found(env, origin, helper)


def project_notes(project: Path | None) -> tuple[str, ...]:
    """The project's own settings are agent-writable: what they name is not used."""
    if project is None:
        return ()
    notes: list[str] = []
    for name in ("settings.json", "settings.local.json"):
        data = read_json(project / ".claude" / name)
        if not data:
            continue
        keys = [k for k in ENDPOINT_KEYS if k in env_of(data)]
        if isinstance(data.get("apiKeyHelper"), str):
            keys.append("apiKeyHelper")
        if keys:
            notes.append(
                f"claude: .claude/{name} sets {', '.join(keys)}: not used (the project's "
                "settings are writable by the agent); put it in ~/.claude/settings.json"
            )
    return tuple(notes)


def find_upstream(
    host_env: Mapping[str, str],
    host_home: Path,
    *,
    managed_dir: Path = MANAGED_DIR,
    project: Path | None = None,
) -> tuple[Upstream | None, tuple[str, ...], str | None]:
    """The Anthropic endpoint the host's claude would call, with its credential, the
    notes for the user and a refusal."""
    found = read_host(host_env, host_home, managed_dir)
    env, origin = found.env, found.origin
    notes = project_notes(project)
    for var, provider in PROVIDER_VARS.items():
        if truthy(env.get(var)):
            return (
                None,
                notes,
                f"claude is set to use {provider} ({origin.get(var, var)}), which so's model "
                f"gateway cannot route; unset {var} to run it against the Anthropic API",
            )
    base = env.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL
    base_source = (
        origin["ANTHROPIC_BASE_URL"] if env.get("ANTHROPIC_BASE_URL") else "built-in default"
    )
    headers = list(parse_headers(env.get("ANTHROPIC_CUSTOM_HEADERS", "")))
    api_key, auth_token = env.get("ANTHROPIC_API_KEY"), env.get("ANTHROPIC_AUTH_TOKEN")
    credential: Credential | None = None
    if api_key:
        credential = Credential("API key", origin["ANTHROPIC_API_KEY"], "x-api-key", api_key)
    elif found.helper is not None:
        cmd, source = found.helper
        ttl = HELPER_TTL_MS
        with contextlib.suppress(ValueError):
            ttl = max(0, int(env.get("CLAUDE_CODE_API_KEY_HELPER_TTL_MS") or ttl))
        token = HelperToken(cmd, source, env, ttl / 1000)
        credential = Credential("key helper", source, "x-api-key+bearer", token)
    if credential is not None:
        if auth_token:  # the CLI sends both: the key as x-api-key, the token as Bearer
            headers.append(("Authorization", f"Bearer {auth_token}"))
    elif auth_token:
        credential = Credential("auth token", origin["ANTHROPIC_AUTH_TOKEN"], "bearer", auth_token)
    elif env.get("CLAUDE_CODE_OAUTH_TOKEN"):
        credential = Credential(
            "OAuth token",
            origin["CLAUDE_CODE_OAUTH_TOKEN"],
            "bearer",
            env["CLAUDE_CODE_OAUTH_TOKEN"],
        )
    else:
        credential = oauth_login(host_home, env) or primary_key(host_home)
    if found.helper is not None and api_key:
        notes += (f"claude: {found.helper[1]} is not run: ANTHROPIC_API_KEY wins over it",)
    if credential is not None and credential.kind != "OAuth login" and has_login(host_home):
        notes += (
            f"claude: the login in ~/.claude/.credentials.json is not used: {credential.source} "
            "wins over it (as for claude -p); unset it to use the login",
        )
    if env.get("CLAUDE_CONFIG_DIR"):
        notes += (
            "claude: CLAUDE_CONFIG_DIR is not followed: so reads ~/.claude and ~/.claude.json; "
            "unset it or move the settings there",
        )
    upstream = Upstream(
        UPSTREAM,
        "anthropic",
        base.rstrip("/"),
        base_source,
        credential or Credential("none", "none configured"),
        tuple(headers),
    )
    return upstream, notes, None


def has_login(host_home: Path) -> bool:
    data = read_json(host_home / ".claude" / ".credentials.json")
    login = data.get("claudeAiOauth") if data else None
    return isinstance(login, dict) and bool(login.get("accessToken"))


def oauth_login(host_home: Path, env: Mapping[str, str]) -> Credential | None:
    path = host_home / ".claude" / ".credentials.json"
    data = read_user_json(path, "~/.claude/.credentials.json")
    login = data.get("claudeAiOauth") if data else None
    if not isinstance(login, dict) or not login.get("accessToken"):
        return None
    scopes = login.get("scopes")
    if isinstance(scopes, list) and INFERENCE_SCOPE not in scopes:
        return None  # the CLI uses a login for the API only with this scope
    label = "~/.claude/.credentials.json"
    token = FileToken(
        path,
        ClaudeCredentials(),
        refresher(login, env),
        label=label,
        login_hint="run `claude` on the host and /login",
    )
    return Credential("OAuth login", label, "bearer", token)


def primary_key(host_home: Path) -> Credential | None:
    data = read_json(host_home / ".claude.json")
    key = data.get("primaryApiKey") if data else None
    if isinstance(key, str) and key:
        return Credential("API key", "~/.claude.json primaryApiKey", "x-api-key", key)
    return None


# -- the sandbox's copy ---------------------------------------------------------------


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return (
        upper in CREDENTIAL_KEYS
        or upper.endswith(SECRET_SUFFIXES)
        or upper == "AWS_ACCESS_KEY_ID"
        or scrub.is_credential_name(name)
    )


def sandbox_env(env: Mapping[str, str], endpoint: str | None) -> dict[str, str]:
    """A settings ``env`` for inside: credentials as placeholders, the base URL the
    gateway's, custom headers (they may carry auth) gone — the gateway adds them."""
    out: dict[str, str] = {}
    for key, value in env.items():
        if key == "ANTHROPIC_CUSTOM_HEADERS" or scrub.HEADER_VAR_RE.search(key):
            continue  # headers (OTEL_EXPORTER_OTLP_HEADERS…) may carry auth
        if key == "ANTHROPIC_BASE_URL":
            if endpoint:
                out[key] = endpoint
            continue
        out[key] = PLACEHOLDER if is_secret_name(key) and value else scrub.scrub_text(value)
    return out


def sandbox_settings(data: Mapping[str, Any], endpoint: str | None) -> dict[str, Any]:
    """``~/.claude/settings.json`` for inside: no helper, placeholders in ``env``; a helper
    becomes a placeholder API key (the CLI inside sends it; the gateway swaps it)."""
    out = {k: v for k, v in data.items() if k not in HELPER_KEYS}
    env = sandbox_env(env_of(data), endpoint)
    if isinstance(data.get("apiKeyHelper"), str):
        env.setdefault("ANTHROPIC_API_KEY", PLACEHOLDER)
    if env or "env" in data:
        out["env"] = env
    return out


def sandbox_credentials(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """``.credentials.json`` for inside: the login's shape (scopes, subscription) with
    placeholder tokens and a far expiry; nothing else (MCP servers' tokens stay out)."""
    login = data.get("claudeAiOauth")
    if not isinstance(login, dict):
        return None
    keep = {k: v for k, v in login.items() if k not in {"accessToken", "refreshToken", "expiresAt"}}
    return {
        "claudeAiOauth": {
            "accessToken": PLACEHOLDER,
            "refreshToken": PLACEHOLDER,
            "expiresAt": FAR_EXPIRY_MS,
            **keep,
        }
    }


def sandbox_global(data: Mapping[str, Any], endpoint: str | None) -> dict[str, Any]:
    """``~/.claude.json`` for inside: a placeholder API key, placeholders in ``env`` and in
    the MCP servers' environments and headers."""
    out = dict(data)
    if out.get("primaryApiKey"):
        out["primaryApiKey"] = PLACEHOLDER
    # The interactive CLI uses ANTHROPIC_API_KEY only once approved (by the key's last 20
    # characters): the placeholder is, the real keys' tails stay out.
    out["customApiKeyResponses"] = {"approved": [PLACEHOLDER[-20:]], "rejected": []}
    if "env" in out:
        out["env"] = sandbox_env(env_of(out), endpoint)
    if isinstance(out.get("oauthAccount"), dict):
        account = out["oauthAccount"]
        out["oauthAccount"] = {
            k: (PLACEHOLDER if "token" in k.lower() else v) for k, v in account.items()
        }
    out["mcpServers"] = scrub_servers(out.get("mcpServers"))
    if out["mcpServers"] is None:
        del out["mcpServers"]
    projects = out.get("projects")
    if isinstance(projects, dict):
        out["projects"] = {
            path: (
                {**p, "mcpServers": scrub_servers(p.get("mcpServers"))}
                if isinstance(p, dict) and isinstance(p.get("mcpServers"), dict)
                else p
            )
            for path, p in projects.items()
        }
    return out


def scrub_servers(servers: Any) -> Any:
    if not isinstance(servers, dict):
        return servers
    out: dict[str, Any] = {}
    for name, given in servers.items():
        server = dict(given) if isinstance(given, dict) else given
        if isinstance(server, dict):
            server.pop("headersHelper", None)  # a command: it runs on the host only
            server = scrub.scrub_json(server)  # env, headers, args, URLs with keys
        out[name] = server
    return out
