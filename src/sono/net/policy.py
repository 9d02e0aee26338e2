"""Which hosts a sandbox may reach: the network half of the security policy.

A :class:`NetworkPolicy` has a ``mode`` and two lists of entries (:func:`parse_entry`):

- ``"github.com"``: that host exactly (case-insensitive, a trailing dot ignored);
- ``".example.org"``: example.org itself and every subdomain;
- ``"10.0.0.0/8"``, ``"::1/128"``, ``"1.2.3.4"``: addresses, by CIDR.

:func:`decide` judges one connection from the host the client asked for and every address
it resolved to (the caller resolves once and then connects only to those addresses):

1. ``mode="none"`` denies everything.
2. A deny entry matching the name, or covering any address, denies (deny wins).
3. Always-dangerous addresses (:func:`danger`: private, loopback, link-local and the cloud
   metadata address, CGNAT, 0/8, multicast, reserved, unspecified, IPv4 embedded in IPv6
   such as ``::ffff:127.0.0.1``) deny unless an **IP/CIDR allow entry** covers that very
   address. A hostname entry never unlocks them: allowing ``git.corp`` does not let it
   resolve to 10.1.2.3, so a hijacked or rebinding DNS answer cannot reach the host's
   network; allow ``10.1.2.3/32`` as well for that. The metadata host names
   (:data:`METADATA_HOSTS`) are likewise denied unless listed exactly by name (and their
   address is link-local, so it needs a CIDR entry too).
4. Every resolved address must pass: one private address among public ones denies the
   whole request (DNS rebinding).
5. ``mode="open"`` then allows; ``mode="allowlist"`` requires the name to match a hostname
   or suffix entry, or an IP literal to be covered by an IP/CIDR entry.

:func:`precheck` is the name-only part (1, 2 for names, 5, metadata names): callers run it
before resolving so a name that would be denied anyway never reaches DNS (no exfiltration
through lookups). Ports are not restricted: an allowed host is allowed on any port.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MODES = ("none", "allowlist", "open")

METADATA_HOSTS = frozenset(
    {
        "metadata.google.internal",
        "metadata.goog",
        "metadata",
        "instance-data",
        "instance-data.ec2.internal",
    }
)

_DANGEROUS: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), label)
    for net, label in (
        ("0.0.0.0/8", "this-network"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier-grade NAT"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.169.254/32", "cloud metadata"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fd00:ec2::254/128", "cloud metadata"),
        ("fc00::/7", "private"),
        ("fe80::/10", "link-local"),
        ("ff00::/8", "multicast"),
    )
)
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")

_LABEL_RE = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


@dataclass(frozen=True)
class Entry:
    """One parsed allow/deny entry. ``value`` is the normalised host, suffix (without its
    dot) or network; ``text`` is how to show it."""

    kind: Literal["host", "suffix", "network"]
    value: str
    network: IPNetwork | None = None

    @property
    def text(self) -> str:
        return "." + self.value if self.kind == "suffix" else self.value

    def matches_name(self, host: str) -> bool:
        """``host`` must already be normalised (:func:`normalize_host`)."""
        if self.kind == "host":
            return host == self.value
        if self.kind == "suffix":
            return host == self.value or host.endswith("." + self.value)
        return False

    def covers(self, address: IPAddress) -> bool:
        if self.network is None:
            return False
        address = canonical(address)
        return address.version == self.network.version and address in self.network


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


@dataclass(frozen=True)
class NetworkPolicy:
    """``mode`` is ``"none"``, ``"allowlist"`` or ``"open"``; entries as in
    :func:`parse_entry` (invalid ones raise ``ValueError`` here, at construction)."""

    mode: str = "none"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    allow_entries: tuple[Entry, ...] = field(init=False, repr=False, compare=False)
    deny_entries: tuple[Entry, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"network mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        object.__setattr__(self, "allow", tuple(self.allow))
        object.__setattr__(self, "deny", tuple(self.deny))
        object.__setattr__(self, "allow_entries", tuple(parse_entry(e) for e in self.allow))
        object.__setattr__(self, "deny_entries", tuple(parse_entry(e) for e in self.deny))


def parse_entry(text: str) -> Entry:
    """``"host.name"``, ``".suffix.name"``, ``"1.2.3.4"`` or ``"10.0.0.0/8"``; anything
    else raises ``ValueError`` saying what is wrong."""
    raw = text.strip()
    if not raw:
        raise ValueError("empty network entry")
    if any(c.isspace() for c in raw):
        raise ValueError(f"network entry {text!r} contains whitespace")
    if "://" in raw:
        raise ValueError(f"network entry {text!r} is a URL; give the host name only")
    if "/" in raw:
        try:
            net = ipaddress.ip_network(raw.strip("[]"), strict=True)
        except ValueError as exc:
            raise ValueError(f"network entry {text!r} is not a valid CIDR: {exc}") from None
        net = _canonical_net(net)
        return Entry("network", str(net), net)
    literal = _ip(raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw)
    if literal is not None:
        net = ipaddress.ip_network(canonical(literal))
        return Entry("network", str(net), net)
    if raw.startswith("."):
        suffix = normalize_host(raw[1:])
        if suffix is None or suffix.startswith("."):
            raise ValueError(f"network entry {text!r} is not a valid domain suffix")
        return Entry("suffix", suffix)
    host = normalize_host(raw)
    if host is None:
        hint = " (use .example.org for a domain and its subdomains)" if "*" in raw else ""
        raise ValueError(f"network entry {text!r} is not a valid host name{hint}")
    return Entry("host", host)


def normalize_host(host: str) -> str | None:
    """Lower-case, without brackets or a trailing dot; ``None`` when not a host name or
    IP literal (ports, paths, non-ASCII and empty labels are all rejected)."""
    name = host.strip()
    bracketed = name.startswith("[") and name.endswith("]")
    literal = _ip(name[1:-1] if bracketed else name)
    if literal is not None:
        return str(literal)
    if bracketed:
        return None
    name = name.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > 253 or not name.isascii():
        return None
    if not all(_LABEL_RE.fullmatch(label) for label in name.split(".")):
        return None
    return name


def canonical(address: IPAddress) -> IPAddress:
    """IPv4-mapped IPv6 (``::ffff:a.b.c.d``) as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def danger(address: IPAddress) -> str | None:
    """Why ``address`` must not be reached by default (``"loopback"``, ``"private"``, ...),
    or ``None`` for an ordinary public address. IPv4 addresses embedded in IPv6 (mapped,
    compatible, 6to4, Teredo, NAT64) are judged as themselves."""
    address = canonical(address)
    for net, label in _DANGEROUS:
        if address.version == net.version and address in net:
            return label
    for inner in _embedded_v4(address):
        why = danger(inner)
        if why is not None:
            return f"{why} (embedded in {address})"
    if not address.is_global:
        return "not globally routable"
    return None


def precheck(policy: NetworkPolicy, host: str, port: int) -> Decision | None:
    """The checks that need no DNS: a denial, or ``None`` when resolving may go ahead."""
    if not 0 < port < 65536:
        return Decision(False, f"invalid port {port}")
    name = normalize_host(host)
    if name is None:
        return Decision(False, f"invalid host name {host!r}")
    if policy.mode == "none":
        return Decision(False, "network access is disabled (network mode none)")
    literal = _ip(name)
    if literal is not None:
        return _precheck_literal(policy, name, literal)
    return _precheck_name(policy, name)


def _precheck_name(policy: NetworkPolicy, name: str) -> Decision | None:
    entry = _matching(policy.deny_entries, name)
    if entry is not None:
        return Decision(False, f"{name} is deny-listed ({entry.text})")
    exact = any(e.kind == "host" and e.value == name for e in policy.allow_entries)
    if name in METADATA_HOSTS and not exact:
        return Decision(False, f"{name} is a cloud metadata host")
    if policy.mode == "allowlist" and _matching(policy.allow_entries, name) is None:
        return Decision(False, f"{name} is not on the allowlist")
    return None


def _precheck_literal(policy: NetworkPolicy, name: str, literal: IPAddress) -> Decision | None:
    entry = _covering(policy.deny_entries, literal)
    if entry is not None:
        return Decision(False, f"{name} is deny-listed ({entry.text})")
    if policy.mode == "allowlist" and _covering(policy.allow_entries, literal) is None:
        return Decision(False, f"{name} is not on the allowlist")
    return None


def decide(policy: NetworkPolicy, host: str, port: int, addresses: Sequence[IPAddress]) -> Decision:
    """May a client connect to ``host:port``, which resolved to ``addresses``? Allowed
    only if every address is acceptable; for an IP literal host, ``addresses`` may be
    empty (the literal itself is used)."""
    early = precheck(policy, host, port)
    if early is not None:
        return early
    name = normalize_host(host) or host
    literal = _ip(name)
    addrs = [canonical(a) for a in addresses] or ([canonical(literal)] if literal else [])
    if not addrs:
        return Decision(False, f"{name} did not resolve to any address")
    for address in addrs:
        entry = _covering(policy.deny_entries, address)
        if entry is not None:
            return Decision(False, f"{name} resolves to {address}, deny-listed ({entry.text})")
    for address in addrs:
        label = danger(address)
        if label is not None and _covering(policy.allow_entries, address) is None:
            where = "is" if literal is not None else f"resolves to {address},"
            return Decision(
                False, f"{name} {where} a {label} address (allow it by IP or CIDR to permit)"
            )
    if policy.mode == "open":
        return Decision(True, "network mode open")
    entry = (
        _matching(policy.allow_entries, name)
        if literal is None
        else _covering(policy.allow_entries, literal)
    )
    return Decision(True, f"allowed by {entry.text if entry else 'the allowlist'}")


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _canonical_net(net: IPNetwork) -> IPNetwork:
    """``::ffff:10.0.0.0/104`` as ``10.0.0.0/8``, so it matches canonical addresses."""
    mapped = ipaddress.IPv6Network("::ffff:0:0/96")
    if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(mapped):
        v4 = net.network_address.ipv4_mapped
        assert v4 is not None
        return ipaddress.IPv4Network(f"{v4}/{net.prefixlen - 96}")
    return net


def _embedded_v4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found: list[ipaddress.IPv4Address] = []
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if any(address in net for net in _NAT64) or (address in _V4_COMPATIBLE and int(address) > 1):
        found.append(low32)
    return found


def _matching(entries: Iterable[Entry], name: str) -> Entry | None:
    return next((e for e in entries if e.matches_name(name)), None)


def _covering(entries: Iterable[Entry], address: IPAddress) -> Entry | None:
    return next((e for e in entries if e.covers(address)), None)
