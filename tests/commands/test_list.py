from __future__ import annotations

import argparse
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from helpers import SO, so
from sono.commands.list import config_files, fast, project_dir, run, table
from sono.state import SandboxRecord, Store
from sono.ui.age import age, epoch_seconds


def record(**kw: object) -> SandboxRecord:
    base: dict[str, object] = {
        "id": "proj-ab12",
        "project": "/p",
        "project_name": "proj",
        "host_branch": "main",
        "host_head": "h",
        "base_commit": "h",
        "harness": "claude",
        "backend": "bwrap",
        "created": "2026-01-01T00:00:00+00:00",
        "workspace": "/w",
    }
    return SandboxRecord(**{**base, **kw})  # type: ignore[arg-type]


def test_age() -> None:
    now = datetime(2026, 1, 3, 1, 0, tzinfo=UTC)
    assert age("2026-01-01T00:00:00+00:00", now) == "2d"
    assert age("2026-01-03T00:30:00+00:00", now) == "30m"
    assert age("garbage", now) == "?"


def test_table_has_the_seed_columns() -> None:
    text = table([record(iterations=3, commits=2)])
    header, row = text.splitlines()
    assert header.split() == [
        "ID",
        "PROJECT",
        "HARNESS",
        "BACKEND",
        "STATUS",
        "ITER",
        "COMMITS",
        "AGE",
    ]
    assert row.split()[:7] == ["proj-ab12", "proj", "claude", "bwrap", "created", "3", "2"]


def test_running_with_dead_runner_shows_stopped() -> None:
    assert record(status="running", runner_pid=2**22 + 7).live_status() == "stopped"


def test_epoch_seconds_matches_datetime() -> None:
    for stamp in (
        "1970-01-01T00:00:00+00:00",
        "2024-02-29T23:59:59+00:00",
        "2026-11-30T14:37:12+00:00",
    ):
        assert epoch_seconds(stamp) == int(datetime.fromisoformat(stamp).timestamp())
    assert epoch_seconds("2026-11-30T14:37:12+02:00") is None  # so writes UTC only


def test_the_fast_path_prints_what_the_full_parser_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SO_HOME", str(tmp_path))
    store = Store(tmp_path)
    store.save(record(id="proj-0001", created="2026-01-01T00:00:00+00:00"))
    store.save(
        record(
            id="proj-0002",
            created="2026-01-02T00:00:00+00:00",
            status="running",
            runner_pid=2**22 + 7,
        )
    )  # fmt: skip  (a dead runner pid)
    (tmp_path / "sandboxes" / "broken").mkdir()
    (tmp_path / "sandboxes" / "broken" / "sandbox.json").write_text("{not json")
    for as_json in (False, True):
        run(argparse.Namespace(json=as_json))
        slow = capsys.readouterr().out
        fast(as_json)
        assert capsys.readouterr().out == slow
    statuses = {r["id"]: r["status"] for r in json.loads(slow)}
    assert statuses == {"proj-0001": "created", "proj-0002": "stopped"}


def test_table_shows_record_strings_inert() -> None:
    """A record's strings (a project named by a cloned repo, a tampered registry file)
    reach the terminal as one visible line per cell."""
    rec = record(project_name="evil\x1b]0;title\x07\x9b2J\u202e", harness="x\x1b[8mhid")
    text = table([rec])
    assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text
    assert "evil^[]0;title^G<U+009B>2J<U+202E>" in text and "x^[[8mhid" in text
    assert len(text.splitlines()) == 2


# --- a broken config file is an error for list, menu and bare `so` ---------------------

BROKEN = {
    "toml": ("iterations = [\n", "invalid TOML at line 1"),
    "key": ("iteratoins = 3\n", "unknown key 'iteratoins'"),
}


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"], ["menu"], []])
@pytest.mark.parametrize("where", ["user", "project"])
@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_config_fails_list_and_menu(
    argv: list[str], where: str, kind: str, repo: Path, isolated_home: Path
) -> None:
    text, message = BROKEN[kind]
    base = isolated_home / ".config" / "so" if where == "user" else repo / ".so"
    base.mkdir(parents=True)
    (base / "config.toml").write_text(text)
    out = so(*argv, cwd=repo)
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(base / "config.toml") in lines[0] and message in lines[0]


def test_valid_config_files_still_list(repo: Path, isolated_home: Path) -> None:
    (isolated_home / ".config" / "so").mkdir(parents=True)
    (isolated_home / ".config" / "so" / "config.toml").write_text("iterations = 2\n")
    (repo / ".so").mkdir()
    (repo / ".so" / "config.toml").write_text('harness = "custom"\n')
    out = so("list", cwd=repo)
    assert (out.returncode, out.stderr) == (0, "") and "no sandboxes" in out.stdout


def test_a_project_without_commits_is_checked_too(tmp_path: Path) -> None:
    project = tmp_path / "fresh"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".so").mkdir()
    (project / ".so" / "config.toml").write_text("nope = 1\n")
    out = so("list", cwd=project / ".so")
    assert out.returncode == 1 and "nope" in out.stderr


def test_config_files_finds_the_user_and_the_project_file(repo: Path, isolated_home: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(isolated_home / ".config")}
    assert config_files(env, str(repo)) == []
    user = isolated_home / ".config" / "so" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text("")
    (repo / "sub").mkdir()
    (repo / ".so").mkdir()
    (repo / ".so" / "config.toml").write_text("")
    found = config_files(env, str(repo / "sub"))
    assert found == [str(user), str(repo / ".so" / "config.toml")]
    assert project_dir(str(repo / "sub")) == str(repo)
    assert project_dir("/") is None


def test_the_check_knows_every_harness() -> None:
    """check_config validates `harness` against the config's names, not the registry's."""
    from sono.config import DEFAULT_HARNESSES
    from sono.harnesses import HARNESSES

    assert set(DEFAULT_HARNESSES) == set(HARNESSES)


def test_list_from_a_removed_directory_still_answers(tmp_path: Path, isolated_home: Path) -> None:
    (isolated_home / ".config" / "so").mkdir(parents=True)
    (isolated_home / ".config" / "so" / "config.toml").write_text("iterations = 2\n")
    for argv in (["list"], ["list", "--json"]):
        (tmp_path / "gone").mkdir()
        out = subprocess.run(
            ["sh", "-c", 'cd gone && rmdir ../gone && exec "$@"', "sh", SO, *argv],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert (out.returncode, out.stderr) == (0, ""), out.stderr


def test_the_fast_path_imports_no_typing_no_config() -> None:
    """`so list` answers from the registry alone: its imports stay stdlib-light."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import sono.cli.main, sono.commands.list"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()}
    assert not loaded & {"typing", "sono.config", "argparse", "dataclasses", "sono.state"}
