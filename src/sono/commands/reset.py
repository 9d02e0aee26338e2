"""so reset ID <iter-N|base|commit>: move the sandbox back on its timeline."""

from __future__ import annotations

import argparse

from sono.app.sandboxes import open_sandbox
from sono.commands import _common as c
from sono.review import reset


def run(args: argparse.Namespace) -> int:
    sandbox = open_sandbox(c.context(args), args.id).sandbox
    commit = reset(sandbox, args.rev)
    print(f"so: sandbox {sandbox.record.id} reset to {args.rev} ({commit[:12]})")
    return 0
