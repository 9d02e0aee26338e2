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
from sono.app.runs import LoopRequest
from sono.commands import _common as c
from sono.commands.launch import launch
from sono.errors import SoError
from sono.loop import StepDecision, StepHook
from sono.review import diff_range, move_to, show_diff
from sono.sandbox import Sandbox
from sono.state import IterationRecord
from sono.textsafe import file_name

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


def change_summary(sandbox: Sandbox, n: int) -> str:
    """Iteration ``n``'s changed files, one per line. Built from ``--numstat -z`` (names
    as raw bytes, whatever the sandbox's git config says) and shown with
    :func:`~sono.textsafe.file_name`: a control or look-alike character in a name is
    visible, never obeyed."""
    start, end = diff_range(sandbox, n)
    out = sandbox.vault.git("diff", "--no-ext-diff", "--numstat", "-z", "-M", start, end).stdout
    return "\n".join(numstat_lines(out)) or "(no changes)"


def numstat_lines(out: str) -> list[str]:
    """``git diff --numstat -z`` output → `` name  +added -deleted`` lines and a total."""
    fields = out.split("\0")
    lines, plus, minus, i = [], 0, 0, 0
    while i < len(fields) and fields[i].count("\t") >= 2:
        added, deleted, name = fields[i].split("\t", 2)
        if not name and i + 2 < len(fields):  # a rename: old and new name follow
            name = f"{file_name(fields[i + 1])} → {file_name(fields[i + 2])}"
            i += 2
        else:
            name = file_name(name)
        i += 1
        if added.isdigit() and deleted.isdigit():
            plus, minus = plus + int(added), minus + int(deleted)
            lines.append(f" {name}  +{added} -{deleted}")
        else:
            lines.append(f" {name}  (binary)")
    if lines:
        lines.append(f" {len(lines)} file(s) changed, +{plus} -{minus}")
    return lines


def between(
    sandbox: Sandbox, rec: IterationRecord, ask: Ask, edit: Callable[[str], str] = edit_text
) -> StepDecision:
    """The step dialogue for one iteration (``ask`` prompts and returns the answer)."""
    print(f"\niteration {rec.n}: {len(rec.commits)} commit(s)\n{change_summary(sandbox, rec.n)}")
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
    """Asked before anything is created: without a terminal it refuses."""
    if c.yes(args):
        return lambda _sb, _rec: StepDecision()
    if not c.interactive_tty():
        raise SoError("so step asks between iterations and needs a terminal; use so run instead")
    return lambda sandbox, rec: between(sandbox, rec, lambda prompt: c.ask(prompt, on_end="s"))


def run(args: argparse.Namespace) -> int:
    return launch(args, LoopRequest(step_hook=ask_between(args)))
