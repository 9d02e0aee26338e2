"""so step: the loop with a human between iterations (continue / show diff / stop)."""

from __future__ import annotations

import argparse

from sono.commands.launch import launch
from sono.errors import SoError
from sono.loop import StepHook
from sono.review import show_diff
from sono.sandbox import Sandbox
from sono.state import IterationRecord


def ask_between(args: argparse.Namespace) -> StepHook:
    from sono.commands import _common as c

    if c.yes(args):
        return lambda _sb, _rec: "continue"
    if not c.interactive_tty():
        raise SoError("so step asks between iterations and needs a terminal; use so run instead")

    def hook(sandbox: Sandbox, rec: IterationRecord) -> str:
        while True:
            answer = input(f"iteration {rec.n} done: [c]ontinue, show [d]iff, [s]top? ").strip()
            if answer in ("", "c", "continue", "y"):
                return "continue"
            if answer in ("d", "diff"):
                show_diff(sandbox, iteration=rec.n, stat=False)
            elif answer in ("s", "stop", "q", "n"):
                return "stop"

    return hook


def run(args: argparse.Namespace) -> int:
    return launch(args, step=True)
