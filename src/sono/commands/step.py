"""so step: the loop with a human between iterations.

After each iteration: that iteration's diff summary, then a choice — continue, show the
full diff, edit the prompt for the next iteration, reset (undo) this iteration, or stop.
As in the seed, the agent is told not to commit in step mode; the human decides, and `so`
commits what is kept so every iteration has its ref on the timeline.
"""

from __future__ import annotations

import argparse
import os
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path

from sono import proc, specs
from sono.commands.launch import launch
from sono.errors import SoError
from sono.loop import StepDecision, StepHook
from sono.review import diff_text, move_to, show_diff
from sono.sandbox import Sandbox
from sono.state import IterationRecord

CHOICES = "[c]ontinue, show [d]iff, [e]dit next prompt, [r]eset this iteration, [s]top"
Ask = Callable[[str], str]


def edit_text(text: str, editor: str | None = None) -> str:
    """Open ``text`` in $VISUAL/$EDITOR (vi if unset) and return what was saved."""
    command = shlex.split(editor or os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi")
    with tempfile.NamedTemporaryFile("w", suffix=".md", prefix="so-prompt-", delete=False) as fh:
        fh.write(text)
        path = Path(fh.name)
    try:
        if proc.interactive([*command, str(path)]) != 0:
            raise SoError(f"the editor ({command[0]}) failed; the prompt is unchanged")
        return path.read_text()
    finally:
        path.unlink(missing_ok=True)


def undo_iteration(sandbox: Sandbox, rec: IterationRecord) -> None:
    """Back to where this iteration started; its ref stays on the timeline."""
    move_to(sandbox, rec.head_before)


def between(
    sandbox: Sandbox, rec: IterationRecord, ask: Ask, edit: Callable[[str], str] = edit_text
) -> StepDecision:
    """The step dialogue for one iteration (``ask`` prompts and returns the answer)."""
    stat = diff_text(sandbox, iteration=rec.n, stat=True, color=False).strip()
    print(f"\niteration {rec.n}: {len(rec.commits)} commit(s)\n{stat or '(no changes)'}")
    prompt: str | None = None
    while True:
        answer = ask(f"iteration {rec.n} done: {CHOICES}? ").strip().lower()
        if answer in ("", "c", "continue", "y"):
            return StepDecision(prompt=prompt)
        if answer in ("s", "stop", "q", "n"):
            return StepDecision(stop=True)
        if answer in ("d", "diff"):
            show_diff(sandbox, iteration=rec.n, stat=False)
        elif answer in ("e", "edit"):
            current = prompt or sandbox.read_file(specs.PROMPT) or ""
            prompt = edit(current)
            print("so: the next iteration gets the edited prompt")
        elif answer in ("r", "reset"):
            undo_iteration(sandbox, rec)
            print(f"so: iteration {rec.n} undone (back to {rec.head_before[:12]})")


def ask_between(args: argparse.Namespace) -> StepHook:
    from sono.commands import _common as c

    if c.yes(args):
        return lambda _sb, _rec: StepDecision()
    if not c.interactive_tty():
        raise SoError("so step asks between iterations and needs a terminal; use so run instead")
    return lambda sandbox, rec: between(sandbox, rec, input)


def run(args: argparse.Namespace) -> int:
    return launch(args, step=True)
