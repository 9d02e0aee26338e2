"""The network policy: entry parsing and the decision table."""

from __future__ import annotations

import ipaddress

import pytest

from sono.net.policy import (
    Decision,
    NetworkPolicy,
    danger,
    decide,
    normalize_host,
    parse_entry,
    precheck,
)

PUBLIC = "93.184.216.34"
PUBLIC6 = "2606:2800:220:1:248:1893:25c8:1946"


def check(policy: NetworkPolicy, host: str, *addresses: str, port: int = 443) -> Decision:
    return decide(policy, host, port, [ipaddress.ip_address(a) for a in addresses])


def allowlist(*allow: str, deny: tuple[str, ...] = ()) -> NetworkPolicy:
    return NetworkPolicy("allowlist", allow, deny)


# --- parse_entry ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("github.com", "host", "github.com"),
        ("GitHub.COM.", "host", "github.com"),
        (".example.org", "suffix", "example.org"),
        (".Example.Org.", "suffix", "example.org"),
        ("10.0.0.0/8", "network", "10.0.0.0/8"),
        ("::1/128", "network", "::1/128"),
        ("1.2.3.4", "network", "1.2.3.4/32"),
        ("[::1]", "network", "::1/128"),
        ("::ffff:10.0.0.0/104", "network", "10.0.0.0/8"),
        ("  pypi.org  ", "host", "pypi.org"),
        ("under_score.example", "host", "under_score.example"),
    ],
)
def test_parse_entry_accepts(text: str, kind: str, value: str) -> None:
    entry = parse_entry(text)
    assert (entry.kind, entry.value) == (kind, value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("git hub.com", "whitespace"),
        ("http://example.org", "URL"),
        ("10.0.0.0/33", "not a valid CIDR"),
        ("10.0.0.1/8", "host bits set"),
        ("not-an-ip/8", "not a valid CIDR"),
        ("*.example.org", "use .example.org"),
        ("a..b", "not a valid host name"),
        ("-bad.com", "not a valid host name"),
        ("host:8080", "not a valid host name"),
        ("bücher.de", "not a valid host name"),
        ("..example.org", "suffix"),
        ("[github.com]", "not a valid host name"),
        ("x" * 64 + ".com", "not a valid host name"),
    ],
)
def test_parse_entry_rejects_garbage(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_entry(text)


def test_policy_validates_mode_and_entries_at_construction() -> None:
    with pytest.raises(ValueError, match="network mode"):
        NetworkPolicy("sometimes")
    with pytest.raises(ValueError, match="URL"):
        NetworkPolicy("allowlist", ("https://github.com",))
    policy = NetworkPolicy("allowlist", ("github.com",))
    assert policy == NetworkPolicy("allowlist", ("github.com",))
    assert [e.text for e in policy.allow_entries] == ["github.com"]


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("github.com", True),
        ("GITHUB.com.", True),
        ("api.github.com", False),  # exact entries do not cover subdomains
        ("notgithub.com", False),
        ("example.org", True),  # the suffix covers the domain itself
        ("a.b.example.org", True),
        ("badexample.org", False),  # ...but only at a label boundary
        ("example.org.evil.com", False),
    ],
)
def test_allowlist_matches_exact_and_suffix(host: str, allowed: bool) -> None:
    policy = allowlist("github.com", ".example.org")
    assert check(policy, host, PUBLIC).allowed is allowed


def test_allowlist_needs_a_name_match_even_for_public_addresses() -> None:
    decision = check(allowlist("github.com"), "gitlab.com", PUBLIC)
    assert not decision.allowed
    assert "not on the allowlist" in decision.reason


def test_deny_wins_over_allow() -> None:
    policy = allowlist(".example.org", deny=("secret.example.org",))
    assert check(policy, "www.example.org", PUBLIC).allowed
    decision = check(policy, "secret.example.org", PUBLIC)
    assert not decision.allowed
    assert "deny-listed" in decision.reason


def test_deny_by_cidr_applies_to_resolved_addresses() -> None:
    policy = NetworkPolicy("open", deny=("93.184.0.0/16",))
    decision = check(policy, "example.com", PUBLIC)
    assert not decision.allowed
    assert "93.184.0.0/16" in decision.reason
    assert check(policy, "example.net", "1.1.1.1").allowed


def test_mode_none_denies_everything() -> None:
    policy = NetworkPolicy("none", allow=("github.com", "0.0.0.0/0"))
    assert not check(policy, "github.com", PUBLIC).allowed
    assert "disabled" in check(policy, PUBLIC, PUBLIC).reason


def test_mode_open_allows_public_hosts_and_literals() -> None:
    policy = NetworkPolicy("open")
    assert check(policy, "anything.example", PUBLIC, PUBLIC6).allowed
    assert check(policy, PUBLIC).allowed  # a literal host needs no addresses
    assert check(policy, f"[{PUBLIC6}]").allowed


def test_allowlist_literal_ip_needs_a_covering_cidr() -> None:
    policy = allowlist("1.1.1.0/24")
    assert check(policy, "1.1.1.1").allowed
    assert not check(policy, "8.8.8.8").allowed
    assert not check(allowlist("github.com"), PUBLIC).allowed


# --- dangerous addresses -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "label"),
    [
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "cloud metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("0.0.0.0", "this-network"),
        ("0.1.2.3", "this-network"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("::", "unspecified"),
        ("255.255.255.255", "reserved"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped IPv6 is the IPv4 address
        ("::ffff:169.254.169.254", "cloud metadata"),
        ("::ffff:10.0.0.1", "private"),
        ("2002:7f00:1::1", "loopback"),  # 6to4 around 127.0.0.1
        ("64:ff9b::a9fe:a9fe", "cloud metadata"),  # NAT64 of 169.254.169.254
        ("2001:db8::1", "not globally routable"),
    ],
)
def test_dangerous_addresses(address: str, label: str) -> None:
    reason = danger(ipaddress.ip_address(address))
    assert reason is not None and reason.startswith(label)
    decision = check(NetworkPolicy("open"), "some.host", address)
    assert not decision.allowed
    assert address in decision.reason or "some.host" in decision.reason


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", PUBLIC, PUBLIC6, "172.32.0.1"])
def test_public_addresses_are_not_dangerous(address: str) -> None:
    assert danger(ipaddress.ip_address(address)) is None


def test_mapped_literal_host_is_judged_as_ipv4() -> None:
    decision = check(NetworkPolicy("open"), "::ffff:127.0.0.1")
    assert not decision.allowed
    assert "loopback" in decision.reason


def test_dangerous_address_needs_an_explicit_cidr_not_just_a_name() -> None:
    by_name = allowlist("git.corp")
    assert not check(by_name, "git.corp", "10.1.2.3").allowed
    by_cidr = allowlist("git.corp", "10.1.0.0/16")
    assert check(by_cidr, "git.corp", "10.1.2.3").allowed
    assert not check(by_cidr, "git.corp", "10.2.0.1").allowed
    # A mapped address is covered by the IPv4 entry too.
    assert check(by_cidr, "git.corp", "::ffff:10.1.2.3").allowed
    # Open mode: a CIDR entry unlocks that range, nothing else.
    open_local = NetworkPolicy("open", ("127.0.0.1/32",))
    assert check(open_local, "127.0.0.1").allowed
    assert not check(open_local, "127.0.0.2").allowed


def test_rebinding_one_private_address_among_public_ones_denies() -> None:
    policy = allowlist("rebind.example")
    assert check(policy, "rebind.example", PUBLIC, PUBLIC6).allowed
    decision = check(policy, "rebind.example", PUBLIC, "127.0.0.1")
    assert not decision.allowed
    assert "127.0.0.1" in decision.reason
    assert not check(NetworkPolicy("open"), "rebind.example", "192.168.0.10", PUBLIC).allowed


def test_metadata_host_is_denied_by_name_before_any_lookup() -> None:
    for mode in ("open", "allowlist"):
        policy = NetworkPolicy(mode, (".internal", ".google.internal"))
        early = precheck(policy, "metadata.google.internal", 80)
        assert early is not None and not early.allowed
        assert "metadata" in early.reason
        assert not check(policy, "Metadata.Google.Internal.", PUBLIC).allowed


def test_unresolved_name_is_denied() -> None:
    decision = check(NetworkPolicy("open"), "nowhere.example")
    assert not decision.allowed
    assert "did not resolve" in decision.reason


@pytest.mark.parametrize(
    ("host", "port"), [("bad host", 443), ("a..b", 443), ("ok.example", 0), ("ok.example", 70000)]
)
def test_invalid_host_or_port_is_denied(host: str, port: int) -> None:
    assert not check(NetworkPolicy("open"), host, PUBLIC, port=port).allowed


def test_precheck_denies_names_without_dns_and_lets_candidates_through() -> None:
    policy = allowlist("github.com", deny=(".evil.test",))
    assert precheck(policy, "github.com", 443) is None
    for host in ("gitlab.com", "x.evil.test"):
        early = precheck(policy, host, 443)
        assert early is not None and not early.allowed
    assert precheck(NetworkPolicy("open"), "anything.test", 443) is None


def test_normalize_host() -> None:
    assert normalize_host("GitHub.com.") == "github.com"
    assert normalize_host("[::1]") == "::1"
    assert normalize_host("::FFFF:127.0.0.1") == "::ffff:7f00:1"
    assert normalize_host("[github.com]") is None
    assert normalize_host("host:80") is None
    assert normalize_host("") is None
