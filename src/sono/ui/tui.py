"""``so menu`` (and bare ``so``): the review TUI. Sandboxes grouped by project; the seed's
single keys act on the selected one (d diff, s shell, r reset, c continue, m merge,
x delete, l logs, q quit; Esc goes back from every sub-screen).

Everything outside the app comes through :class:`Services` — the operations' context,
how a sandbox is opened (its backend and run policy), the clock — so tests drive the real
app against a fake backend and snapshots use a fixed clock. The work itself is done by
:mod:`sono.app`, as for the command line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult, SuspendNotSupported
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import get_current_worker

from sono.app import runs, sandboxes
from sono.app.context import Context
from sono.errors import SoError
from sono.review import MergeResult, merge, reset
from sono.sandbox import Sandbox
from sono.state import SandboxRecord, Store
from sono.textsafe import file_name, one_line
from sono.ui import tui_data as data
from sono.ui.age import age
from sono.ui.tui_screens import (
    AskNumberScreen,
    ConfirmScreen,
    DiffScreen,
    LogsScreen,
    MessageScreen,
    PickScreen,
    ProgressScreen,
    TuiReporter,
    in_background,
    show_error,
)

Opener = Callable[[str, bool], Sandbox]  # (id, to run processes in it) → the sandbox


@dataclass(frozen=True)
class Services:
    """The app's seam to the world: tests pass a fake-backend opener and a fixed clock."""

    ctx: Context
    opener: Opener
    now: Callable[[], datetime]

    @property
    def store(self) -> Store:
        return self.ctx.store

    def open(self, sandbox_id: str, *, run: bool = False) -> Sandbox:
        return self.opener(sandbox_id, run)

    @classmethod
    def default(cls, ctx: Context) -> Services:
        def opener(sandbox_id: str, run: bool) -> Sandbox:
            return sandboxes.open_sandbox(ctx, sandbox_id, run=run).sandbox

        return cls(ctx=ctx, opener=opener, now=lambda: datetime.now(UTC))


COLUMNS = (
    ("ID", "id"),
    ("STATUS", "status"),
    ("HARNESS", "harness"),
    ("BACKEND", "backend"),
    ("ITER", "iter"),
    ("COMMITS", "commits"),
    ("DIFF", "diff"),
    ("AGE", "age"),
)
GROUP = "group:"  # row keys of project headings (not sandboxes: the cursor skips them)
PENDING_STAT = "…"


class MainScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "diff", "diff"),
        Binding("s", "shell", "shell"),
        Binding("r", "reset", "reset"),
        Binding("c", "continue", "continue"),
        Binding("m", "merge", "merge"),
        Binding("x", "delete", "delete"),
        Binding("l", "logs", "logs"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, services: Services, focus: str | None = None) -> None:
        super().__init__()
        self.services = services
        self.focus_id = focus
        self.records: dict[str, SandboxRecord] = {}
        self.stats: dict[tuple[str, str], str] = {}  # (id, updated) → diff stat
        self.last_row = 0

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("no sandboxes yet: start one with `so run`", id="empty")
        yield DataTable(id="sandboxes", cursor_type="row", zebra_stripes=False)
        yield Static(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for label, key in COLUMNS:
            table.add_column(label, key=key)
        self.reload()

    # --- the list ---

    def reload(self) -> None:
        """Re-read the registry, keep the cursor on the same sandbox, refresh stats."""
        keep = self.focus_id or self.selected_id()
        self.focus_id = None
        table = self.query_one(DataTable)
        records = self.services.store.all()
        self.records = {r.id: r for r in records}
        table.clear()
        for group in data.groups(records):
            table.add_row(Text(group.title, style="bold underline"), key=GROUP + group.title)
            for rec in group.records:
                table.add_row(*self.cells(rec), key=rec.id)
        self.query_one("#empty", Static).display = not records
        self.place_cursor(keep)
        self.load_stats()

    def cells(self, rec: SandboxRecord) -> tuple[Text, ...]:
        """Every cell a ``Text`` (a plain string in a DataTable would be read as markup)."""
        label, style = data.status_label(rec.live_status())
        return (
            cell(rec.id),
            Text(one_line(label, 40), style=style),
            cell(rec.harness),
            cell(rec.backend),
            cell(str(rec.iterations)),
            cell(str(rec.commits)),
            cell(self.stats.get((rec.id, rec.updated), PENDING_STAT)),
            cell(age(rec.created, self.services.now())),
        )

    def place_cursor(self, sandbox_id: str | None) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            self.show_detail()
            return
        row = table.get_row_index(sandbox_id) if sandbox_id in self.records else 1
        self.last_row = row
        table.move_cursor(row=min(row, table.row_count - 1), animate=False)
        self.show_detail()

    def selected_id(self) -> str | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return key if key in self.records else None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        table = event.data_table
        row = event.cursor_row
        if row != table.cursor_row:
            return  # stale: the cursor moved on (e.g. placed on a sandbox after a reload)
        if str(event.row_key.value).startswith(GROUP):
            step = 1 if row >= self.last_row else -1
            target = row + step if 0 <= row + step < table.row_count else row - step
            self.last_row = row
            table.move_cursor(row=max(0, min(target, table.row_count - 1)), animate=False)
            return
        self.last_row = row
        self.show_detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_diff()  # Enter on a sandbox: the most common next step

    def show_detail(self) -> None:
        rec = self.records.get(self.selected_id() or "")
        text = Text()
        if rec is not None:
            text.append(one_line(f"{rec.branch} · {rec.stop_reason or rec.live_status()}"))
            if rec.last_error:
                text.append(f"\nerror: {one_line(rec.last_error)}", style="bold")
        self.query_one("#detail", Static).update(text)

    def load_stats(self) -> None:
        """Diff stats run git inside each sandbox: off the UI thread, cached per record
        version (``updated`` changes whenever a run, reset or merge touches it)."""
        wanted = [r for r in self.records.values() if (r.id, r.updated) not in self.stats]
        if wanted:
            self.run_worker(
                functools.partial(self._stats_thread, wanted),
                thread=True,
                group="stats",
                exclusive=True,
                exit_on_error=False,
            )

    def _stats_thread(self, records: list[SandboxRecord]) -> None:
        for rec in records:
            if get_current_worker().is_cancelled:
                return  # a newer reload started its own pass
            try:
                value = data.diff_stat(self.services.open(rec.id))
            except Exception:  # removed meanwhile, or git failed: the cell says "?"
                value = "?"
            self.app.call_from_thread(self._set_stat, rec, value)

    def _set_stat(self, rec: SandboxRecord, value: str) -> None:
        self.stats[(rec.id, rec.updated)] = value
        current = self.records.get(rec.id)
        if current is not None and current.updated == rec.updated:
            self.query_one(DataTable).update_cell(rec.id, "diff", cell(value), update_width=True)

    # --- actions on the selected sandbox ---

    def chosen(self, *, idle: bool = False, run: bool = False) -> Sandbox | None:
        """The selected sandbox, opened (``run``: to run processes in, under its full
        policy); ``idle`` refuses one a loop is running in."""
        sandbox_id = self.selected_id()
        if sandbox_id is None:
            self.notify("no sandbox selected", severity="warning")
            return None
        try:
            sandbox = self.services.open(sandbox_id, run=run)
        except SoError as exc:
            show_error(self.app, "cannot open the sandbox", exc)
            self.reload()
            return None
        if idle and sandbox.record.live_status() == "running":
            show_error(
                self.app,
                "sandbox is running",
                SoError(f"sandbox {sandbox_id} is running; wait for its loop to end"),
            )
            return None
        return sandbox

    def action_diff(self) -> None:
        sandbox = self.chosen()
        if sandbox is not None:
            self.app.push_screen(DiffScreen(sandbox))

    def action_logs(self) -> None:
        sandbox_id = self.selected_id()
        if sandbox_id is None:
            self.notify("no sandbox selected", severity="warning")
            return
        self.app.push_screen(LogsScreen(self.services.store, sandbox_id))

    def action_shell(self) -> None:
        sandbox = self.chosen(run=True)
        if sandbox is None:
            return
        try:
            with self.app.suspend():
                sandboxes.shell(self.services.ctx, sandbox)
        except SuspendNotSupported:
            show_error(
                self.app,
                "no terminal to hand over",
                SoError(
                    f"this terminal cannot run a shell here; use `so shell {sandbox.record.id}`"
                ),
            )
        except SoError as exc:
            show_error(self.app, "shell failed", exc)
        self.reload()

    def action_reset(self) -> None:
        sandbox = self.chosen(idle=True)
        if sandbox is not None:
            in_background(
                self,
                "reset failed",
                lambda: data.reset_targets(sandbox),
                functools.partial(self._pick_reset, sandbox),
            )

    def _pick_reset(self, sandbox: Sandbox, targets: list[tuple[str, str]]) -> None:
        def picked(rev: str | None) -> None:
            if rev:
                self.confirm(
                    f"reset {sandbox.record.id} to {rev}? Uncommitted changes in it are lost; "
                    "the iteration refs stay.",
                    lambda: self._reset(sandbox, rev),
                )

        self.app.push_screen(PickScreen(f"reset {sandbox.record.id} to…", targets), picked)

    def _reset(self, sandbox: Sandbox, rev: str) -> None:
        in_background(
            self,
            "reset failed",
            lambda: reset(sandbox, rev),
            lambda commit: self.done(f"{sandbox.record.id} reset to {rev} ({commit[:10]})"),
        )

    def action_continue(self) -> None:
        sandbox = self.chosen(idle=True, run=True)
        if sandbox is None:
            return

        def asked(count: int | None) -> None:
            if count:
                self._continue(sandbox, count)

        question = f"how many more iterations in {sandbox.record.id}?"
        self.app.push_screen(AskNumberScreen(question), asked)

    def _continue(self, sandbox: Sandbox, count: int) -> None:
        screen = ProgressScreen(sandbox.record.id, count)
        self.app.push_screen(screen)
        reporter = TuiReporter(self.app, screen)
        app = self.app

        def body() -> None:
            try:
                result = runs.continue_run(self.services.ctx, sandbox, count, reporter).result
            except Exception as exc:  # broad on purpose: shown, never a crash
                app.call_from_thread(screen.failed)
                app.call_from_thread(show_error, app, "continue failed", exc)
            else:
                app.call_from_thread(screen.finished, result)
            app.call_from_thread(self.reload)

        self.run_worker(body, thread=True, group="continue", exit_on_error=False)

    def action_merge(self) -> None:
        sandbox = self.chosen(idle=True)
        if sandbox is None:
            return
        rec = sandbox.record
        self.confirm(
            f"merge {rec.id} into {rec.project} (branch {rec.host_branch})? "
            "The squashed change is staged, not committed; the sandbox is removed.",
            lambda: in_background(
                self,
                "merge failed",
                lambda: merge(sandbox, commit=False, keep=False),
                functools.partial(self._merged, rec),
            ),
        )

    def _merged(self, rec: SandboxRecord, result: MergeResult) -> None:
        files = "\n".join(f"  {file_name(f)}" for f in result.files[:15])
        more = f"\n  … and {len(result.files) - 15} more" if len(result.files) > 15 else ""
        self.app.push_screen(
            MessageScreen(
                "merged",
                f"{result.commits} commit(s) of {rec.id} squashed onto {result.branch} in "
                f"{rec.project}; staged, not committed ({len(result.files)} file(s)):\n"
                f"{files}{more}" + "".join(f"\n\nnote: {n}" for n in result.notes),
            )
        )
        self.reload()

    def action_delete(self) -> None:
        sandbox = self.chosen(idle=True)
        if sandbox is None:
            return
        sid = sandbox.record.id
        self.confirm(
            f"delete {sid}? Its workspace and logs are removed.",
            lambda: in_background(
                self,
                "delete failed",
                lambda: sandboxes.remove(sandbox),
                lambda _: self.done(f"{sid} deleted"),
            ),
        )

    # --- helpers ---

    def confirm(self, question: str, then: Callable[[], None]) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                then()

        self.app.push_screen(ConfirmScreen(question), answered)

    def done(self, message: str) -> None:
        self.notify(one_line(message), markup=False)
        self.reload()


def cell(value: str) -> Text:
    return Text(one_line(value, 80))


CSS = """
MainScreen DataTable { height: 1fr; }
MainScreen #empty { height: auto; padding: 1 2; }
MainScreen #detail { height: 2; padding: 0 1; }
DataTable > .datatable--cursor { text-style: reverse bold; }
.title { height: 1; padding: 0 1; }
#timeline, #iterations { width: 26; height: 1fr; }
#pane { height: 1fr; }
#progress { padding: 1 2; }
ModalScreen { align: center middle; }
.dialog { width: 70; max-width: 100%; height: auto; max-height: 90%; border: thick $accent;
          padding: 1 2; background: $surface; }
.dialog.tall { height: 20; }
.dialog OptionList { height: 1fr; }
MessageScreen.error .dialog { border: thick $error; }
.hint { margin-top: 1; text-style: italic; }
"""


class ReviewApp(App[None]):
    TITLE = "so · review"
    CSS = CSS
    ENABLE_COMMAND_PALETTE = False

    def __init__(self, services: Services, *, focus: str | None = None) -> None:
        super().__init__()
        self.services = services
        self.focus_id = focus

    def on_mount(self) -> None:
        self.push_screen(MainScreen(self.services, self.focus_id))


def run_app(ctx: Context, focus: str | None = None) -> int:
    ReviewApp(Services.default(ctx), focus=focus).run()
    return 0
