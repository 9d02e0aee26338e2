"""The CLI contract: commands, flags anywhere, help, errors with one line and exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import git, so
from sono.cli.main import COMMANDS, build_parser, main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("so 0.")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help_with_examples(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "examples:" in out and f"so {command}" in out


def test_seed_commands_and_direct_commands_exist() -> None:
    for name in (
        "plan",
        "run",
        "step",
        "clean",
        "dup",
        "learn",
        "menu",
        "list",
        "diff",
        "shell",
        "reset",
        "continue",
        "merge",
        "rm",
        "doctor",
        "config",
        "demo",
    ):
        assert name in COMMANDS


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "-H", "custom", "-i", "3", "--yes"],
        ["-H", "custom", "run", "-i", "3", "--yes"],
        ["-y", "-i", "3", "run", "-H", "custom"],
    ],
)
def test_global_flags_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.command, args.harness, args.iterations, args.yes) == ("run", "custom", 3, True)


def test_merge_flags_after_id() -> None:
    args = build_parser().parse_args(["merge", "abc", "--yes", "--commit"])
    assert (args.id, args.yes, args.commit) == ("abc", True, True)


def test_unknown_flag_exits_2(repo: Path) -> None:
    out = so("run", "--no-such-flag", cwd=repo)
    assert out.returncode == 2 and "unrecognized arguments" in out.stderr


def test_config_shows_provenance_and_flag_wins(repo: Path, isolated_home: Path) -> None:
    user = isolated_home / ".config" / "so"
    user.mkdir(parents=True)
    (user / "config.toml").write_text('harness = "custom"\niterations = 7\n')
    (repo / ".so").mkdir()
    (repo / ".so" / "config.toml").write_text("iterations = 4\n")
    out = so("config", "--json", "-m", "opus", cwd=repo, env={"SANDBOX": "bwrap"})
    data = json.loads(out.stdout)
    assert data["harness"]["source"].startswith("user file")
    source = f"project file ({repo}/.so/config.toml, untrusted)"  # iterations needs no trust
    assert data["iterations"] == {"value": 4, "source": source}
    assert data["sandbox"]["source"] == "env SANDBOX"
    assert data["model"] == {"value": "opus", "source": "flag --model"}
    text = so("config", cwd=repo).stdout
    assert "iterations" in text and "project file" in text


def test_broken_config_is_one_clear_line(repo: Path, isolated_home: Path) -> None:
    (isolated_home / ".config" / "so").mkdir(parents=True)
    path = isolated_home / ".config" / "so" / "config.toml"
    path.write_text("iterations = [\n")
    out = so("config", cwd=repo)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0]
    path.write_text("iteratoins = 3\n")
    out = so("run", cwd=repo)
    assert out.returncode == 1 and "iteratoins" in out.stderr and "iterations" in out.stderr


def test_no_subcommand_without_tty_prints_list(repo: Path) -> None:
    out = so(cwd=repo)
    assert out.returncode == 0 and "no sandboxes" in out.stdout


def test_list_json_empty(repo: Path) -> None:
    out = so("list", "--json", cwd=repo)
    assert out.returncode == 0 and json.loads(out.stdout) == []


def test_run_without_specs_is_refused(repo: Path) -> None:
    out = so("run", "-H", "custom", "--agent-cmd", "true", "--yes", cwd=repo)
    assert out.returncode == 1 and "specs/prompt.md" in out.stderr and "so plan" in out.stderr


def test_run_on_dirty_host_is_refused(repo: Path) -> None:
    (repo / "specs").mkdir()
    (repo / "specs" / "prompt.md").write_text("x")
    out = so("run", "-H", "custom", "--agent-cmd", "true", "--yes", cwd=repo)
    assert out.returncode == 1 and "uncommitted changes" in out.stderr
    assert "--allow-dirty" in out.stderr
    assert json.loads(so("list", "--json", cwd=repo).stdout) == []


def test_outside_a_repo(tmp_path: Path) -> None:
    out = so("run", cwd=tmp_path)
    assert out.returncode == 1 and "not inside a git repository" in out.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "-s", "microvm"], "cannot boot a microVM here"),
        (["run", "-s", "vmware"], "sandbox"),
        (["run", "-H", "aider"], "harness"),
        (["run", "-H", "claude", "-e", "ludicrous"], "not valid for claude"),
        (["run", "-i", "0"], "iterations"),
        (["run", "--timeout", "soon"], "iteration_timeout"),
        (["diff", "nope"], "no sandbox"),
        (["rm"], "--all"),
        (["learn"], "needs a terminal"),
        (["step", "-H", "custom", "--agent-cmd", "true"], "needs a terminal"),
    ],
)
def test_bad_input_is_a_clear_error(repo: Path, argv: list[str], message: str) -> None:
    (repo / "specs").mkdir()
    (repo / "specs" / "prompt.md").write_text("x")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "specs")
    out = so(*argv, cwd=repo)
    assert out.returncode == 1, out.stderr
    assert message in out.stderr and out.stderr.startswith("so: error:")
    assert "Traceback" not in out.stderr


def test_plan_writes_templates_without_overwriting(repo: Path) -> None:
    (repo / "specs").mkdir()
    (repo / "specs" / "prompt.md").write_text("mine\n")
    out = so("plan", "--no-agent", cwd=repo)
    assert out.returncode == 0
    assert (repo / "specs" / "prompt.md").read_text() == "mine\n"
    for name in ("readme.md", "implementation-plan.md", "status.md"):
        assert (repo / "specs" / name).is_file()
    assert "kept existing specs/prompt.md" in out.stdout


def test_doctor_reports_bwrap_and_network(repo: Path) -> None:
    out = so("doctor", cwd=repo)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[ok  ] backend bwrap" in out.stdout
    assert "[ok  ] network: allowlist: the model gateway + nothing" in out.stdout
    assert "no network interface but loopback" in out.stdout and "git" in out.stdout
    assert "[ok  ] limit pids on bwrap:" in out.stdout


def test_doctor_says_whether_workspaces_are_copy_on_write(repo: Path) -> None:
    out = so("doctor", cwd=repo)
    assert "[ok  ] workspace on bwrap: copy-on-write overlay" in out.stdout
    pinned = so("doctor", cwd=repo, env={"SO_WORKSPACE": "copy"})
    assert "[--  ] workspace on bwrap: copy (workspace = copy in config)" in pinned.stdout
    os.chown(repo, os.getuid() + 1, -1)  # not yours: its files would be read-only inside
    trust = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory"}
    try:
        fallback = so("doctor", cwd=repo, env={**trust, "GIT_CONFIG_VALUE_0": "*"})
    finally:
        os.chown(repo, os.getuid(), -1)
    assert "workspace on bwrap: falls back to a full copy" in fallback.stdout
    assert "owned by uid" in fallback.stdout


def test_doctor_fails_for_unavailable_backend(repo: Path) -> None:
    out = so("doctor", "-s", "microvm", cwd=repo)
    assert out.returncode == 1


def test_config_says_which_backend_auto_picks_and_why(repo: Path) -> None:
    env = {"SANDBOX": "auto", "DOCKER_HOST": "unix:///nonexistent.sock"}
    data = json.loads(so("config", "--json", cwd=repo, env=env).stdout)
    assert data["sandbox"]["value"] == "auto" and data["sandbox"]["resolved"] == "bwrap"
    assert "no Docker engine" in data["sandbox"]["why"]
    assert "sandbox now:  bwrap (auto → bwrap" in so("config", cwd=repo, env=env).stdout


def test_error_lines_show_sandbox_text_inert(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An error may quote the sandbox's git output: it reaches the terminal visible."""
    from sono.commands import clean
    from sono.errors import SoError

    def fail(_args: object) -> int:
        raise SoError("git failed: \x1b]52;c;eA==\x07 \x1b[8mhidden \x9b2J\nsecond line")

    monkeypatch.setattr(clean, "run", fail)
    assert main(["clean"]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x9b" not in err and "\x07" not in err
    assert "so: error: git failed: ^[]52;c;eA==^G ^[[8mhidden <U+009B>2J\nsecond line" in err


@pytest.mark.parametrize("where", ["a-file", "missing/deeper"])
def test_an_unusable_so_home_is_one_line_not_a_crash(tmp_path: Path, where: str) -> None:
    from helpers import make_repo

    repo = make_repo(tmp_path / "proj", {"specs/prompt.md": "go\n"})
    (tmp_path / "a-file").write_text("not a directory\n")
    home = tmp_path / "a-file" / where if where == "missing/deeper" else tmp_path / "a-file"
    out = so(
        "run", "-H", "custom", "--agent-cmd", "/bin/true", "--yes",
        cwd=repo, env={"SO_HOME": str(home)},
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("so: error: ") and "SO_HOME" in out.stderr
    assert len(out.stderr.splitlines()) == 1 and "unexpected" not in out.stderr
