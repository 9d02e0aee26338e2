"""so doctor shows the limits the config sets, never sample values, and per backend what
it can enforce."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import so


def limit_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "limit" in line]


def test_no_limits_set_says_so_without_sample_values(repo: Path) -> None:
    out = so("doctor", cwd=repo)
    lines = limit_lines(out.stdout)
    assert any(line.startswith("[--  ] limits set: none") for line in lines), lines
    for line in lines:
        assert not re.search(r"GiB|4294967296|\b512\b|nano_cpus|pids.max", line), line
    assert "[ok  ] limit pids on bwrap: none set; bwrap can enforce one (cgroup" in out.stdout
    assert "limit disk on bwrap: none set; bwrap can enforce one (watchdog)" in out.stdout


def test_set_limits_show_their_value_source_and_enforcement(repo: Path) -> None:
    out = so("doctor", "--memory", "3g", "--pids", "77", cwd=repo)
    text = out.stdout
    assert "[ok  ] limits set: memory 3.0 GiB (flag --memory), pids 77 (flag --pids)" in text
    assert "limit memory on bwrap: 3.0 GiB set, enforced by cgroup" in text
    assert "limit pids on bwrap: 77 set, enforced by cgroup" in text and "pids.max=77" in text
    assert "limit cpus on bwrap: none set" in text and "limit disk on bwrap: none set" in text


def test_limits_from_the_user_file_name_it(repo: Path, isolated_home: Path) -> None:
    path = isolated_home / ".config" / "so" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("[limits]\ncpus = 1.5\n")
    out = so("doctor", cwd=repo)
    assert f"[ok  ] limits set: cpus 1.5 (user file ({path}))" in out.stdout


def test_a_broken_config_is_reported_not_refused(repo: Path) -> None:
    (repo / ".so").mkdir()
    (repo / ".so" / "config.toml").write_text("iterations = [\n")
    out = so("doctor", cwd=repo)
    assert out.returncode == 1
    assert "[FAIL] config: " in out.stdout and "invalid TOML at line 1" in out.stdout
    assert "[ok  ] backend bwrap" in out.stdout  # the rest of the checks still ran


def test_the_selected_sandbox_is_the_one_run_would_pick(repo: Path, docker_ready: str) -> None:
    """As root the project is root-owned: Docker could only copy it, bwrap mounts it
    copy-on-write — `so run` picks bwrap, and `so doctor` says the same, with the reason."""
    out = so("doctor", cwd=repo, env={"SANDBOX": "auto", "SO_SANDBOX": "auto"})
    [selected] = [x for x in out.stdout.splitlines() if "selected sandbox" in x]
    assert "selected sandbox: bwrap (auto → bwrap: docker would copy the project" in selected


def test_each_harness_shows_its_endpoint_and_credential_kind_never_the_value(
    repo: Path,
) -> None:
    env = {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "ANTHROPIC_API_KEY": "sk-doctor-canary-value",
        "OPENAI_API_KEY": "sk-doctor-canary-other",
    }
    out = so("doctor", "-H", "codex", cwd=repo, env=env)
    assert "sk-doctor-canary" not in out.stdout + out.stderr
    claude = [ln for ln in out.stdout.splitlines() if ln.startswith("[ok  ] claude model:")]
    assert any(
        "http://127.0.0.1:9 (from env ANTHROPIC_BASE_URL) as /anthropic; credential: API key "
        "(from env ANTHROPIC_API_KEY)" in ln
        for ln in claude
    ), out.stdout
    assert "codex model (selected):" in out.stdout


def test_a_selected_harness_whose_config_is_broken_fails_the_doctor(
    repo: Path, isolated_home: Path
) -> None:
    settings = isolated_home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text('{"env": {"ANTHROPIC_BASE_URL": "http://x",}')
    out = so("doctor", cwd=repo)
    assert out.returncode == 1
    assert (
        "[FAIL] claude model (selected): its configuration cannot be read: claude: " in out.stdout
    )
    assert "~/.claude/settings.json is not valid JSON" in out.stdout
    other = so("doctor", "-H", "codex", cwd=repo)
    assert "[--  ] claude model: its configuration cannot be read" in other.stdout  # not used
