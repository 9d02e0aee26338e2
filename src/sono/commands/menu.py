"""so menu (and bare so): the review TUI (sono.ui.tui). Without a terminal it prints the
list and exits 0; on a terminal that cannot draw a full-screen app (TERM=dumb) it falls
back to the seed's numbered menu."""

from __future__ import annotations

import argparse
import os

from sono.app.context import Context
from sono.app.runs import continue_run
from sono.app.sandboxes import open_sandbox, remove, shell
from sono.commands import _common as c
from sono.commands.list import check_config, table
from sono.errors import SoError
from sono.review import merge, reset, show_diff
from sono.state import SandboxRecord
from sono.textsafe import for_terminal, one_line

ACTIONS = "[d]iff  [s]hell  [r]eset  [c]ontinue  [m]erge  [x] delete  [q]uit"


def run(args: argparse.Namespace) -> int:
    check_config()  # a broken config file is an error here too, not passed over
    store = c.store()
    records = store.all()
    if not c.interactive_tty():
        print(table(records) if records else "no sandboxes yet: start one with `so run`")
        return 0
    if _can_draw():
        from sono.ui.tui import run_app

        return run_app(c.context(args))
    return _numbered_menu(args, records)


def _can_draw() -> bool:
    return os.environ.get("TERM", "") not in ("", "dumb")


def _numbered_menu(args: argparse.Namespace, records: list[SandboxRecord]) -> int:
    store = c.store()
    while records:
        print(table(records))
        answer = c.ask("\nsandbox number or id (q to quit): ").strip()
        if answer in ("q", "quit", ""):
            return 0
        chosen = _pick(answer, [r.id for r in records])
        if chosen:
            _sandbox_keys(args, chosen)
        records = store.all()
    print("no sandboxes yet: start one with `so run`")
    return 0


def _pick(answer: str, ids: list[str]) -> str | None:
    if answer.isdigit() and 1 <= int(answer) <= len(ids):
        return ids[int(answer) - 1]
    matches = [i for i in ids if i.startswith(answer)]
    return matches[0] if len(matches) == 1 else None


def sandbox_menu(args: argparse.Namespace, sandbox_id: str) -> None:
    """Review one sandbox (after `so run` on a terminal): the TUI with that sandbox
    selected, or the numbered keys on a dumb terminal."""
    if _can_draw():
        from sono.ui.tui import run_app

        run_app(c.context(args), focus=sandbox_id)
        return
    _sandbox_keys(args, sandbox_id)


def _sandbox_keys(args: argparse.Namespace, sandbox_id: str) -> None:
    """The seed's review keys for one sandbox; returns on q/Esc or when it is gone."""
    ctx = c.context(args)
    while True:
        sandbox = open_sandbox(ctx, sandbox_id).sandbox
        rec = sandbox.record
        state = f"{rec.id}: {rec.live_status()}, {rec.iterations} iteration(s), {rec.commits}"
        print(f"\n{one_line(state)} commit(s)\n{ACTIONS}")
        key = c.ask("> ").strip().lower()
        try:
            if key in ("q", "\x1b", ""):
                return
            if key == "d":
                show_diff(sandbox, iteration=None, stat=False)
            elif key == "s":
                shell(ctx, open_sandbox(ctx, sandbox_id, run=True).sandbox)
            elif key == "r":
                rev = c.ask("reset to (iter-N, base or commit): ", on_end="").strip()
                if rev and c.confirm(args, f"reset {rec.id} to {rev}?"):
                    reset(sandbox, rev)
            elif key == "c":
                _continue(ctx, args, rec.id, c.ask("how many iterations? ").strip() or "1")
            elif key == "m":
                if c.confirm(args, f"merge {rec.id} into {rec.project}?"):
                    merge(sandbox, commit=False, keep=False)
                    print("merged: the change is staged in your repository")
                    return
            elif key == "x" and c.confirm(args, f"delete {rec.id}?"):
                remove(sandbox)
                return
        except SoError as exc:
            print(f"so: error: {for_terminal(str(exc))}")


def _continue(ctx: Context, args: argparse.Namespace, sandbox_id: str, count: str) -> None:
    if not count.isdigit():
        print("so: give a number of iterations")
        return
    sandbox = open_sandbox(ctx, sandbox_id, run=True).sandbox
    outcome = continue_run(ctx, sandbox, int(count), c.reporter(args))
    if outcome.result is None:
        c.interrupted(outcome)
    else:
        c.summarize(args, outcome.sandbox, outcome.result)
