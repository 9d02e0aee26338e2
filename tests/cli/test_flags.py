"""Flags generated from the settings table; every flag before or after the command."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import so
from sono.cli.flags import flags_of
from sono.cli.main import COMMANDS, build_parser, parse
from sono.config import load_config
from sono.errors import ConfigError
from sono.settings import OPTIONS, Option

FLAGGED = [o for o in OPTIONS if o.flags]


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (["--allow-dirty", "run", "-H", "custom"], ["run", "--allow-dirty", "-H", "custom"]),
        (["--max-cost", "1", "run"], ["run", "--max-cost", "1"]),
        (["--max-tokens", "9", "-q", "continue", "x"], ["continue", "x", "-q", "--max-tokens=9"]),
        (["--json", "list"], ["list", "--json"]),
        (["--keep", "--commit", "-y", "merge", "x"], ["merge", "x", "--keep", "--commit", "-y"]),
        (["--iter", "2", "--stat", "diff", "x"], ["diff", "x", "--iter", "2", "--stat"]),
        (["--older-than", "7d", "rm"], ["rm", "--older-than", "7d"]),
        (["--agent", "builtin", "demo"], ["demo", "--agent", "builtin"]),
        (["--show", "trust"], ["trust", "--show"]),
        (["--no-agent", "plan"], ["plan", "--no-agent"]),
    ],
)
def test_a_flag_parses_the_same_before_and_after_the_command(
    before: list[str], after: list[str]
) -> None:
    assert vars(parse(before)) == vars(parse(after))


def test_max_cost_on_both_sides_reaches_the_config(tmp_path: Path) -> None:
    for argv in (["--max-cost", "1", "run"], ["run", "--max-cost", "1"]):
        cfg = load_config(project=None, env={}, home=tmp_path, flags=flags_of(parse(argv)))
        assert cfg.max_cost == 1.0 and cfg.sources["max_cost"].source == "flag --max-cost"


def _value(option: Option) -> tuple[str, object]:
    """A raw flag value and what flags_of makes of it."""
    return ("3", 3) if option.argtype is int else ("x", "x")


@pytest.mark.parametrize(
    ("option", "spelling"),
    [(o, f) for o in FLAGGED for f in o.flags],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_setting_flag_parses_to_its_key(option: Option, spelling: str) -> None:
    command = option.commands[0] if option.commands else "run"
    raw, value = _value(option)
    for argv in ([spelling, raw, command], [command, spelling, raw]):
        assert flags_of(parse(argv)) == {option.key: value}, argv


def test_a_repeated_flag_joins_its_values_on_both_sides() -> None:
    args = parse(["--allow", "a.example", "run", "--allow", "b.example", "--deny", "c.example"])
    assert flags_of(args) == {"network.allow": "b.example", "network.deny": "c.example"}
    args = parse(["run", "--allow", "a.example", "--allow", "b.example"])
    assert flags_of(args) == {"network.allow": "a.example,b.example"}


def test_after_the_command_wins() -> None:
    assert parse(["-i", "3", "run", "-i", "5"]).iterations == 5
    assert parse(["-H", "custom", "run"]).harness == "custom"


def test_flags_of_reads_attributes_set_by_hand() -> None:
    # so continue and the menus set the remembered agent on a namespace
    ns = argparse.Namespace(harness="custom", agent_cmd="true", model=None)
    assert flags_of(ns) == {"harness": "custom", "agent_cmd": "true"}
    assert flags_of(argparse.Namespace()) == {}


def test_defaults_are_filled_in_once_the_command_is_known() -> None:
    run = parse(["run"])
    assert (run.allow_dirty, run.json, run.quiet, run.yes, run.harness) == (
        False,
        False,
        False,
        False,
        None,
    )
    assert (parse(["demo"]).agent, parse(["image", "list"]).suite) == ("auto", "bookworm")
    assert parse([]).command is None and parse([]).yes is False


@pytest.mark.parametrize(
    "argv",
    [
        ["--allow-dirty", "list"],
        ["list", "--allow-dirty"],
        ["--max-cost", "1", "list"],
        ["diff", "x", "--max-cost", "1"],
        ["rm", "--max-cost=1"],
        ["diff", "x", "-i", "3"],
        ["list", "--memory", "4g"],
        ["--harness", "codex", "diff", "x"],
    ],
)
def test_a_flag_the_command_does_not_take_is_a_clear_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(argv, capsys)
    flag = next(a for a in argv if a.startswith("-")).split("=")[0]
    command = next(a for a in argv if a in ("list", "diff", "rm"))
    assert f"is not an option of so {command} (only of: run, step, " in err
    assert flag in err


def test_an_unknown_flag_stays_unrecognized(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unrecognized arguments: --no-such-flag" in usage_error(
        ["run", "--no-such-flag"], capsys
    )
    assert "unrecognized arguments: --no-such-flag" in usage_error(
        ["--no-such-flag", "list"], capsys
    )


def test_timeout_error_names_the_timeout_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(
            project=None,
            env={},
            home=tmp_path,
            flags=flags_of(parse(["run", "--timeout", "5x"])),
        )
    message = str(exc.value)
    assert message.startswith("--timeout: 'iteration_timeout' must be")
    assert message.endswith("e.g. --timeout 30m") and "--iteration-timeout" not in message


def test_agent_cmd_help_says_no_shell_and_where_the_prompt_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "NOT run by a shell" in help_text and "sh -c" in help_text
    assert "stdin" in help_text and "$SO_PROMPT_FILE" in help_text


POSITIONALS = {
    "diff": ["x"],
    "shell": ["x"],
    "continue": ["x"],
    "merge": ["x"],
    "reset": ["x", "base"],
    "image": ["list"],
    "volume": ["list"],
    "agents": ["list"],
}


def test_every_command_takes_every_setting_flag_unless_the_table_says_otherwise() -> None:
    for option in FLAGGED:
        for command in COMMANDS:
            argv = [command, option.flag, _value(option)[0], *POSITIONALS.get(command, [])]
            try:
                parse(argv)
            except SystemExit:
                assert not option.takes(command), argv
            else:
                assert option.takes(command), argv


def test_building_the_parser_loads_no_config_machinery() -> None:
    """``so --help`` and usage errors stay fast: the table imports nothing."""
    code = (
        "import sys; from sono.cli.main import build_parser; build_parser(); "
        "print(sorted(m for m in ('sono.config', 'sono.trust', 'tomllib', 'dataclasses', "
        "'typing') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_build_parser_still_parses() -> None:
    args = build_parser().parse_args(["run", "--allow-dirty"])
    assert args.command == "run" and args.allow_dirty is True


@pytest.mark.parametrize("before", [["--allow-dirty"], ["--max-cost", "1"]])
def test_the_real_so_takes_a_loop_flag_before_the_command(repo: Path, before: list[str]) -> None:
    (repo / "specs").mkdir()
    (repo / "specs" / "prompt.md").write_text("x")  # uncommitted: --allow-dirty matters
    out = so(*before, "run", "-H", "custom", "--agent-cmd", "true", "--timeout", "5x", cwd=repo)
    assert out.returncode == 1 and out.stderr.startswith("so: error: --timeout:"), out.stderr
    refused = so(*before, "list", cwd=repo)
    assert refused.returncode == 2 and f"{before[0]} is not an option of so list" in refused.stderr
