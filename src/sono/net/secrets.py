"""Secrets: named values from the host that the sandbox only ever sees as placeholders.

A ``[secrets.NAME]`` entry (:class:`sono.config.Secret`) takes its value from a host
environment variable or a file and lists the hosts it may be sent to (policy entries:
``host``, ``.suffix``, ``IP/CIDR``). :func:`resolve` reads the values once per session
and gives each a random placeholder ``so-secret-NAME-<16 hex>``; the sandbox gets
``NAME=<placeholder>`` (:func:`sandbox_env`) and never the value.

The egress proxy (:mod:`sono.net.proxy`) terminates TLS for the hosts some secret is
bound to and runs every request head through :func:`substitute`: a placeholder of a
secret bound to that host becomes the real value; a placeholder of any other secret of
the session refuses the request (:class:`Unbound`, answered ``403`` and logged). Only the
request line and headers are rewritten: request bodies pass through untouched unless the
proxy is built with ``substitute_body=True``. Responses are never rewritten.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex

from sono.config import Secret
from sono.errors import SoError
from sono.net.policy import Entry, normalize_host, parse_entry

PLACEHOLDER_PREFIX = "so-secret-"
_PRINTABLE = re.compile(r"[\x20-\x7e]+")


@dataclass(frozen=True)
class BoundSecret:
    """A secret's value (hidden from ``repr``), its placeholder and where it may go."""

    name: str
    value: str = field(repr=False)
    placeholder: str
    hosts: tuple[str, ...]
    entries: tuple[Entry, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(self.hosts))
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
    """A request to ``host`` carries the placeholder of a secret not bound to it."""

    def __init__(self, secret: str, host: str) -> None:
        super().__init__(f"secret {secret} is not bound to {host}")
        self.secret = secret
        self.host = host


def resolve(secrets: Sequence[Secret], host_env: Mapping[str, str]) -> list[BoundSecret]:
    """Read every secret's value (one trailing newline stripped) and give it a fresh
    placeholder; a missing or unusable value raises :class:`SoError`."""
    return [
        BoundSecret(
            s.name, _value(s, host_env), f"{PLACEHOLDER_PREFIX}{s.name}-{token_hex(8)}", s.hosts
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


def substitute(data: bytes, bound: Sequence[BoundSecret], host: str) -> bytes:
    """``data`` with each placeholder of a secret bound to ``host`` replaced by its value
    (one pass: a value is never scanned again). Raises :class:`Unbound` when a placeholder
    of another secret in ``bound`` occurs."""
    present = placeholders_in(data, bound)
    if not present:
        return data
    for secret in present:
        if not secret.bound_to(host):
            raise Unbound(secret.name, host)
    values = {s.placeholder.encode(): s.value.encode() for s in present}
    pattern = re.compile(b"|".join(re.escape(p) for p in values))
    return pattern.sub(lambda m: values[m.group(0)], data)


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
