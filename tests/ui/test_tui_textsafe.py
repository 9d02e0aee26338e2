"""The review TUI shows the sandbox's bytes inert: commit subjects, file names, diff lines,
events and raw output, stop reasons and errors arrive as visible text (``^[``,
``<U+009B>``), and agent text that looks like Rich markup stays literal text."""

from __future__ import annotations

import json
from pathlib import Path

from test_tui import World, drive, make_world, press, screen_text, settle
from textual.pilot import Pilot

from fakes import fake_sandbox
from sono.ui import tui_data
from sono.ui.tui_screens import DiffScreen, LogsScreen, MessageScreen, PickScreen

OSC = "\x1b]0;TITLE\x07"
SUBJECT = f"subj {OSC} \x1b[8mHIDE \x9b2J \u202eRLO [bold]MK[/]"


def assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, text
    assert "\u202e" not in text and "\r" not in text, text


def hostile_world(tmp_path: Path) -> World:
    world = make_world(tmp_path)
    sb = fake_sandbox(world.tmp, world.repo, backend=world.backend)
    (sb.work / f"evil{OSC}.txt").write_text(f"+{OSC} \x1b[8mCONCEAL\nsafe\rOVER\n")
    sb.git.commit_all(SUBJECT)
    sb.record_iteration(1)
    sb.save(
        iterations=1,
        commits=1,
        status="stopped",
        harness="[red]cl",
        stop_reason=f"[bold]why[/] {OSC}",
        last_error="[link=https://x.example]e[/link] \x1b[8mhid",
    )
    world.ids.append(sb.record.id)
    it = world.store.iteration_dir(sb.record.id, 1)
    it.mkdir(parents=True)
    events = [
        {"kind": "text", "text": f"said {OSC} [bold]BOLD[/] \x1b[8mCONC"},
        {"kind": "tool_call", "name": f"Bash{OSC}", "summary": "ls \x9b2J", "call_id": "c"},
        {"kind": "error", "message": "safe\rOVERWRITE"},
    ]
    (it / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (it / "output.log").write_text(f"raw {OSC} [link=https://x.example]L[/link]\nsafe\rOVR\n")
    return world


def test_every_screen_shows_sandbox_bytes_inert(tmp_path: Path) -> None:
    world = hostile_world(tmp_path)

    async def scenario(pilot: Pilot[None]) -> dict[str, str]:
        seen = {"main": screen_text(pilot.app)}
        await press(pilot, "l")
        assert isinstance(pilot.app.screen, LogsScreen)
        seen["events"] = screen_text(pilot.app)
        await press(pilot, "t")
        seen["raw"] = screen_text(pilot.app)
        await press(pilot, "escape", "d")
        assert isinstance(pilot.app.screen, DiffScreen)
        seen["diff"] = screen_text(pilot.app)
        await press(pilot, "escape", "r")
        assert isinstance(pilot.app.screen, PickScreen)
        seen["reset"] = screen_text(pilot.app)
        await press(pilot, "escape")
        pilot.app.push_screen(MessageScreen(f"t{OSC}", "[bold]m[/] \x1b[8mhid\nline 2"))
        await settle(pilot)
        seen["message"] = screen_text(pilot.app)
        return seen

    seen = drive(world.app(), scenario, size=(160, 40))
    for text in seen.values():
        assert_inert(text)
    assert "[bold]why[/] ^[]0;TITLE^G" in seen["main"] and "[red]cl" in seen["main"]
    assert "[link=https://x.example]e[/link] ^[[8mhid" in seen["main"]
    assert "said ^[]0;TITLE^G [bold]BOLD[/] ^[[8mCONC" in seen["events"]
    assert "Bash^[]0;TITLE^G: ls <U+009B>2J" in seen["events"]
    assert "safe^MOVERWRITE" in seen["events"]
    assert "raw ^[]0;TITLE^G [link=https://x.example]L[/link]" in seen["raw"]
    assert "safe^MOVR" in seen["raw"]
    assert "+^[]0;TITLE^G ^[[8mCONCEAL" in seen["diff"]  # a line of the file
    assert "1 subj ^[]0;TITLE" in seen["diff"]  # the timeline
    reset = seen["reset"]  # the dialog wraps long labels: the markup-like tail on its own row
    assert "subj ^[]0;TITLE^G ^[[8mHIDE <U+009B>2J <U+202E>RLO" in reset and "[bold]MK[/]" in reset
    assert "t^[]0;TITLE^G" in seen["message"] and "[bold]m[/] ^[[8mhid" in seen["message"]


def test_data_for_the_screens_is_safe(tmp_path: Path) -> None:
    world = hostile_world(tmp_path)
    sb = world.sandbox()
    [(n, subject)] = tui_data.timeline(sb)
    assert n == 1 and subject.startswith("subj ^[]0;TITLE^G ^[[8mHIDE <U+009B>2J <U+202E>RLO")
    labels = [label for _, label in tui_data.reset_targets(sb)]
    for label in labels:
        assert_inert(label)
    events = tui_data.event_lines(world.store, sb.record.id, 1)
    raw = tui_data.raw_lines(world.store, sb.record.id, 1)
    for line in events + raw:
        assert_inert(line)
    assert raw == ["raw ^[]0;TITLE^G [link=https://x.example]L[/link]", "safe^MOVR"]


def test_diff_lines() -> None:
    diff = (
        'diff --git "a/caf\u00e9\x1b.txt" "b/caf\u00e9\x1b.txt"\n'
        "--- a/caf\u00e9.txt\n+++ b/caf\u00e9.txt\n@@ -1 +1 @@\n"
        "--- caf\u00e9 stays\n+new\x1b[8m\ttab\rX\n"
    )
    assert tui_data.diff_lines(diff, 100) == [
        'diff --git "a/caf<U+00E9>^[.txt" "b/caf<U+00E9>^[.txt"',
        "--- a/caf<U+00E9>.txt",
        "+++ b/caf<U+00E9>.txt",
        "@@ -1 +1 @@",
        "--- café stays",  # a removed line of text, not a file name: its letters kept
        "+new^[[8m\ttab^MX",
    ]
    assert tui_data.diff_lines("a\nb\nc\n", 2) == [
        "a",
        "b",
        "… 1 more lines: `so diff` shows them all",
    ]
    assert tui_data.diff_lines("", 5) == []


def test_event_line_joins_blanks_and_shows_controls() -> None:
    line = tui_data.event_line({"kind": "text\x1b", "text": " a \n\t b\rc\x1b]0;t\x07 "})
    assert line == "text^[       a b^Mc^[]0;t^G"
