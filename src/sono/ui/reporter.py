"""Loop progress rendering at the edge: plain lines for people, JSON lines for scripts."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from sono.events import Event, Result, Text, ToolCall, ToolResult, Usage, dumps
from sono.state import IterationRecord


class PlainReporter:
    """One line per notable event on stderr; a summary line per iteration."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.out = stream or sys.stderr
        self.quiet = quiet
        self.tokens = (0, 0)

    def iteration_started(self, i: int, n: int, sandbox_id: str) -> None:
        self.tokens = (0, 0)
        self._say(f"── iteration {i}/{n} · sandbox {sandbox_id}")

    def event(self, event: Event) -> None:
        if isinstance(event, Usage):
            self.tokens = (
                self.tokens[0] + event.input_tokens,
                self.tokens[1] + event.output_tokens,
            )
        if self.quiet:
            return
        line = render_event(event)
        if line:
            self._say(line)

    def iteration_ended(self, record: IterationRecord, n: int) -> None:
        commits = len(record.commits)
        extra = " (timed out)" if record.timed_out else ""
        auto = ", auto-committed" if record.auto_committed else ""
        self._say(
            f"   iteration {record.n}: {record.duration_s:.1f}s, {commits} commit(s){auto}, "
            f"exit {record.exit_code}{extra}, tokens in/out {self.tokens[0]}/{self.tokens[1]}, "
            f"status {record.status_after}"
        )

    def note(self, message: str) -> None:
        self._say(f"   so: {message}")

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)


class JsonReporter:
    """Normalized events as JSON lines on stdout (for scripts and CI)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.out = stream or sys.stdout

    def iteration_started(self, i: int, n: int, sandbox_id: str) -> None:
        self._emit({"kind": "iteration_started", "i": i, "n": n, "sandbox": sandbox_id})

    def event(self, event: Event) -> None:
        print(dumps(event), file=self.out, flush=True)

    def iteration_ended(self, record: IterationRecord, n: int) -> None:
        self._emit({"kind": "iteration_ended", **record.to_json()})

    def note(self, message: str) -> None:
        self._emit({"kind": "note", "message": message})

    def _emit(self, data: dict[str, object]) -> None:
        print(json.dumps(data), file=self.out, flush=True)


def render_event(event: Event) -> str | None:
    if isinstance(event, ToolCall):
        return f"   → {event.name}: {event.summary}"
    if isinstance(event, ToolResult) and not event.ok:
        return f"   ✗ tool failed: {event.summary}"
    if isinstance(event, Text) and event.text.strip():
        first = event.text.strip().splitlines()[0]
        return f"   · {first[:160]}"
    if isinstance(event, Result):
        return (
            f"   ✓ agent finished ({event.num_turns} turns)"
            if event.ok
            else f"   ✗ agent reported an error: {event.text[:160]}"
        )
    return None
