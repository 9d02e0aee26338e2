"""The review TUI's sub-screens and dialogs: diff, logs, continue progress, confirm, pick.

Text reaches widgets only as ``rich.text.Text`` (never a markup string) and only after
:mod:`sono.textsafe`: dialogs sanitise what they are given (an error may quote the
sandbox's git), the progress screen each event as it arrives.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, TypeVar

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from sono.errors import SoError
from sono.events import Error, Event, ToolCall, Usage
from sono.events import Text as TextEvent
from sono.review import diff_text
from sono.sandbox import Sandbox
from sono.state import IterationRecord, Store
from sono.textsafe import for_terminal, one_line
from sono.ui import tui_data as data
from sono.ui.reporter import summary_line, text_lines, tokens

if TYPE_CHECKING:
    from textual.app import App

    from sono.loop import LoopResult

T = TypeVar("T")

MAX_DIFF_LINES = 5000  # rendering more would stall the UI; `so diff` shows everything


def show_error(app: App[None], title: str, exc: BaseException) -> None:
    message = str(exc) if isinstance(exc, SoError) else f"{type(exc).__name__}: {exc}"
    app.push_screen(MessageScreen(title, message, error=True))


def in_background(
    node: DOMNode, title: str, work: Callable[[], T], done: Callable[[T], None]
) -> None:
    """Run ``work`` (git inside the sandbox) off the UI thread; its result goes to
    ``done`` on the UI thread and any failure to a dialog: an action never crashes the app."""
    app = node.app

    def body() -> None:
        try:
            result = work()
        except Exception as exc:  # broad on purpose: the dialog shows what went wrong
            app.call_from_thread(show_error, app, title, exc)
            return
        app.call_from_thread(done, result)

    node.run_worker(body, thread=True, group="action", exit_on_error=False)


class MessageScreen(ModalScreen[None]):
    """A message that stays until dismissed (errors must not scroll away)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,enter,q", "dismiss", "close")]

    def __init__(self, title: str, message: str, *, error: bool = False) -> None:
        super().__init__(classes="error" if error else "")
        self.heading = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(one_line(self.heading), style="bold"), classes="heading")
            yield Static(Text(for_terminal(self.message)))
            yield Static("enter/esc: close", classes="hint")


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(for_terminal(self.question)))
            yield Static("y: yes   n/esc: no", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class AskNumberScreen(ModalScreen[int | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(self, question: str, default: int = 1) -> None:
        super().__init__()
        self.question = question
        self.default = default

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(for_terminal(self.question)))
            yield Input(value=str(self.default), type="integer", id="number")
            yield Static("enter: ok   esc: cancel", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        if value.isdigit() and int(value) > 0:
            self.dismiss(int(value))
        else:
            self.notify("give a number of iterations (1 or more)", severity="warning")

    def action_cancel(self) -> None:
        self.dismiss(None)


class PickScreen(ModalScreen[str | None]):
    """Choose one of ``(id, label)``; Enter picks, Esc cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(self, title: str, choices: list[tuple[str, str]]) -> None:
        super().__init__()
        self.heading = title
        self.choices = choices

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog tall"):
            yield Static(Text(one_line(self.heading), style="bold"))
            yield OptionList(
                *(Option(Text(one_line(label)), id=key) for key, label in self.choices)
            )
            yield Static("↑↓: move   enter: pick   esc: cancel", classes="hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class DiffScreen(Screen[None]):
    """The whole run's diff, or one iteration's picked from the timeline on the left."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("pagedown,space", "scroll(1)", "page down", show=False),
        Binding("pageup,b", "scroll(-1)", "page up", show=False),
        Binding("tab", "app.focus_next", "focus diff/timeline"),
    ]

    def __init__(self, sandbox: Sandbox) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.wanted: int | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="title", classes="title")
        with Horizontal():
            yield OptionList(Option("whole run", id="all"), id="timeline")
            with VerticalScroll(id="pane"):
                yield Static(id="diff")
        yield Footer()

    def on_mount(self) -> None:
        in_background(self, "timeline", lambda: data.timeline(self.sandbox), self._timeline)
        self.show(None)

    def _timeline(self, entries: list[tuple[int, str]]) -> None:
        timeline = self.query_one("#timeline", OptionList)
        timeline.add_options(
            Option(Text(f"{n} {subject}"), id=f"iter-{n}") for n, subject in entries
        )

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        key = event.option.id or "all"
        self.show(None if key == "all" else int(key.removeprefix("iter-")))

    def show(self, iteration: int | None) -> None:
        self.wanted = iteration
        what = "whole run" if iteration is None else f"iteration {iteration}"
        self.query_one("#title", Static).update(
            Text(f"diff · {self.sandbox.record.id} · {what}", style="bold")
        )
        self.query_one("#diff", Static).update("loading…")
        in_background(
            self,
            "diff failed",
            lambda: diff_text(self.sandbox, iteration=iteration, stat=False, color=False),
            lambda text: self._diff(iteration, text),
        )

    def _diff(self, iteration: int | None, text: str) -> None:
        if iteration != self.wanted:
            return  # a later pick is on its way; keep the screen consistent with it
        lines = data.diff_lines(text, MAX_DIFF_LINES)
        body = "\n".join(lines) if lines else "(no changes)"
        syntax = Syntax(body, "diff", theme="ansi_dark", word_wrap=True, background_color="default")
        self.query_one("#diff", Static).update(syntax)
        self.query_one("#pane", VerticalScroll).scroll_home(animate=False)

    def action_scroll(self, pages: int) -> None:
        pane = self.query_one("#pane", VerticalScroll)
        (pane.scroll_page_down if pages > 0 else pane.scroll_page_up)(animate=False)


class LogsScreen(Screen[None]):
    """One iteration's normalized events, or its raw output (``t`` toggles)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("t", "raw", "events/raw"),
        Binding("tab", "app.focus_next", "focus log/list"),
    ]

    def __init__(self, store: Store, sandbox_id: str) -> None:
        super().__init__()
        self.store = store
        self.sandbox_id = sandbox_id
        self.raw = False
        numbers = data.iteration_numbers(store, sandbox_id)
        self.iteration: int | None = numbers[-1] if numbers else None
        self.numbers = numbers

    def compose(self) -> ComposeResult:
        yield Static(id="title", classes="title")
        with Horizontal():
            yield OptionList(
                *(Option(f"iteration {n}", id=str(n)) for n in self.numbers), id="iterations"
            )
            with VerticalScroll(id="pane"):
                yield Static(id="log")
        yield Footer()

    def on_mount(self) -> None:
        if self.numbers:
            self.query_one("#iterations", OptionList).highlighted = len(self.numbers) - 1
        self.render_log()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.iteration = int(event.option.id or "0")
        self.render_log()

    def action_raw(self) -> None:
        self.raw = not self.raw
        self.render_log()

    def render_log(self) -> None:
        n = self.iteration
        what = "raw output" if self.raw else "events"
        title = f"logs · {self.sandbox_id} · " + (f"iteration {n} · {what}" if n else "none")
        self.query_one("#title", Static).update(Text(title, style="bold"))
        if n is None:
            lines = ["no iterations yet"]
        elif self.raw:
            lines = data.raw_lines(self.store, self.sandbox_id, n)
        else:
            lines = data.event_lines(self.store, self.sandbox_id, n)
        self.query_one("#log", Static).update(Text("\n".join(lines)))


class ProgressScreen(Screen[None]):
    """Live progress of ``continue``: iteration i/N, the current tool call, the last lines
    of agent text, tokens; fed by :class:`TuiReporter` from the loop's thread."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "leave", "back")]
    TEXT_LINES = 6

    def __init__(self, sandbox_id: str, count: int) -> None:
        super().__init__()
        self.sandbox_id = sandbox_id
        self.count = count
        self.running = True
        self.i = 0
        self.n = count
        self.tool = ""
        self.text: deque[str] = deque(maxlen=self.TEXT_LINES)
        self.tokens_in = 0
        self.tokens_out = 0
        self.done: list[str] = []
        self.outcome = ""

    def compose(self) -> ComposeResult:
        yield Static(Text(f"continue · {self.sandbox_id}", style="bold"), classes="title")
        yield Static(id="progress")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()

    def iteration_started(self, i: int, n: int) -> None:
        self.i, self.n, self.tool = i, n, ""
        self.text.clear()
        self.redraw()

    def event(self, event: Event) -> None:
        if isinstance(event, ToolCall):
            self.tool = f"{one_line(event.name, 60)}: {one_line(event.summary, 160)}"
        elif isinstance(event, TextEvent):
            self.text.extend(text_lines(event.text))
        elif isinstance(event, Usage):
            self.tokens_in += event.input_tokens
            self.tokens_out += event.output_tokens
        elif isinstance(event, Error):
            self.text.append(f"error: {one_line(event.message)}")
        self.redraw()

    def iteration_ended(self, record: IterationRecord) -> None:
        self.done.append(summary_line(record))
        self.redraw()

    def note(self, message: str) -> None:
        self.text.append(f"so: {one_line(message)}")
        self.redraw()

    def finished(self, result: LoopResult | None) -> None:
        self.running = False
        outcome = "interrupted" if result is None else f"{result.outcome}: {result.message}"
        self.outcome = one_line(outcome)
        self.redraw()

    def failed(self) -> None:
        self.running = False
        self.outcome = "failed (see the message)"
        self.redraw()

    def redraw(self) -> None:
        body = Text()
        body.append(
            f"iteration {self.i}/{self.n} · tokens {tokens(self.tokens_in)} in / "
            f"{tokens(self.tokens_out)} out\n",
            style="bold",
        )
        body.append("→ " + (self.tool or "(no tool call yet)") + "\n")
        for line in self.text:
            body.append("  " + line[:200] + "\n", style="dim")
        for line in self.done:
            body.append(line + "\n")
        state = "running… (esc works when it ends)" if self.running else self.outcome
        body.append(f"\n{state}", style="bold")
        self.query_one("#progress", Static).update(body)

    def action_leave(self) -> None:
        if self.running:
            self.notify("the loop is still running; wait for this iteration to end")
        else:
            self.dismiss()


class TuiReporter:
    """The loop's :class:`~sono.loop.Reporter`, called on the loop's thread: hands each
    call to the progress screen on the UI thread."""

    def __init__(self, app: App[None], screen: ProgressScreen) -> None:
        self.app = app
        self.screen = screen

    def iteration_started(self, i: int, n: int, sandbox_id: str) -> None:
        self.app.call_from_thread(self.screen.iteration_started, i, n)

    def event(self, event: Event) -> None:
        self.app.call_from_thread(self.screen.event, event)

    def iteration_ended(self, record: IterationRecord, n: int) -> None:
        self.app.call_from_thread(self.screen.iteration_ended, record)

    def note(self, message: str) -> None:
        self.app.call_from_thread(self.screen.note, message)

    def run_ended(self, result: LoopResult) -> None:
        """The worker's completion reports the end (it also sees errors)."""
