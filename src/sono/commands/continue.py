"""so continue ID -i N: more iterations in an existing sandbox."""

from __future__ import annotations

import argparse

from sono.app.runs import continue_run
from sono.app.sandboxes import open_sandbox
from sono.commands import _common as c


def run(args: argparse.Namespace) -> int:
    ctx = c.context(args)
    sandbox = open_sandbox(ctx, args.id, run=True).sandbox
    outcome = continue_run(ctx, sandbox, None, c.reporter(args))
    if outcome.result is None:
        return c.interrupted(outcome)
    c.summarize(args, outcome.sandbox, outcome.result)
    return outcome.result.exit_code
