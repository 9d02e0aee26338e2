"""Where an agent's model requests really go, and with which credential: host-side only.

A harness reads its CLI's own configuration on the host (:meth:`sono.harnesses.base.
Harness.access`) and names every model endpoint it finds as an :class:`Upstream`: the
real base URL, the real :class:`Credential` and the extra headers the upstream wants.
The gateway (:mod:`sono.net.gateway`) serves each upstream under ``/<name>``; the
sandbox's copy of the agent's config gets the gateway's URL and placeholders instead.
Nothing in this module may ever reach the sandbox.

A credential is a string or a :class:`TokenSource` (an OAuth login that the host
refreshes, an ``apiKeyHelper`` run on the host): the gateway asks for the current value
per request, off its event loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol
from urllib.parse import urlsplit

# The model API families the gateway forwards (see gateway.API_ENDPOINTS).
ApiKind = Literal["anthropic", "openai"]
# How the upstream takes the credential: ``x-api-key: K`` (Anthropic API keys),
# ``Authorization: Bearer K`` (OpenAI, OAuth, auth tokens), ``api-key: K`` (Azure), or
# both ``x-api-key`` and ``Bearer`` (what claude sends an ``apiKeyHelper``'s key as), or
# nothing (a local server without auth).
AuthHeader = Literal["x-api-key", "bearer", "api-key", "x-api-key+bearer", "none"]
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")

# What the sandbox holds instead of any credential; the gateway replaces it.
PLACEHOLDER = "so-placeholder-the-gateway-adds-the-real-key"


class CredentialError(Exception):
    """A credential that cannot be had now (a refresh failed, a helper failed): its
    message is one line, says where the credential comes from and what to do."""


class TokenSource(Protocol):
    def token(self) -> str:
        """The current credential (refreshed on the host when due); may block. Raises
        :class:`CredentialError`."""


@dataclass(frozen=True)
class Credential:
    """``kind`` is what ``so doctor`` shows ("API key", "auth token", "OAuth login",
    "key helper", "none"); ``source`` where it came from ("env ANTHROPIC_API_KEY",
    "~/.claude/.credentials.json"); never the value."""

    kind: str
    source: str
    header: AuthHeader = "none"
    value: str | TokenSource = field(default="", repr=False, compare=False)

    def current(self) -> str:
        if isinstance(self.value, str):
            return self.value
        return self.value.token()

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values to scrub from anything the sandbox gets: the static value, or what
        a token source knows now without fetching (an OAuth login's tokens)."""
        if isinstance(self.value, str):
            return (self.value,) if self.value else ()
        known = getattr(self.value, "known", None)
        return tuple(known()) if callable(known) else ()


NO_CREDENTIAL = Credential("none", "none configured")


@dataclass(frozen=True)
class Upstream:
    """One model endpoint: served inside as ``http://127.0.0.1:<gateway>/<name>``, sent
    to ``base_url`` + the API path. ``source`` says where the endpoint was configured
    ("built-in default", "env ANTHROPIC_BASE_URL", "~/.codex/config.toml
    [model_providers.fake]"). ``headers`` are added to every upstream request (custom
    headers, account ids); their values may be secret: they never go inside."""

    name: str
    api: ApiKind
    base_url: str
    source: str
    credential: Credential = NO_CREDENTIAL
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise ValueError(f"upstream name must match {NAME_RE.pattern}, not {self.name!r}")

    @property
    def shown_url(self) -> str:
        """``base_url`` for people: a password in its userinfo hidden."""
        url = urlsplit(self.base_url)
        if url.password is None:
            return self.base_url
        user = url.username or ""
        host = url.netloc.rpartition("@")[2]
        return url._replace(netloc=f"{user}:***@{host}").geturl()

    @property
    def secrets(self) -> tuple[str, ...]:
        """Static credential values: the credential, each header value and, for an
        ``Authorization``-style value, the token after its scheme."""
        found = list(self.credential.secrets)
        for _, value in self.headers:
            found.append(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.isalpha():
                found.append(token.strip())
        password = urlsplit(self.base_url).password
        found += [password] if password else []
        return tuple(v for v in found if len(v) >= 8)


# Model API families as plain environment variables define them (the custom harness, and
# what harnesses without their own reader start from): default upstream, the base-URL
# variable, key variables and how each is sent.
FAMILIES: dict[ApiKind, tuple[str, str, tuple[tuple[str, AuthHeader], ...]]] = {
    "anthropic": (
        "https://api.anthropic.com",
        "ANTHROPIC_BASE_URL",
        (("ANTHROPIC_API_KEY", "x-api-key"), ("ANTHROPIC_AUTH_TOKEN", "bearer")),
    ),
    "openai": ("https://api.openai.com/v1", "OPENAI_BASE_URL", (("OPENAI_API_KEY", "bearer"),)),
}


def env_upstreams(host_env: Mapping[str, str]) -> tuple[Upstream, ...]:
    """The model endpoints the plain environment names (``ANTHROPIC_BASE_URL`` and
    ``ANTHROPIC_API_KEY``/``ANTHROPIC_AUTH_TOKEN``, ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY``), the vendors' defaults otherwise: one upstream per family."""
    found: list[Upstream] = []
    for family, (default, base_var, keys) in FAMILIES.items():
        upstream = host_env.get(base_var) or default
        if family == "openai" and not urlsplit(upstream).path.strip("/"):
            upstream = upstream.rstrip("/") + "/v1"  # a bare host means its /v1 API, as for SDKs
        source = f"env {base_var}" if host_env.get(base_var) else "built-in default"
        key = next(((var, style) for var, style in keys if host_env.get(var)), None)
        credential = NO_CREDENTIAL
        if key is not None:
            var, style = key
            kind = "API key" if style == "x-api-key" or var.endswith("API_KEY") else "auth token"
            credential = Credential(kind, f"env {var}", style, host_env[var])
        found.append(Upstream(family, family, upstream, source, credential))
    return tuple(found)
