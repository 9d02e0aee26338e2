from __future__ import annotations

import io
import json
import re
from pathlib import Path

from rich.console import Console

from sono.events import Error, Result, Text, ToolCall, ToolResult, Usage
from sono.loop import LoopResult
from sono.state import IterationRecord, Store, so_home
from sono.ui.reporter import JsonReporter, LiveReporter, PlainReporter, render_event


def record(n: int, **kw: object) -> IterationRecord:
    base: dict[str, object] = {
        "n": n,
        "started": "t",
        "duration_s": 2.5,
        "exit_code": 0,
        "timed_out": False,
        "head_before": "a",
        "head_after": "b",
        "commits": ("b",),
        "commit_retries": 0,
        "auto_committed": False,
        "status_after": "pending",
        "events": 3,
        "files_changed": 2,
        "tokens_in": 1500,
        "tokens_out": 300,
        "cost_usd": 0.01,
    }
    return IterationRecord(**{**base, **kw})  # type: ignore[arg-type]


RESULT = LoopResult("done", (record(1), record(2, cost_usd=None)), 2, "specs/status.md says done")


def test_render_event() -> None:
    assert render_event(ToolCall(name="Bash", summary="ls")) == "   → Bash: ls"
    assert render_event(Text(text="hello\nworld")) == "   · hello"
    assert render_event(Usage(input_tokens=1)) is None


def test_plain_reporter_summary_and_table() -> None:
    out = io.StringIO()
    rep = PlainReporter(out)
    rep.iteration_ended(record(1), 2)
    rep.run_ended(RESULT)
    text = out.getvalue()
    assert "iteration 1: 2.5s, 1 commit(s), 2 file(s), tokens 1500 in / 300 out, $0.0100" in text
    assert "tokens in" in text and "total" in text and "5.0s" in text


def test_quiet_reporter_prints_only_summaries_and_errors() -> None:
    out = io.StringIO()
    rep = PlainReporter(out, quiet=True)
    rep.iteration_started(1, 1, "x")
    rep.event(ToolCall(name="Bash", summary="ls"))
    rep.event(Text(text="thinking"))
    rep.event(Result(ok=True, text="fine"))
    rep.event(Error(message="model refused"))
    rep.event(Result(ok=False, text="agent gave up"))
    rep.iteration_ended(record(1), 1)
    rep.run_ended(RESULT)  # no table under -q
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert "model refused" in lines[0] and "agent gave up" in lines[1]
    assert "iteration 1:" in lines[2]


def test_an_iteration_without_a_commit_says_so_and_where_its_log_is(
    isolated_home: Path,
) -> None:
    log = Store(so_home()).iteration_dir("proj-1234", 2) / "output.log"
    out = io.StringIO()
    rep = PlainReporter(out, quiet=True)
    rep.iteration_started(2, 3, "proj-1234")
    rep.iteration_ended(record(2, commits=()), 3)
    rep.iteration_ended(record(3), 3)
    lines = out.getvalue().splitlines()
    assert lines[1] == f"   iteration 2 made no commit; the agent's output is in {log}"
    assert len(lines) == 3 and "no commit" not in lines[2]
    buf = io.StringIO()
    live = LiveReporter(Console(file=buf, force_terminal=True, width=300, color_system=None))
    live.iteration_started(2, 3, "proj-1234")
    live.iteration_ended(record(2, commits=()), 3)
    assert f"made no commit; the agent's output is in {log}" in buf.getvalue()


def test_json_reporter_lines_parse() -> None:
    out = io.StringIO()
    rep = JsonReporter(out)
    rep.iteration_started(1, 2, "x")
    rep.event(ToolCall(name="Bash", summary="ls"))
    rep.iteration_ended(record(1), 2)
    kinds = [json.loads(line)["kind"] for line in out.getvalue().splitlines()]
    assert kinds == ["iteration_started", "tool_call", "iteration_ended"]


def test_live_reporter_shows_progress_and_table() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100, color_system=None)
    rep = LiveReporter(console)
    rep.iteration_started(1, 2, "proj-1234")
    rep.event(ToolCall(name="Bash", summary="pytest -q"))
    rep.event(Text(text="all green"))
    rep.event(Usage(input_tokens=1200, output_tokens=80, cost_usd=0.02))
    frame = Console(file=io.StringIO(), width=100, color_system=None)
    frame.print(rep.render())
    screen = frame.file.getvalue()  # type: ignore[attr-defined]
    assert "iteration 1/2" in screen and "Bash: pytest -q" in screen
    assert "all green" in screen and "1200 in / 80 out" in screen and "$0.0200" in screen
    rep.iteration_ended(record(1), 2)
    rep.run_ended(RESULT)
    text = buf.getvalue()
    assert "iteration 1: 2.5s" in text and "tokens in" in text and "total" in text


HOSTILE_TEXT = (
    "ok \x1b]52;c;ZXZpbA==\x07 \x1b]0;title\x07 \x1b[8mhidden\x1b[0m safe\rEVIL "
    "\x1b[2K \x9b2J \u202eRLO [bold red]MARKUP[/] [link=https://x.example]L[/link]"
)
HOSTILE_EVENTS = (
    ToolCall(name="Bash\x1b]0;t\x07", summary="ls \x1b[8mhid"),
    Text(text=HOSTILE_TEXT + "\nsecond line \x1b[31mred"),
    ToolResult(ok=False, summary="bad \x1b]52;c;eA==\x07"),
    Error(message="boom \x1b[8mhid\nnext"),
    Result(ok=False, text="fail \x9b2J"),
)


def raw_controls(text: str) -> list[str]:
    """Control characters of the agent's that would act on a terminal."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n") or 0x7F <= ord(c) <= 0x9F]


def test_plain_reporter_shows_agent_controls_inert() -> None:
    out = io.StringIO()
    rep = PlainReporter(out)
    for event in HOSTILE_EVENTS:
        rep.event(event)
    rep.note("denied \x1b]0;host\x07:443")
    text = out.getvalue()
    assert not raw_controls(text) and "\u202e" not in text
    assert "^[]52;c;ZXZpbA==^G" in text and "safe^MEVIL" in text and "<U+009B>2J" in text
    assert "→ Bash^[]0;t^G: ls ^[[8mhid" in text and "✗ boom ^[[8mhid\\nnext" in text
    assert "denied ^[]0;host^G:443" in text
    assert len(text.splitlines()) == 6  # one line per event, whatever the agent sent


def test_render_event_first_line_only() -> None:
    assert render_event(Text(text="\n  one\r\ntwo")) == "   · one"


def test_live_reporter_shows_agent_text_inert_and_literal() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=300, color_system="truecolor")
    rep = LiveReporter(console)
    rep.iteration_started(1, 1, "proj-1234")
    for event in HOSTILE_EVENTS:
        rep.event(event)
    frame = Console(file=io.StringIO(), force_terminal=True, width=300, color_system="truecolor")
    frame.print(rep.render())
    screen = frame.file.getvalue()  # type: ignore[attr-defined]
    rep.note("net \x1b]0;host\x07")
    rep.run_ended(LoopResult("done", (record(1),), 1, "[bold]why[/] \x1b]0;t\x07"))
    for text in (screen, buf.getvalue()):  # the frame, and the terminal's whole stream
        assert "\x1b]" not in text and "\x1b[8m" not in text and "\x9b" not in text
        assert "\rEVIL" not in text and "\x1b[2K " not in text
    assert raw_controls(re.sub(r"\x1b\[[0-9;]*m", "", screen)) == []  # bar so's styles
    assert re.search(r"\x1b\[[0-9;]*m", screen)  # the control: so's styles still there
    assert "[bold red]MARKUP[/] [link=https://x.example]L[/link]" in screen
    assert "safe^MEVIL" in screen and "second line ^[[31mred" in screen
    assert "→ Bash^[]0;t^G: ls ^[[8mhid" in screen
    assert "net ^[]0;host^G" in buf.getvalue() and "[bold]why[/] ^[]0;t^G" in buf.getvalue()


def test_json_reporter_escapes_c1_and_bidi() -> None:
    out = io.StringIO()
    JsonReporter(out).event(Text(text="a\x9bb\u202ec\x1b]0;t\x07 é"))
    line = out.getvalue()
    assert line.isascii() and "\\u009b" in line and "\\u202e" in line
    assert json.loads(line)["text"] == "a\x9bb\u202ec\x1b]0;t\x07 é"  # nothing lost
