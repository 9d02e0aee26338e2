"""so trust: trust, show and revoke the project's .so/config.toml (the real CLI)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import so
from sono.trust import TrustStore, digest

EVIL = 'pager = "sh -c evil"\nnetwork.mode = "open"\niterations = 2\n'


def config_file(repo: Path, text: str) -> Path:
    path = repo / ".so" / "config.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_without_a_project_file_there_is_nothing_to_trust(repo: Path) -> None:
    out = so("trust", cwd=repo)
    assert out.returncode == 1
    assert "does not exist: there is nothing to trust" in out.stderr
    assert "(none)" in so("trust", "--show", cwd=repo).stdout


def test_show_lists_what_needs_trust_and_trust_records_the_hash(repo: Path) -> None:
    path = config_file(repo, EVIL)
    shown = so("trust", "--show", cwd=repo)
    assert shown.returncode == 0
    assert "status:       untrusted" in shown.stdout
    assert "pager (runs on your host)" in shown.stdout
    assert 'network.mode ("open" is looser than "allowlist"' in shown.stdout
    assert "iterations" not in shown.stdout

    out = so("trust", cwd=repo)
    assert out.returncode == 0, out.stderr
    assert "now applies: pager (runs on your host)" in out.stdout
    store = TrustStore.default(os.environ)
    assert store.is_trusted(repo, digest(path.read_bytes()))
    assert "status:       trusted" in so("trust", "--show", cwd=repo).stdout


def test_config_shows_trusted_and_untrusted_sources(repo: Path) -> None:
    path = config_file(repo, "iterations = 2\n")
    data = json.loads(so("config", "--json", cwd=repo).stdout)
    assert data["iterations"]["source"] == f"project file ({path}, untrusted)"
    assert "(untrusted: only keys safe in a project file apply" in so("config", cwd=repo).stdout
    config_file(repo, EVIL)
    refused = so("config", cwd=repo)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("so: error: ")
    assert so("trust", cwd=repo).returncode == 0
    data = json.loads(so("config", "--json", cwd=repo).stdout)
    assert data["pager"] == {"value": "sh -c evil", "source": f"project file ({path}, trusted)"}
    assert "(trusted, sha256 " in so("config", cwd=repo).stdout


def test_revoke(repo: Path) -> None:
    config_file(repo, EVIL)
    assert "was not trusted" in so("trust", "--revoke", cwd=repo).stdout
    so("trust", cwd=repo)
    assert so("config", cwd=repo).returncode == 0
    assert "trust revoked" in so("trust", "--revoke", cwd=repo).stdout
    assert so("config", cwd=repo).returncode == 1


def test_show_and_revoke_exclude_each_other(repo: Path) -> None:
    assert so("trust", "--show", "--revoke", cwd=repo).returncode == 2


def test_an_invalid_file_is_not_trusted(repo: Path) -> None:
    config_file(repo, "pagr = 1\n")
    out = so("trust", cwd=repo)
    assert out.returncode == 1
    assert "unknown key 'pagr'" in out.stderr
    assert not TrustStore.default(os.environ).path.exists()
