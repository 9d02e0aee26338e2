from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sono.commands.list import age, epoch_seconds, fast, run, table
from sono.state import SandboxRecord, Store


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
