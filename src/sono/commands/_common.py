"""What commands share: argv → :class:`~sono.app.context.Context`, prompts, output.

The work itself is in :mod:`sono.app`; a command parses, builds options, calls it and
prints."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from sono.app.context import Context
from sono.app.runs import Outcome
from sono.cli.flags import flags_of
from sono.config import Config
from sono.errors import SoError
from sono.loop import LoopResult, Reporter
from sono.sandbox import Sandbox
from sono.state import Store, so_home
from sono.textsafe import one_line
from sono.ui.reporter import JsonReporter, PlainReporter


def environ() -> Mapping[str, str]:
    return os.environ


def store() -> Store:
    return Store(so_home(environ()))


def context(args: argparse.Namespace) -> Context:
    """The operations' context: this process's environment and home, the config keys
    the command line sets."""
    return Context(env=environ(), home=Path.home(), flags=flags_of(args))


def config(args: argparse.Namespace, project: Path | None) -> Config:
    return context(args).config(project)


def yes(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "yes", False))


def interactive_tty() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def ask(prompt: str, on_end: str = "q") -> str:
    """One line typed at a prompt; Ctrl-D (end of input) answers ``on_end`` — quit,
    stop or no, wherever it is asked."""
    try:
        return input(prompt)
    except EOFError:
        print(file=sys.stderr)
        return on_end


def confirm(args: argparse.Namespace, question: str) -> bool:
    if yes(args):
        return True
    if not interactive_tty():
        raise SoError(f"{question} — no terminal to ask on; pass --yes to confirm")
    answer = ask(f"{question} [y/N] ", on_end="n").strip().lower()
    return answer in ("y", "yes")


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def reporter(args: argparse.Namespace) -> Reporter:
    """The progress view the flags ask for: JSON lines, plain lines, or live."""
    if getattr(args, "json", False):
        return JsonReporter()
    quiet = bool(getattr(args, "quiet", False))
    if not quiet and sys.stderr.isatty() and os.environ.get("TERM") != "dumb":
        from sono.ui.reporter import LiveReporter

        return LiveReporter()
    return PlainReporter(quiet=quiet)


def summarize(args: argparse.Namespace, sandbox: Sandbox, result: LoopResult) -> None:
    sid = sandbox.record.id
    if getattr(args, "json", False):
        print(
            json.dumps(
                {
                    "kind": "summary",
                    "id": sid,
                    "outcome": result.outcome,
                    "exit_code": result.exit_code,
                    "message": result.message,
                    "planned": result.planned,
                    "branch": sandbox.record.branch,
                    "workspace": sandbox.record.workspace,
                    "iterations": [r.to_json() for r in result.iterations],
                }
            )
        )
        return
    print(
        one_line(
            f"so: {result.outcome.replace('_', ' ')}: {result.message} (sandbox {sid}, "
            f"{len(result.iterations)} iteration(s))",
            400,
        ),
        file=sys.stderr,
    )
    if getattr(args, "quiet", False):
        return  # -q: the outcome line only
    print(
        f"  review:   so diff {sid}   so shell {sid}   so reset {sid} iter-N\n"
        f"  continue: so continue {sid} -i N\n"
        f"  merge:    so merge {sid}   (or remove: so rm {sid})",
        file=sys.stderr,
    )


def interrupted(outcome: Outcome) -> int:
    """The line after Ctrl-C or a signal stopped a run, and its exit code."""
    sid, reason = outcome.sandbox.record.id, outcome.sandbox.record.stop_reason
    print(
        f"so: {reason or 'interrupted'}; sandbox {sid} kept. Continue with: so continue {sid} "
        f"-i {outcome.config.iterations}  (or review: so diff {sid})",
        file=sys.stderr,
    )
    return outcome.exit_code
