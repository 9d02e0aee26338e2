"""Project-config trust: the rules per kind of key, the one-line refusal, the trust store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sono import trust as t
from sono.trust import HOST, POLICY, SAFE, Finding, TrustStore, digest, findings

# ---------------------------------------------------------------- rules


def test_safe_takes_any_value() -> None:
    assert t.safe().check("anything", None) is None
    assert t.safe().kind == SAFE


def test_host_needs_trust_for_a_new_command_but_not_to_repeat_or_unset_one() -> None:
    rule = t.host("runs on your host")
    assert rule.kind == HOST
    assert rule.check("sh -c 'touch /tmp/x'", None) == "runs on your host"
    assert rule.check("sh -c 'touch /tmp/x'", "less -R") == "runs on your host"
    assert rule.check("less -R", "less -R") is None  # the user's own value
    assert rule.check(None, "less -R") is None  # back to the user's choice ($PAGER)


@pytest.mark.parametrize(
    ("value", "lower", "widens"),
    [
        ("none", "allowlist", False),
        ("allowlist", "allowlist", False),
        ("open", "allowlist", True),
        ("allowlist", "none", True),
        ("bogus", "none", True),  # never seen: counts as loosest
    ],
)
def test_ordered_allows_equal_or_stricter(value: str, lower: str, widens: bool) -> None:
    rule = t.ordered(("none", "allowlist", "open"))
    assert rule.kind == POLICY
    assert (rule.check(value, lower) is not None) is widens


@pytest.mark.parametrize(
    ("value", "lower", "detail"),
    [
        (1024, None, None),  # adding a limit tightens
        (512, 1024, None),
        (1024, 1024, None),
        (2048, 1024, "2048 is above 1024"),
        (None, 1024, "removes the limit 1024"),
        (1.5, 2.0, None),
    ],
)
def test_at_most_lowers_or_adds_a_limit(
    value: float | None, lower: float | None, detail: str | None
) -> None:
    assert t.at_most().check(value, lower) == detail


def test_subset_refuses_additions() -> None:
    rule = t.subset()
    assert rule.check(("a.example",), ("a.example", "b.example")) is None
    assert rule.check((), ("a.example",)) is None
    assert rule.check(("evil.example",), ("a.example",)) == 'adds "evil.example"'


def test_superset_refuses_removals() -> None:
    rule = t.superset()
    assert rule.check((".env", "*.pem", "*.db"), (".env", "*.pem")) is None
    assert rule.check(("*.pem",), (".env", "*.pem")) == 'drops ".env"'


def test_subset_names_secrets_by_name() -> None:
    from sono.net.secrets import Secret

    mine = Secret("GH", "GH_TOKEN", None, ("api.github.com",))
    theirs = Secret("KEY", None, "/root/.ssh/id_ed25519", ("evil.example",))
    assert t.subset().check((mine,), (mine,)) is None
    assert t.subset().check((theirs,), (mine,)) == "adds [secrets.KEY]"


def test_unless_chosen_lets_the_project_choose_only_under_the_default() -> None:
    rule = t.unless_chosen("auto")
    assert rule.check("bwrap", "auto") is None
    assert rule.check("docker", "docker") is None
    assert rule.check("bwrap", "microvm") == 'replaces your "microvm" with "bwrap"'


def test_same_or_allows_the_value_below_or_the_free_one() -> None:
    rule = t.same_or("custom", "copies its credential files")
    assert rule.check("claude", "claude") is None
    assert rule.check("custom", "claude") is None
    detail = rule.check("codex", "claude")
    assert detail == '"codex" instead of "claude" copies its credential files'


def test_findings_skip_safe_keys_and_keep_order() -> None:
    rules = {"iterations": t.safe(), "pager": t.host("runs on your host"), "n": t.at_most()}
    found = findings({"iterations": 99, "pager": "x", "n": 5}, {"n": 1}, rules)
    assert found == (
        Finding("pager", HOST, "runs on your host"),
        Finding("n", POLICY, "5 is above 1"),
    )


def test_untrusted_message_is_one_line_with_file_keys_reasons_and_fix(tmp_path: Path) -> None:
    path = tmp_path / ".so" / "config.toml"
    found = [
        Finding("pager", HOST, "runs on your host"),
        Finding("network.mode", POLICY, '"open" is looser than "allowlist"'),
    ]
    message = t.untrusted_message(path, tmp_path, found, changed=False)
    assert "\n" not in message
    assert message.startswith(f"{path} is not trusted and sets keys that run on your host (pager)")
    assert 'widen the sandbox policy (network.mode: "open" is looser than "allowlist")' in message
    assert f"Review .so/config.toml, then run `so trust` in {tmp_path}" in message
    assert "remove those keys" in message
    changed = t.untrusted_message(path, tmp_path, found[1:], changed=True)
    assert "changed since you trusted it" in changed
    assert "run on your host" not in changed


# ---------------------------------------------------------------- the store


def test_digest_is_sha256_of_the_bytes() -> None:
    assert digest(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_trust_and_revoke(tmp_path: Path) -> None:
    store = TrustStore(tmp_path / "state" / "trust.json")
    project = tmp_path / "project"
    project.mkdir()
    assert store.trusted_digest(project) is None
    store.trust(project, "a" * 64, file=project / ".so" / "config.toml")
    assert store.is_trusted(project, "a" * 64)
    assert not store.is_trusted(project, "b" * 64)
    assert not store.is_trusted(tmp_path, "a" * 64)  # another project
    assert (store.path.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in store.path.parent.iterdir()] == ["trust.json"]  # no temp left
    data = json.loads(store.path.read_text())
    assert data["projects"][str(project)]["sha256"] == "a" * 64
    assert store.revoke(project)
    assert not store.revoke(project)
    assert store.trusted_digest(project) is None


def test_the_project_path_is_resolved(tmp_path: Path) -> None:
    store = TrustStore(tmp_path / "trust.json")
    project = tmp_path / "project"
    project.mkdir()
    link = tmp_path / "link"
    link.symlink_to(project)
    store.trust(link, "a" * 64, file=link / ".so" / "config.toml")
    assert store.is_trusted(project, "a" * 64)


@pytest.mark.parametrize(
    "content", ["{not json", "[]", '{"projects": []}', '{"projects": {"/p": 1}}']
)
def test_a_garbled_store_trusts_nothing(tmp_path: Path, content: str) -> None:
    store = TrustStore(tmp_path / "trust.json")
    store.path.write_text(content)
    assert store.trusted_digest(Path("/p")) is None
    store.trust(Path("/p"), "c" * 64, file=Path("/p/.so/config.toml"))  # and it heals
    assert store.is_trusted(Path("/p"), "c" * 64)


def test_the_default_store_is_under_so_home(tmp_path: Path) -> None:
    assert TrustStore.default({"SO_HOME": str(tmp_path)}).path == tmp_path / "trust.json"
    assert TrustStore.default(os.environ).path.name == "trust.json"
