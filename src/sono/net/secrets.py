"""Secrets: named values from the host that the sandbox only ever sees as placeholders.

A ``[secrets.NAME]`` entry (:class:`Secret`, read from the settings) takes its value from
a host environment variable or a file and lists the hosts it may be sent to (policy entries:
``host``, ``.suffix``, ``IP/CIDR``). :func:`resolve` reads the values once per session
and gives each a random placeholder ``so-secret-NAME-<16 hex>``; the sandbox gets
``NAME=<placeholder>`` (:func:`sandbox_env`) and never the value.

The egress proxy (:mod:`sono.net.proxy`) terminates TLS for the hosts some secret is
bound to and runs every request's headers through :func:`substitute_headers`: a
placeholder of a secret bound to that host, in the *value* of one of the headers the
secret is bound to (``headers = [...]`` in its config; by default
:data:`DEFAULT_HEADERS`), becomes the real value. A placeholder anywhere else (a header
name, another header such as ``Cookie`` or ``Origin`` that servers echo back, the request
line) or of a secret not bound to the host refuses the request (:class:`Unbound`,
answered ``403`` and logged). Request bodies pass through untouched.

Whatever the upstream answers, the sandbox never gets a value back: every response head
and body from an intercepted host goes through a :class:`Scrubber`, which masks each
value (and its JSON- and URL-escaped forms) with ``*`` of the same length, across chunk
boundaries.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sono.errors import SoError
from sono.net.policy import Entry, normalize_host, parse_entry

PLACEHOLDER_PREFIX = "so-secret-"
# The headers a secret goes into when its config names none: where APIs take a key.
DEFAULT_HEADERS = ("authorization", "x-api-key")
MASK = b"*"
_PRINTABLE = re.compile(r"[\x20-\x7e]+")


@dataclass(frozen=True)
class Secret:
    """A named value from the host (env var or file) that may be sent only to ``hosts``."""

    name: str
    env: str | None
    file: str | None
    hosts: tuple[str, ...]
    # The request headers whose values may carry it (lower-case); () = the defaults of
    # :data:`DEFAULT_HEADERS`.
    headers: tuple[str, ...] = ()


@dataclass(frozen=True)
class BoundSecret:
    """A secret's value (hidden from ``repr``), its placeholder and where it may go."""

    name: str
    value: str = field(repr=False)
    placeholder: str
    hosts: tuple[str, ...]
    headers: tuple[str, ...] = DEFAULT_HEADERS  # lower-case names
    entries: tuple[Entry, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "headers", tuple(h.lower() for h in self.headers))
        object.__setattr__(self, "entries", tuple(parse_entry(h) for h in self.hosts))

    def bound_to(self, host: str) -> bool:
        """May the value be sent to ``host`` (a name, or an IP literal)? Names match
        ``host`` and ``.suffix`` entries; IP literals match IP/CIDR entries."""
        name = normalize_host(host)
        if name is None:
            return False
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return any(entry.matches_name(name) for entry in self.entries)
        return any(entry.covers(address) for entry in self.entries)


class Unbound(Exception):
    """A request to ``host`` carries the placeholder of a secret not bound to it (or
    where the secret may not go: ``where`` says)."""

    def __init__(self, secret: str, host: str, where: str = "") -> None:
        reason = where or f"is not bound to {host}"
        super().__init__(f"secret {secret} {reason}")
        self.secret = secret
        self.host = host


def resolve(secrets: Sequence[Secret], host_env: Mapping[str, str]) -> list[BoundSecret]:
    """Read every secret's value (one trailing newline stripped) and give it a fresh
    placeholder; a missing or unusable value raises :class:`SoError`."""
    from secrets import token_hex  # random, hmac, base64: only when there are secrets

    return [
        BoundSecret(
            s.name,
            _value(s, host_env),
            f"{PLACEHOLDER_PREFIX}{s.name}-{token_hex(8)}",
            s.hosts,
            s.headers or DEFAULT_HEADERS,
        )
        for s in secrets
    ]


def sandbox_env(bound: Sequence[BoundSecret]) -> dict[str, str]:
    """``NAME -> placeholder`` for the sandbox's environment."""
    return {b.name: b.placeholder for b in bound}


def bound_to(bound: Sequence[BoundSecret], host: str) -> list[BoundSecret]:
    """The secrets that may be sent to ``host``."""
    return [b for b in bound if b.bound_to(host)]


def placeholders_in(data: bytes, bound: Sequence[BoundSecret]) -> list[BoundSecret]:
    """The secrets whose placeholder occurs in ``data``."""
    return [b for b in bound if b.placeholder.encode() in data]


def substitute_headers(
    headers: Sequence[tuple[str, str]], bound: Sequence[BoundSecret], host: str
) -> list[tuple[str, str]]:
    """``headers`` with each placeholder replaced by its value, only in the value of a
    header its secret is bound to, for a ``host`` it is bound to. Raises :class:`Unbound`
    for a placeholder anywhere else: a header name, another header (which a server may
    echo back: ``Cookie``, ``Origin``, ``X-Request-Id``), or another host."""
    out: list[tuple[str, str]] = []
    for name, value in headers:
        for secret in placeholders_in(name.encode("latin-1"), bound):
            raise Unbound(secret.name, host, "may not be sent in a header name")
        present = placeholders_in(value.encode("latin-1"), bound)
        for secret in present:
            if not secret.bound_to(host):
                raise Unbound(secret.name, host)
            if name.lower() not in secret.headers:
                allowed = ", ".join(secret.headers)
                raise Unbound(secret.name, host, f"may be sent only in the headers {allowed}")
        sent = value
        for secret in present:
            sent = sent.replace(secret.placeholder, secret.value)
        out.append((name, sent))
    return out


def _forms(value: str) -> set[bytes]:
    """The ways a server may echo ``value`` back: as sent, JSON-escaped, URL-encoded."""
    import json
    from urllib.parse import quote, quote_plus

    forms = {value, json.dumps(value)[1:-1], json.dumps(value)[1:-1].replace("/", "\\/")}
    forms |= {quote(value, safe=""), quote_plus(value, safe="")}
    return {f.encode() for f in forms if f}


class Scrubber:
    """Masks the secrets' values in a byte stream fed piece by piece: a value split
    across pieces is still found (the last ``longest - 1`` bytes are held back until the
    next piece or :meth:`flush` when they could begin one). The output has exactly the
    input's length."""

    def __init__(self, bound: Sequence[BoundSecret]) -> None:
        forms = sorted({f for b in bound for f in _forms(b.value)}, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(f) for f in forms)) if forms else None
        self._forms = forms
        self._keep = max((len(f) for f in forms), default=1) - 1
        self._tail = b""

    def scrub(self, data: bytes) -> bytes:
        """``data`` masked at once (a whole message, no holding back)."""
        if self._pattern is None:
            return data
        return self._pattern.sub(lambda m: MASK * len(m.group(0)), data)

    def feed(self, data: bytes) -> bytes:
        if self._pattern is None:
            return data
        buffer = self.scrub(self._tail + data)
        cut = len(buffer) - self._held(buffer)
        self._tail = buffer[cut:]
        return buffer[:cut]

    def _held(self, buffer: bytes) -> int:
        """How many bytes at the end could begin a value (held back for the next piece;
        none in the usual case, so a stream is not delayed)."""
        for size in range(min(self._keep, len(buffer)), 0, -1):
            end = buffer[-size:]
            if any(form.startswith(end) for form in self._forms):
                return size
        return 0

    def flush(self) -> bytes:
        tail, self._tail = self._tail, b""
        return self.scrub(tail)


def _value(secret: Secret, host_env: Mapping[str, str]) -> str:
    fix = f"or change [secrets.{secret.name}] in so's config"
    if secret.env is not None:
        where = f"environment variable {secret.env}"
        raw = host_env.get(secret.env)
        if raw is None:
            raise SoError(f"secret {secret.name}: {where} is not set; export it, {fix}")
    else:
        assert secret.file is not None
        where = f"file {secret.file}"
        try:
            raw = Path(secret.file).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SoError(
                f"secret {secret.name}: {where} does not exist; create it, {fix}"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise SoError(f"secret {secret.name}: cannot read {where}: {reason}; {fix}") from None
    value = raw.removesuffix("\n").removesuffix("\r")
    if not value:
        raise SoError(f"secret {secret.name}: {where} is empty; set a value, {fix}")
    if not _PRINTABLE.fullmatch(value):
        raise SoError(
            f"secret {secret.name}: the value in {where} has line breaks, control or "
            "non-ASCII characters, which an HTTP header cannot carry"
        )
    return value
