from __future__ import annotations

import json
from pathlib import Path

from sono.harnesses import get_harness
from sono.harnesses.base import AgentOptions
from sono.harnesses.claude import ClaudeHarness
from sono.net.upstream import PLACEHOLDER


def test_unattended_argv_matches_the_seed() -> None:
    argv = ClaudeHarness().unattended_argv(AgentOptions(executable="/x/claude"))
    flag = ClaudeHarness().overrides(AgentOptions())
    assert argv == [
        "/x/claude",
        "-p",
        "--verbose",
        "--output-format",
        "stream-json",
        "--dangerously-skip-permissions",
        "--settings",
        json.dumps(flag),
    ]


def test_model_and_effort_flags() -> None:
    argv = ClaudeHarness().unattended_argv(AgentOptions(model="opus", effort="high"))
    assert argv[-4:] == ["--model", "opus", "--effort", "high"]
    assert "-p" in argv


def test_interactive_argv_passes_prompt_and_never_bypasses() -> None:
    argv = ClaudeHarness().interactive_argv(AgentOptions(model="sonnet"), "Plan with me")
    assert argv[:1] + argv[3:] == ["claude", "--model", "sonnet", "Plan with me"]
    assert argv[1] == "--settings"
    assert "--dangerously-skip-permissions" not in argv


def test_env_forwards_only_claude_variables_with_placeholders() -> None:
    env = ClaudeHarness().env(
        {
            "ANTHROPIC_API_KEY": "k",
            "CLAUDE_CODE_OAUTH_TOKEN": "t",
            "AWS_SECRET_ACCESS_KEY": "no",
            "GITHUB_TOKEN": "no",
        },
        AgentOptions(),
    )
    assert env["ANTHROPIC_API_KEY"] == env["CLAUDE_CODE_OAUTH_TOKEN"] == PLACEHOLDER
    assert "AWS_SECRET_ACCESS_KEY" not in env and "GITHUB_TOKEN" not in env
    assert env["DISABLE_AUTOUPDATER"] == env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


def test_provision_copies_credentials_not_history(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / ".claude" / "projects" / "p").mkdir(parents=True)
    (host / ".claude" / ".credentials.json").write_text('{"claudeAiOauth": {"accessToken": "t"}}')
    (host / ".claude" / "settings.json").write_text("{}")
    (host / ".claude" / "history.jsonl").write_text("secret prompt history")
    (host / ".claude" / "CLAUDE.md").write_text("personal memory")
    (host / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
    seed = tmp_path / "seed"
    seed.mkdir()
    copied = ClaudeHarness().provision(home_seed=seed, host_home=host, opts=AgentOptions())
    assert copied == ["~/.claude", "~/.claude.json"]
    login = json.loads((seed / ".claude" / ".credentials.json").read_text())["claudeAiOauth"]
    assert login["accessToken"] == PLACEHOLDER
    assert (seed / ".claude" / "settings.json").exists()
    for skipped in ("history.jsonl", "CLAUDE.md", "projects"):
        assert not (seed / ".claude" / skipped).exists()
    assert not (seed / ".claude.json").is_symlink()
    assert json.loads((seed / ".claude.json").read_text())["hasCompletedOnboarding"]


def test_provision_without_credentials(tmp_path: Path) -> None:
    (tmp_path / "seed").mkdir()
    assert (
        ClaudeHarness().provision(
            home_seed=tmp_path / "seed", host_home=tmp_path, opts=AgentOptions()
        )
        == []
    )


def test_registry() -> None:
    assert get_harness("claude").name == "claude"
    assert get_harness("custom").name == "custom"


def test_provision_is_an_allow_list(tmp_path: Path) -> None:
    host = tmp_path / "host"
    dot = host / ".claude"
    for sub in ("backups", "session-env/s1", "daemon/auth", "commands", "hooks", "agent-memory"):
        (dot / sub).mkdir(parents=True)
    (dot / "backups" / ".claude.json.backup.1700000000").write_text('{"primaryApiKey": "sk"}')
    (dot / "session-env" / "s1" / "env.sh").write_text("export ANTHROPIC_API_KEY=sk")
    (dot / "daemon" / "auth" / "token.json").write_text('{"token": "sk"}')
    (dot / "get-key.sh").write_text("#!/bin/sh\necho sk")
    (dot / "settings.json").write_text(json.dumps({"apiKeyHelper": "~/.claude/get-key.sh"}))
    (dot / ".credentials.json").write_text('{"claudeAiOauth": {"accessToken": "t"}}')
    (dot / "keybindings.json").write_text("[]")
    (dot / "commands" / "x.md").write_text("# x")
    (dot / "commands" / ".env").write_text("KEY=sk")
    (dot / "commands" / "api.key").write_text("sk")
    (dot / "commands" / "link.md").symlink_to(dot / "get-key.sh")
    (dot / "hooks" / "pre.sh").write_text("#!/bin/sh")
    seed = tmp_path / "seed"
    seed.mkdir()
    ClaudeHarness().provision(home_seed=seed, host_home=host, opts=AgentOptions())
    copied = seed / ".claude"
    files = sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if not p.is_dir())
    assert files == [
        ".credentials.json",
        "commands/x.md",
        "hooks/pre.sh",
        "keybindings.json",
        "settings.json",
    ]
    login = json.loads((copied / ".credentials.json").read_text())["claudeAiOauth"]
    assert login["accessToken"] == PLACEHOLDER
    assert "apiKeyHelper" not in json.loads((copied / "settings.json").read_text())
    assert "sk" not in "".join(p.read_text() for p in copied.rglob("*") if p.is_file())
