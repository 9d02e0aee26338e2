"""Loop progress at the edge: a rich live view on terminals, plain lines elsewhere, JSON
lines for scripts. All three read the same normalized events and iteration records.

Event texts, tool calls and notes carry the agent's bytes: each reporter passes them through
:mod:`sono.textsafe` before they reach the terminal (the plain reporter at its one output
line, the live view as it stores a line), and the live view builds ``rich.text.Text`` only,
never markup, so ``[link=…]`` in agent text is just text. JSON lines escape every
non-ASCII character (C1 controls and bidi overrides included).
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any, TextIO

from sono.events import Error, Event, Result, Text, ToolCall, ToolResult, Usage
from sono.state import IterationRecord, Store, so_home
from sono.textsafe import for_terminal, one_line

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

    from sono.loop import LoopResult


def tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)


def cost(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def summary_line(record: IterationRecord) -> str:
    extra = " (timed out)" if record.timed_out else " (interrupted)" if record.interrupted else ""
    auto = ", auto-committed" if record.auto_committed else ""
    code = "-" if record.exit_code is None else record.exit_code
    return (
        f"iteration {record.n}: {record.duration_s:.1f}s, {len(record.commits)} commit(s){auto}, "
        f"{record.files_changed} file(s), tokens {tokens(record.tokens_in)} in / "
        f"{tokens(record.tokens_out)} out, {cost(record.cost_usd)}, "
        f"exit {code}{extra}, status {record.status_after}"
    )


def no_commit_line(record: IterationRecord, sandbox_id: str) -> str | None:
    """For an iteration without a commit: say so, and where the agent's output is."""
    if record.commits:
        return None
    log = Store(so_home()).iteration_dir(sandbox_id, record.n) / "output.log"
    return f"iteration {record.n} made no commit; the agent's output is in {log}"


TABLE_HEADER = ("iter", "duration", "commits", "files", "tokens in", "tokens out", "cost", "exit")


def table_rows(records: tuple[IterationRecord, ...]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [
        (
            str(r.n),
            f"{r.duration_s:.1f}s",
            str(len(r.commits)),
            str(r.files_changed),
            tokens(r.tokens_in),
            tokens(r.tokens_out),
            cost(r.cost_usd),
            "timeout" if r.timed_out else str(r.exit_code),
        )
        for r in records
    ]
    if len(records) > 1:
        total_cost = sum(r.cost_usd or 0.0 for r in records)
        any_cost = any(r.cost_usd is not None for r in records)
        rows.append(
            (
                "total",
                f"{sum(r.duration_s for r in records):.1f}s",
                str(sum(len(r.commits) for r in records)),
                "",
                tokens(sum(r.tokens_in for r in records)),
                tokens(sum(r.tokens_out for r in records)),
                cost(total_cost if any_cost else None),
                "",
            )
        )
    return rows


def render_event(event: Event) -> str | None:
    """One plain line for the events a person wants to see scroll by."""
    line: str | None = None
    if isinstance(event, ToolCall):
        line = f"→ {one_line(event.name, 60)}: {one_line(event.summary, 160)}"
    elif isinstance(event, ToolResult) and not event.ok:
        line = f"✗ tool failed: {one_line(event.summary, 160)}"
    elif isinstance(event, Text) and event.text.strip():
        line = f"· {one_line(first_line(event.text), 160)}"
    elif isinstance(event, Error):
        line = f"✗ {one_line(event.message, 160)}"
    elif isinstance(event, Result):
        line = (
            f"✓ agent finished ({event.num_turns} turns)"
            if event.ok
            else f"✗ agent reported an error: {one_line(event.text, 160)}"
        )
    return None if line is None else f"   {line}"


def text_lines(text: str) -> list[str]:
    """Agent text as safe display lines. Split at newlines only: a carriage return or
    other control in a line is shown (``^M``), not obeyed or turned into a line break."""
    lines = (line.removesuffix("\r") for line in text.strip().split("\n"))
    return [one_line(line, 200) for line in lines if line.strip()]


def first_line(text: str) -> str:
    lines = text_lines(text)
    return lines[0] if lines else ""


class PlainReporter:
    """One line per notable event on stderr; a summary line per iteration; a table at the
    end. ``quiet``: the per-iteration summaries, so's notes and the agent's errors only."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.out = stream or sys.stderr
        self.quiet = quiet
        self.sandbox_id = ""

    def iteration_started(self, i: int, n: int, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        if not self.quiet:
            self._say(f"── iteration {i}/{n} · sandbox {sandbox_id}")

    def event(self, event: Event) -> None:
        if self.quiet and not is_error(event):
            return
        line = render_event(event)
        if line:
            self._say(line)

    def iteration_ended(self, record: IterationRecord, n: int) -> None:
        self._say(f"   {summary_line(record)}")
        missing = no_commit_line(record, self.sandbox_id)
        if missing:
            self._say(f"   {missing}")

    def note(self, message: str) -> None:
        self._say(f"   so: {message}")

    def run_ended(self, result: LoopResult) -> None:
        rows = [TABLE_HEADER, *table_rows(result.iterations)]
        if len(rows) == 1 or self.quiet:
            return
        widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_HEADER))]
        for row in rows:
            self._say("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))

    def _say(self, line: str) -> None:
        print(for_terminal(line), file=self.out, flush=True)  # the one way out


def is_error(event: Event) -> bool:
    """An event that reports a failure (shown even with ``-q``)."""
    return isinstance(event, Error) or (isinstance(event, Result) and not event.ok)


class JsonReporter:
    """Normalized events as JSON lines on stdout (for scripts and CI)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.out = stream or sys.stdout

    def iteration_started(self, i: int, n: int, sandbox_id: str) -> None:
        self._emit({"kind": "iteration_started", "i": i, "n": n, "sandbox": sandbox_id})

    def event(self, event: Event) -> None:
        self._emit(event.to_json())

    def iteration_ended(self, record: IterationRecord, n: int) -> None:
        self._emit({"kind": "iteration_ended", **record.to_json()})

    def note(self, message: str) -> None:
        self._emit({"kind": "note", "message": message})

    def run_ended(self, result: LoopResult) -> None:
        """The summary line is written by the command (it knows the sandbox)."""

    def _emit(self, data: dict[str, Any]) -> None:
        print(json.dumps(data), file=self.out, flush=True)


class LiveReporter:
    """A rich live view while an iteration runs: iteration i/N, elapsed, the current tool
    call, the last lines of agent text, tokens so far; a summary line when it ends; a table
    of all iterations at the end of the run."""

    TEXT_LINES = 5

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._live: Live | None = None
        self._reset(0, 0, "")

    def _reset(self, i: int, n: int, sandbox_id: str) -> None:
        self.i, self.n, self.sandbox_id = i, n, sandbox_id
        self.t0 = time.monotonic()
        self.tool = ""
        self.text: deque[str] = deque(maxlen=self.TEXT_LINES)
        self.usage = Usage()

    def iteration_started(self, i: int, n: int, sandbox_id: str) -> None:
        from rich.live import Live

        self._stop()
        self._reset(i, n, sandbox_id)
        self._live = Live(
            get_renderable=self.render,
            console=self.console,
            refresh_per_second=4,
            transient=True,
        )
        self._live.start()

    def event(self, event: Event) -> None:
        if isinstance(event, ToolCall):
            self.tool = f"{one_line(event.name, 60)}: {one_line(event.summary, 160)}"
        elif isinstance(event, Text) and event.text.strip():
            self.text.extend(text_lines(event.text))
        elif isinstance(event, Usage):
            self.usage = Usage(
                input_tokens=self.usage.input_tokens + event.input_tokens,
                output_tokens=self.usage.output_tokens + event.output_tokens,
                cached_tokens=self.usage.cached_tokens + event.cached_tokens,
                cost_usd=None
                if event.cost_usd is None and self.usage.cost_usd is None
                else (self.usage.cost_usd or 0.0) + (event.cost_usd or 0.0),
            )
        elif isinstance(event, Error):
            self.text.append(f"error: {one_line(event.message, 200)}")

    def render(self) -> RenderableType:
        from rich.panel import Panel
        from rich.text import Text as RichText

        elapsed = int(time.monotonic() - self.t0)
        head = (
            f"iteration {self.i}/{self.n} · {elapsed // 60:02d}:{elapsed % 60:02d} · "
            f"tokens {tokens(self.usage.input_tokens)} in / {tokens(self.usage.output_tokens)} out"
            f" · {cost(self.usage.cost_usd)}"
        )
        body = RichText(head, style="bold")
        body.append("\n→ " + (self.tool or "(no tool call yet)"), style="cyan")
        for line in self.text:
            body.append("\n  " + line[:200], style="dim")
        title = RichText(f"so · {one_line(self.sandbox_id, 60)}")
        return Panel(body, title=title, title_align="left")

    def iteration_ended(self, record: IterationRecord, n: int) -> None:
        self._stop()
        self._print(summary_line(record))
        missing = no_commit_line(record, self.sandbox_id)
        if missing:
            self._print(missing)

    def note(self, message: str) -> None:
        if message.startswith("interrupted"):
            self._stop()  # leave the terminal clean before the process exits
        self._print(f"so: {message}")

    def run_ended(self, result: LoopResult) -> None:
        from rich.table import Table
        from rich.text import Text as RichText

        self._stop()
        if not result.iterations:
            return
        title = RichText(one_line(f"{result.outcome}: {result.message}"))
        table = Table(title=title, title_justify="left")
        for name in TABLE_HEADER:
            table.add_column(name, justify="right")
        for row in table_rows(result.iterations):
            table.add_row(*(RichText(cell) for cell in row))
        self.console.print(table)

    def _print(self, line: str) -> None:
        """so's own lines: no markup, no highlighting, and controls shown, not obeyed."""
        from rich.text import Text as RichText

        self.console.print(RichText(for_terminal(line)), highlight=False)

    def close(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
