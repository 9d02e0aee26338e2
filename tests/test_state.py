"""The registry under SO_HOME: records saved atomically, loaded, resolved by prefix, and a
status that never claims "running" for a dead runner."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sono.errors import SoError
from sono.state import (
    RUNNING,
    STOPPED,
    IterationRecord,
    SandboxRecord,
    Store,
    agents_dir,
    so_home,
)


def record(sandbox_id: str = "proj-ab12", **kw: object) -> SandboxRecord:
    base: dict[str, object] = {
        "id": sandbox_id,
        "project": "/p",
        "project_name": "proj",
        "host_branch": "main",
        "host_head": "h",
        "base_commit": "h",
        "harness": "custom",
        "backend": "bwrap",
        "created": "2026-01-01T00:00:00+00:00",
        "workspace": "/w",
    }
    return SandboxRecord(**{**base, **kw})  # type: ignore[arg-type]


def iteration(n: int) -> IterationRecord:
    return IterationRecord(
        n=n,
        started="t",
        duration_s=1.0,
        exit_code=0,
        timed_out=False,
        head_before="a",
        head_after="b",
        commits=("b",),
        commit_retries=0,
        auto_committed=False,
        status_after="pending",
        events=1,
        net_denied=({"host": "x", "port": 443},),
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "so-home")


def test_save_load_and_update_round_trip(store: Store) -> None:
    saved = store.save(record(mounts=(("/src", "/dest"),), drift=("a.txt",)))
    assert store.load("proj-ab12") == saved
    assert saved.mounts == (("/src", "/dest"),) and saved.drift == ("a.txt",)
    updated = store.update(saved, status=STOPPED, iterations=2, stop_reason="done")
    again = store.load("proj-ab12")
    assert again == updated and (again.status, again.iterations) == (STOPPED, 2)
    assert again.branch == "so/proj-ab12" and again.iter_ref(3) == "refs/so/proj-ab12/iter/3"


def test_save_is_atomic_and_private(store: Store) -> None:
    store.save(record())
    folder = store.dir("proj-ab12")
    assert [p.name for p in folder.iterdir()] == ["sandbox.json"]  # no temp file left
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    assert json.loads((folder / "sandbox.json").read_text())["id"] == "proj-ab12"


def test_make_dir_refuses_an_existing_sandbox(store: Store) -> None:
    path = store.make_dir("proj-1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    with pytest.raises(FileExistsError):
        store.make_dir("proj-1")


def test_records_from_another_version_load(store: Store) -> None:
    """Unknown keys (a newer so) are ignored; lists come back as tuples."""
    data = {**record().to_json(), "future_field": 1, "mounts": [["/a", "/b"]]}
    path = store.dir("proj-ab12") / "sandbox.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    assert store.load("proj-ab12").mounts == (("/a", "/b"),)


def test_a_missing_or_corrupt_record_is_a_clear_error(store: Store) -> None:
    with pytest.raises(SoError, match=r"no sandbox 'nope'; `so list`"):
        store.load("nope")
    path = store.dir("bad-1") / "sandbox.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(SoError, match=r"unreadable sandbox record .*`so rm bad-1`"):
        store.load("bad-1")


def test_all_skips_corrupt_records_and_sorts_by_creation(store: Store) -> None:
    store.save(record("b-2", created="2026-01-02T00:00:00+00:00"))
    store.save(record("a-1", created="2026-01-03T00:00:00+00:00"))
    store.save(record("c-3", created="2026-01-01T00:00:00+00:00"))
    (store.dir("bad-1")).mkdir()
    (store.dir("bad-1") / "sandbox.json").write_text("[]")
    (store.root / "stray-file").write_text("")
    assert [r.id for r in store.all()] == ["c-3", "b-2", "a-1"]
    assert Store(store.home / "elsewhere").all() == []


def test_resolve_by_id_or_unique_prefix(store: Store) -> None:
    for sandbox_id in ("proj-ab12", "proj-ab34", "other-9f00", "proj"):
        store.save(record(sandbox_id))
    assert store.resolve("other").id == "other-9f00"
    assert store.resolve("proj-ab1").id == "proj-ab12"
    assert store.resolve("proj").id == "proj"  # an exact id wins over being a prefix
    with pytest.raises(SoError) as info:
        store.resolve("proj-ab")
    assert "matches several sandboxes (proj-ab12, proj-ab34)" in str(info.value)
    with pytest.raises(SoError, match="no sandbox 'zzz'"):
        store.resolve("zzz")


def test_live_status_is_stopped_when_the_runner_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    assert record(status=RUNNING, runner_pid=child.pid).live_status() == STOPPED
    assert record(status=RUNNING, runner_pid=None).live_status() == STOPPED
    assert record(status=RUNNING, runner_pid=os.getpid()).live_status() == RUNNING
    assert record(status="done", runner_pid=None).live_status() == "done"


def test_iterations_round_trip_in_numeric_order(store: Store) -> None:
    for n in (10, 2, 1):
        store.write_iteration("proj-ab12", iteration(n))
    (store.dir("proj-ab12") / "iterations" / "3").mkdir()  # started, no record yet
    got = store.iterations("proj-ab12")
    assert [r["n"] for r in got] == [1, 2, 10]
    assert got[0] == iteration(1).to_json()
    assert got[0]["commits"] == ["b"] and got[0]["net_denied"] == [{"host": "x", "port": 443}]
    assert store.iterations("other") == []


def test_homes_follow_the_environment(tmp_path: Path) -> None:
    env = {"SO_HOME": str(tmp_path / "h")}
    assert so_home(env) == tmp_path / "h"
    assert agents_dir(env) == tmp_path / "h" / "agents"
    assert agents_dir({**env, "SO_AGENTS_DIR": str(tmp_path / "a")}) == tmp_path / "a"


@pytest.mark.parametrize("text", ["[]", '"id"', '{"id": "x"}', "null"])
def test_a_record_of_the_wrong_shape_is_unreadable_not_a_crash(store: Store, text: str) -> None:
    path = store.dir("odd-1") / "sandbox.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(SoError, match="unreadable sandbox record"):
        store.load("odd-1")
