from __future__ import annotations

import io
import json

from rich.console import Console

from sono.events import Text, ToolCall, Usage
from sono.loop import LoopResult
from sono.state import IterationRecord
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


def test_quiet_reporter_prints_only_summaries() -> None:
    out = io.StringIO()
    rep = PlainReporter(out, quiet=True)
    rep.iteration_started(1, 1, "x")
    rep.event(ToolCall(name="Bash", summary="ls"))
    rep.iteration_ended(record(1), 1)
    assert out.getvalue().count("\n") == 1 and "iteration 1:" in out.getvalue()


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
