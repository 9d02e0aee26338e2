"""Create a sandbox from the current project and run a loop in it (run/step/clean/dup)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sono.app.runs import LoopRequest, StartOptions, start
from sono.commands import _common as c


def launch(
    args: argparse.Namespace, request: LoopRequest | None = None, *, needs_spec: bool = True
) -> int:
    """The loop in a new sandbox; on a terminal (no --yes, no --json) the review menu of
    that sandbox afterwards."""
    as_json = bool(getattr(args, "json", False))
    opts = StartOptions(
        cwd=Path.cwd(),
        allow_dirty=bool(getattr(args, "allow_dirty", False)),
        needs_spec=needs_spec,
        request=request or LoopRequest(),
        announce=not as_json and not getattr(args, "quiet", False),
    )
    outcome = start(c.context(args), opts, c.reporter(args))
    if outcome.result is None:
        return c.interrupted(outcome)
    c.summarize(args, outcome.sandbox, outcome.result)
    if not c.yes(args) and c.interactive_tty() and not as_json:
        from sono.commands.menu import sandbox_menu

        sandbox_menu(args, outcome.sandbox.record.id)
    return outcome.result.exit_code
