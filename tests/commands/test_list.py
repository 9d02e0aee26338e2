from __future__ import annotations

from datetime import UTC, datetime

from sono.commands.list import age, table
from sono.state import SandboxRecord


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
