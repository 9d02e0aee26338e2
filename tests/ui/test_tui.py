"""The review TUI driven with Textual's pilot against real git workspaces on the fake
backend: every key → the state it must leave behind, plus text snapshots of the main
screens (``SO_UPDATE_SNAPSHOTS=1`` rewrites them, and docs/menu.svg)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import stat
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest
from rich.console import Console
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey
from textual.worker import WorkerState

from fakes import HostBackend, fake_sandbox
from helpers import REPO, git, make_repo
from sono import sandbox as sandbox_module
from sono.app.context import Context
from sono.backends.base import SandboxSpec
from sono.sandbox import Sandbox
from sono.state import DONE, FAILED, STOPPED, Store
from sono.ui import tui_data
from sono.ui.tui import PENDING_STAT, MainScreen, ReviewApp, Services
from sono.ui.tui_screens import (
    ConfirmScreen,
    DiffScreen,
    LogsScreen,
    MessageScreen,
    PickScreen,
    ProgressScreen,
)

T = TypeVar("T")
SNAPSHOTS = Path(__file__).parent / "snapshots"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
CREATED = "2026-11-30T10:30:00+00:00"  # 1h30m before NOW: the age column says 1h
AGENT = """#!/bin/bash
cat > /dev/null
echo "line $SO_ITERATION" >> notes.txt
echo "wrote line $SO_ITERATION"
git add -A && git commit -qm "note $SO_ITERATION"
"""


class ShellBackend(HostBackend):
    """The fake backend, recording shells instead of starting one on the test's terminal."""

    def __init__(self) -> None:
        super().__init__()
        self.shells: list[str] = []

    def shell(self, *, spec: SandboxSpec, argv: Sequence[str] = ()) -> int:
        self.shells.append(spec.id)
        return 0


@dataclass
class World:
    tmp: Path
    repo: Path
    store: Store
    backend: ShellBackend
    ids: list[str]
    opened: list[tuple[str, bool]] = field(default_factory=list)  # (id, to run)

    def services(self) -> Services:
        def opener(ref: str, run: bool) -> Sandbox:
            self.opened.append((ref, run))
            return Sandbox.of(self.store.resolve(ref), self.store, self.backend)

        ctx = Context(env={**os.environ, "SO_HOME": str(self.store.home)}, home=self.tmp)
        return Services(ctx=ctx, opener=opener, now=lambda: NOW)

    def app(self, focus: str | None = None) -> ReviewApp:
        return ReviewApp(self.services(), focus=focus)

    def sandbox(self, n: int = 0) -> Sandbox:
        return Sandbox.of(self.store.load(self.ids[n]), self.store, self.backend)


def add_sandbox(
    world: World, *changes: dict[str, str], status: str = STOPPED, created: str = CREATED
) -> Sandbox:
    sb = fake_sandbox(world.tmp, world.repo, backend=world.backend)
    for n, files in enumerate(changes, start=1):
        for name, text in files.items():
            (sb.work / name).write_text(text)
        sb.git.commit_all(f"change {n}")
        sb.record_iteration(n)
    sb.save(iterations=len(changes), commits=len(changes), status=status, created=created)
    world.ids.append(sb.record.id)
    return sb


def make_world(tmp_path: Path, *changes: dict[str, str]) -> World:
    repo = make_repo(
        tmp_path / "proj", {"a.txt": "line\n", "b.txt": "b\n", "specs/prompt.md": "go\n"}
    )
    world = World(tmp_path, repo, Store(tmp_path / "so"), ShellBackend(), [])
    if changes:
        add_sandbox(world, *changes)
    return world


TWO_ITERATIONS = ({"a.txt": "one\n"}, {"c.txt": "new\n"})


# --- driving the app ---


async def settle(pilot: Pilot[None]) -> None:
    """Until no worker (git in a thread) is left and its results are on screen — diff
    stats included (a loaded machine may still be computing them)."""
    for _ in range(100):
        await pilot.pause()
        busy = [
            w for w in pilot.app.workers if w.state in (WorkerState.PENDING, WorkerState.RUNNING)
        ]
        if not busy and not stats_pending(pilot.app):
            break
        if busy:
            await pilot.app.workers.wait_for_complete(busy)
        else:
            await asyncio.sleep(0.05)
    await pilot.pause()


def stats_pending(app: App[None]) -> bool:
    main = next((s for s in app.screen_stack if isinstance(s, MainScreen)), None)
    if main is None:
        return False
    table = main.query_one(DataTable)
    cells = [str(table.get_cell(key, "diff")) for key in table.rows if key.value in main.records]
    # A stat that arrived widens its column on the table's next idle: until then the
    # screen (and a dialog's background) would show it cut.
    width = table.columns[ColumnKey("diff")].content_width
    return any(c == PENDING_STAT or len(c) > width for c in cells)


def drive(
    app: App[None],
    scenario: Callable[[Pilot[None]], Awaitable[T]],
    size: tuple[int, int] = (80, 24),
) -> T:
    async def main() -> T:
        async with app.run_test(size=size) as pilot:
            for _ in range(100):  # the app pushes its main screen once it is running
                if isinstance(pilot.app.screen, MainScreen):
                    break
                await pilot.pause()
            await settle(pilot)
            return await scenario(pilot)

    return asyncio.run(main())


async def press(pilot: Pilot[None], *keys: str) -> None:
    for key in keys:
        await pilot.press(key)
        await settle(pilot)


def screen_text(app: App[None]) -> str:
    """The screen as plain text, modal dialogs over their background included."""
    width, height = app.size
    console = Console(
        width=width, height=height, file=io.StringIO(), record=True, force_terminal=True
    )
    console.print(
        app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    )
    return console.export_text(styles=False)


# --- snapshots: plain text, volatile parts normalised ---


def normalise(text: str, world: World) -> str:
    for n, sandbox_id in enumerate(world.ids, start=1):
        text = text.replace(sandbox_id, f"<sb{n}>".ljust(len(sandbox_id), "_"))
    text = text.replace(str(world.tmp), "<tmp>")
    text = re.sub(r"\b[0-9a-f]{7,40}\b", lambda m: "#" * len(m.group()), text)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def updating() -> bool:
    return os.environ.get("SO_UPDATE_SNAPSHOTS") == "1"


def assert_snapshot(name: str, text: str, world: World) -> None:
    path = SNAPSHOTS / f"{name}.txt"
    actual = normalise(text, world)
    if updating():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    assert path.is_file(), f"no snapshot {path}: run with SO_UPDATE_SNAPSHOTS=1"
    assert actual == path.read_text(), f"{name} changed; SO_UPDATE_SNAPSHOTS=1 accepts it"


# --- the main list ---


def test_main_screen_lists_sandboxes_by_project(tmp_path: Path) -> None:
    world = make_world(tmp_path, *TWO_ITERATIONS)
    other = make_repo(tmp_path / "other", {"x.txt": "x\n"})
    add_sandbox(World(tmp_path, other, world.store, world.backend, world.ids), {"x.txt": "y\n"})

    async def scenario(pilot: Pilot[None]) -> str:
        return screen_text(pilot.app)

    text = drive(world.app(), scenario)
    assert "d diff" in text and "q quit" in text
    lines = text.splitlines()
    project_row = next(i for i, line in enumerate(lines) if line.strip() == "proj")
    assert world.ids[0] in lines[project_row + 1]
    assert "■ stopped" in lines[project_row + 1] and "2f +2 -1" in lines[project_row + 1]
    assert "1h" in lines[project_row + 1]
    assert "other" in text and "1f +1 -1" in text
    assert_snapshot("main", text, world)


def test_empty_registry_says_how_to_start(tmp_path: Path) -> None:
    world = make_world(tmp_path)

    async def scenario(pilot: Pilot[None]) -> str:
        await press(pilot, "d")  # nothing selected: a notice, not a crash
        return screen_text(pilot.app)

    assert "no sandboxes yet" in drive(world.app(), scenario)


def test_focus_selects_the_given_sandbox(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})
    add_sandbox(world, {"a.txt": "two\n"}, created="2026-11-30T11:00:00+00:00")  # listed 2nd

    async def scenario(pilot: Pilot[None]) -> str | None:
        screen = pilot.app.screen
        assert isinstance(screen, MainScreen)
        return screen.selected_id()

    assert drive(world.app(focus=world.ids[1]), scenario) == world.ids[1]
    assert drive(world.app(), scenario) == world.ids[0]


def test_cursor_skips_project_headings(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})
    other = make_repo(tmp_path / "other", {"x.txt": "x\n"})
    add_sandbox(World(tmp_path, other, world.store, world.backend, world.ids), {"x.txt": "y\n"})

    async def scenario(pilot: Pilot[None]) -> list[str | None]:
        screen = pilot.app.screen
        assert isinstance(screen, MainScreen)
        seen = [screen.selected_id()]
        await press(pilot, "down")
        seen.append(screen.selected_id())
        await press(pilot, "up")
        seen.append(screen.selected_id())
        return seen

    proj_id, other_id = world.ids  # groups sort by name: other's heading and row come first
    assert drive(world.app(), scenario) == [other_id, proj_id, other_id]


def test_status_reads_without_colour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    world = make_world(tmp_path, {"a.txt": "one\n"})
    world.store.update(world.store.load(world.ids[0]), status=FAILED, last_error="agent exited 1")

    async def scenario(pilot: Pilot[None]) -> str:
        assert pilot.app.no_color
        return screen_text(pilot.app)

    text = drive(world.app(), scenario)
    assert "✗ failed" in text and "error: agent exited 1" in text


def test_q_quits(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})

    async def scenario(pilot: Pilot[None]) -> bool:
        await pilot.press("q")
        await pilot.pause()
        return pilot.app.is_running

    assert drive(world.app(), scenario) is False


# --- diff ---


def test_diff_whole_run_then_one_iteration_then_back(tmp_path: Path) -> None:
    world = make_world(tmp_path, *TWO_ITERATIONS)

    async def scenario(pilot: Pilot[None]) -> tuple[str, str, str]:
        await press(pilot, "d")
        assert isinstance(pilot.app.screen, DiffScreen)
        whole = screen_text(pilot.app)
        await press(pilot, "down", "down", "enter")  # timeline: whole run, 1, [2]
        second = screen_text(pilot.app)
        await press(pilot, "escape")
        return whole, second, screen_text(pilot.app)

    whole, second, back = drive(world.app(), scenario)
    assert "+one" in whole and "+new" in whole and "2 change 2" in whole
    assert "iteration 2" in second and "+new" in second and "+one" not in second
    assert "d diff" in back and world.ids[0] in back
    assert_snapshot("diff", whole, world)


# --- reset ---


def test_reset_to_an_iteration_after_confirming(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"}, {"a.txt": "two\n"})

    async def scenario(pilot: Pilot[None]) -> str:
        await press(pilot, "r")
        assert isinstance(pilot.app.screen, PickScreen)
        await press(pilot, "down", "enter")  # iter-2, [iter-1], base, commits…
        assert isinstance(pilot.app.screen, ConfirmScreen)
        dialog = screen_text(pilot.app)
        await press(pilot, "y")
        return dialog

    dialog = drive(world.app(), scenario)
    assert "to iter-1?" in dialog
    assert_snapshot("confirm-reset", dialog, world)
    sb = world.sandbox()
    assert (sb.work / "a.txt").read_text() == "one\n"
    assert sb.record.commits == 1 and sb.record.stop_reason == "reset to iter-1"


def test_reset_answered_no_changes_nothing(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"}, {"a.txt": "two\n"})

    async def scenario(pilot: Pilot[None]) -> None:
        await press(pilot, "r", "down", "enter", "n")
        assert isinstance(pilot.app.screen, MainScreen)

    drive(world.app(), scenario)
    assert (world.sandbox().work / "a.txt").read_text() == "two\n"


def test_reset_to_a_commit_from_the_log(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"}, {"a.txt": "two\n"})
    first = world.sandbox().git.out("rev-parse", "--short", "HEAD~1")

    async def scenario(pilot: Pilot[None]) -> None:
        # iter-2, iter-1, base, <HEAD>, [HEAD~1]
        await press(pilot, "r", "down", "down", "down", "down", "enter", "y")

    drive(world.app(), scenario)
    assert (world.sandbox().work / "a.txt").read_text() == "one\n"
    assert world.sandbox().git.out("rev-parse", "--short", "HEAD") == first


# --- merge ---


def test_merge_stages_the_change_and_removes_the_sandbox(tmp_path: Path) -> None:
    world = make_world(tmp_path, *TWO_ITERATIONS)
    head = git(world.repo, "rev-parse", "HEAD")

    async def scenario(pilot: Pilot[None]) -> str:
        await press(pilot, "m")
        assert isinstance(pilot.app.screen, ConfirmScreen)
        await press(pilot, "y")
        assert isinstance(pilot.app.screen, MessageScreen)
        text = screen_text(pilot.app)
        await press(pilot, "escape")
        assert world.ids[0] not in screen_text(pilot.app)
        return text

    text = drive(world.app(), scenario)
    assert "merged" in text and "a.txt" in text and "c.txt" in text
    assert git(world.repo, "rev-parse", "HEAD") == head  # staged, not committed
    assert git(world.repo, "diff", "--cached", "--name-only").split() == ["a.txt", "c.txt"]
    assert not world.store.dir(world.ids[0]).exists()


def test_merge_conflict_shows_the_message_and_keeps_the_sandbox(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "sandbox side\n"})
    (world.repo / "a.txt").write_text("host side\n")
    git(world.repo, "commit", "-qam", "host change")

    async def scenario(pilot: Pilot[None]) -> str:
        await press(pilot, "m", "y")
        assert isinstance(pilot.app.screen, MessageScreen)
        return screen_text(pilot.app)

    text = drive(world.app(), scenario)
    assert "merge failed" in text and "conflicts in a.txt" in text
    assert "sandbox is kept" in " ".join(text.split())
    assert world.store.dir(world.ids[0]).exists()
    assert git(world.repo, "status", "--porcelain") == ""


def test_merge_of_a_running_sandbox_is_refused(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})
    world.store.update(world.store.load(world.ids[0]), status="running", runner_pid=os.getpid())

    async def scenario(pilot: Pilot[None]) -> str:
        await press(pilot, "m")
        return screen_text(pilot.app)

    assert "is running" in drive(world.app(), scenario)
    assert world.store.dir(world.ids[0]).exists()


# --- delete ---


def test_delete_after_confirming(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})

    async def scenario(pilot: Pilot[None]) -> str:
        await press(pilot, "x", "y")
        return screen_text(pilot.app)

    assert "no sandboxes yet" in drive(world.app(), scenario)
    assert not world.store.dir(world.ids[0]).exists()


# --- shell ---


def test_shell_suspends_the_app_and_runs_the_backend_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})
    app = world.app()
    suspended: list[bool] = []

    @contextlib.contextmanager
    def suspend() -> Iterator[None]:
        suspended.append(True)
        yield

    monkeypatch.setattr(app, "suspend", suspend)

    async def scenario(pilot: Pilot[None]) -> bool:
        await press(pilot, "s")
        return isinstance(pilot.app.screen, MainScreen)

    assert drive(app, scenario)
    assert suspended == [True] and world.backend.shells == [world.ids[0]]
    # The shell runs under the sandbox's full run policy (limits, files), as `so shell`.
    assert (world.ids[0], True) in world.opened


def test_shell_without_a_real_terminal_explains(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})

    async def scenario(pilot: Pilot[None]) -> str:
        await press(pilot, "s")
        return screen_text(pilot.app)

    assert f"so shell {world.ids[0]}" in " ".join(drive(world.app(), scenario).split())
    assert world.backend.shells == []


# --- continue ---


def test_continue_runs_more_iterations_with_live_progress(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})
    script = tmp_path / "agent.sh"
    script.write_text(AGENT)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    world.store.update(world.store.load(world.ids[0]), agent_cmd=str(script))

    async def scenario(pilot: Pilot[None]) -> tuple[str, str]:
        await press(pilot, "c", "backspace", "2", "enter")
        assert isinstance(pilot.app.screen, ProgressScreen)
        progress = screen_text(pilot.app)
        await press(pilot, "escape")
        return progress, screen_text(pilot.app)

    progress, main = drive(world.app(), scenario)
    assert "iteration 2/2" in progress and "exhausted" in progress
    assert "wrote line 3" in progress and "iteration 3:" in progress
    rec = world.store.load(world.ids[0])
    assert rec.iterations == 3 and rec.commits == 3
    assert (world.sandbox().work / "notes.txt").read_text() == "line 2\nline 3\n"
    assert "■ stopped" in main and " 3 " in main
    assert (world.ids[0], True) in world.opened  # continue runs under the full policy


def test_continue_failure_is_a_dialog(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})  # custom harness, no agent command

    async def scenario(pilot: Pilot[None]) -> str:
        await press(pilot, "c", "enter")
        return screen_text(pilot.app)

    assert "continue failed" in drive(world.app(), scenario)


# --- logs ---


def write_logs(world: World) -> None:
    it = world.store.iteration_dir(world.ids[0], 1)
    it.mkdir(parents=True, exist_ok=True)
    (it / "events.jsonl").write_text(
        '{"kind": "session_started", "session_id": "s1", "model": "sonnet"}\n'
        '{"kind": "text", "text": "I will add a test."}\n'
        '{"kind": "tool_call", "name": "Bash", "summary": "pytest -q", "call_id": "c1"}\n'
        '{"kind": "tool_result", "call_id": "c1", "ok": false, "summary": "1 failed"}\n'
        '{"kind": "usage", "input_tokens": 1200, "output_tokens": 80, "cached_tokens": 0}\n'
        "not json\n"
    )
    (it / "output.log").write_text("RAW LINE ONE\nRAW LINE TWO\n")


def test_logs_show_events_and_toggle_to_raw_output(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})
    write_logs(world)

    async def scenario(pilot: Pilot[None]) -> tuple[str, str, str]:
        await press(pilot, "l")
        assert isinstance(pilot.app.screen, LogsScreen)
        events = screen_text(pilot.app)
        await press(pilot, "t")
        raw = screen_text(pilot.app)
        await press(pilot, "escape")
        return events, raw, screen_text(pilot.app)

    events, raw, back = drive(world.app(), scenario)
    assert "tool_call    Bash: pytest -q" in events
    assert "tool_result  ERROR 1 failed" in events and "usage        1200 in / 80 out" in events
    assert "raw          not json" in events
    assert "RAW LINE TWO" in raw and "Bash" not in raw
    assert "d diff" in back
    assert_snapshot("logs", events, world)


# --- the data behind the screens ---


def test_shortstat_and_event_lines() -> None:
    text = " 2 files changed, 3 insertions(+), 1 deletion(-)"
    assert tui_data.parse_shortstat(text) == "2f +3 -1"
    assert tui_data.parse_shortstat(" 1 file changed, 4 deletions(-)") == "1f +0 -4"
    assert tui_data.parse_shortstat("") == "-"
    assert (
        tui_data.event_line({"kind": "error", "message": "boom\nagain"})
        == "error        boom again"
    )


def test_groups_show_the_path_only_when_names_clash(tmp_path: Path) -> None:
    world = make_world(tmp_path, {"a.txt": "one\n"})
    twin = make_repo(tmp_path / "elsewhere" / "proj")
    add_sandbox(World(tmp_path, twin, world.store, world.backend, world.ids), {"a.txt": "x\n"})
    titles = [g.title for g in tui_data.groups(world.store.all())]
    assert sorted(titles) == sorted(f"proj ({p})" for p in (world.repo, twin))


# --- docs/menu.svg: the main screen with realistic data, fixed ids and clock ---


def test_docs_screenshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = iter(["webshop-3f2a", "webshop-9c41", "cli-tool-07be"])
    monkeypatch.setattr(sandbox_module, "new_id", lambda store, name: next(ids))
    shop = make_repo(tmp_path / "webshop", {"cart.py": "x = 1\n" * 20, "README.md": "# shop\n"})
    world = World(tmp_path, shop, Store(tmp_path / "so"), ShellBackend(), [])
    done = add_sandbox(world, {"cart.py": "x = 2\n" * 20}, {"tax.py": "RATE = 0.2\n"}, status=DONE)
    world.store.update(
        done.record,
        harness="claude",
        backend="bwrap",
        iterations=3,
        stop_reason="specs/status.md says done",
    )
    running = add_sandbox(
        world,
        {"README.md": "# shop\n\nDocs.\n"},
        status="running",
        created="2026-11-30T11:48:00+00:00",
    )
    world.store.update(running.record, harness="codex", backend="docker", runner_pid=os.getpid())
    tool = make_repo(tmp_path / "cli-tool", {"main.go": "package main\n"})
    failed = add_sandbox(
        World(tmp_path, tool, world.store, world.backend, world.ids),
        {"main.go": "package main\n\nfunc main() {}\n"},
        status=FAILED,
        created="2026-11-29T09:00:00+00:00",
    )
    world.store.update(failed.record, harness="pi", backend="bwrap", last_error="agent exited 1")

    async def scenario(pilot: Pilot[None]) -> tuple[str, str]:
        return pilot.app.export_screenshot(title="so menu"), screen_text(pilot.app)

    svg, text = drive(world.app(focus="webshop-3f2a"), scenario)
    assert "✓ done" in text and "▶ running" in text and "✗ failed" in text
    target = REPO / "docs" / "menu.svg"
    if updating():
        target.write_text(svg)
    assert target.read_text() == svg, "docs/menu.svg is stale: SO_UPDATE_SNAPSHOTS=1 rewrites it"
