"""Credentials out of everything the sandbox gets, by name, by shape and by value."""

from __future__ import annotations

from pathlib import Path

from sono.net.scrub import is_credential_name, scrub_env, scrub_json, scrub_text, scrub_tree
from sono.net.upstream import PLACEHOLDER as P


def test_names_that_hold_credentials() -> None:
    for name in (
        "OPENAI_API_KEY",
        "MY_LLM_KEY",
        "GITHUB_TOKEN",
        "CLAUDE_CODE_CLIENT_KEY_PASSPHRASE",
        "DB_PASSWORD",
        "apiKey",
        "clientSecret",
        "authorization",
        "refreshToken",
    ):
        assert is_credential_name(name), name
    for name in ("env_key", "CLAUDE_CODE_MAX_OUTPUT_TOKENS", "SSH_AUTH_SOCK", "HOME", "keyId"):
        assert not is_credential_name(name), name


def test_shapes_and_known_values_are_replaced_placeholders_kept() -> None:
    text = (
        "Authorization: Bearer abcdefgh12345678 "
        "postgres://app:db-pass-1@db/app "
        "https://x/v1?key=AIzaSomething123456&q=1 "
        "ghp_0123456789abcdefghijABCDEFGHIJ sk-ant-api03-abcdefghijklmnop "
        "known-secret-value sk-ant-oat01-so-placeholder-x"
    )
    out = scrub_text(text, ["known-secret-value"])
    assert out == (
        f"Authorization: Bearer {P} postgres://app:{P}@db/app https://x/v1?key={P}&q=1 "
        f"{P} {P} {P} sk-ant-oat01-so-placeholder-x"
    )


def test_env_drops_header_variables_and_hides_named_ones() -> None:
    env = scrub_env(
        {"ANTHROPIC_CUSTOM_HEADERS": "X: y", "MY_KEY": "v" * 10, "PATH": "/bin", "E_TOKEN": ""}
    )
    assert env == {"MY_KEY": P, "PATH": "/bin", "E_TOKEN": ""}


def test_an_mcp_table_keeps_its_shape_without_credentials() -> None:
    servers = {
        "gh": {
            "command": "gh-mcp",
            "args": ["--token", "ghx-real-1", "--api-key=real-2", "--verbose"],
            "env": {"GITHUB_TOKEN": "real-3", "LOG_LEVEL": "debug"},
            "headers": {"X-Anything": "real-4"},
            "url": "https://u:real-5-pass@mcp.example/x?token=real-6-token",
        }
    }
    out = scrub_json(servers, key="mcp_servers")["gh"]
    assert out["command"] == "gh-mcp"
    assert out["args"] == ["--token", P, f"--api-key={P}", "--verbose"]
    assert out["env"] == {"GITHUB_TOKEN": P, "LOG_LEVEL": "debug"}
    assert out["headers"] == {"X-Anything": P}
    assert out["url"] == f"https://u:{P}@mcp.example/x?token={P}"


def test_every_file_of_a_home_is_scrubbed_links_never_followed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".claude" / "backups").mkdir(parents=True)
    backup = home / ".claude" / "backups" / ".claude.json.backup.1"
    backup.write_text('{"primaryApiKey": "sk-ant-api03-realrealrealreal", "x": "known-value-9"}')
    outside = tmp_path / "outside.txt"
    outside.write_text("known-value-9")
    (home / "link").symlink_to(outside)
    (home / "blob").write_bytes(b"\xff\xfeknown-value-9\x00")
    changed = scrub_tree(home, ["known-value-9"])
    assert sorted(changed) == [".claude/backups/.claude.json.backup.1", "blob"]
    assert backup.read_text() == f'{{"primaryApiKey": "{P}", "x": "{P}"}}'
    assert outside.read_text() == "known-value-9"
    assert b"known-value-9" not in (home / "blob").read_bytes()
