"""so reset ID <iter-N|base|commit>: move the sandbox back on its timeline."""

from __future__ import annotations

import argparse

from sono.commands import _common as c
from sono.review import reset
from sono.sandbox import open_sandbox


def run(args: argparse.Namespace) -> int:
    sandbox = open_sandbox(c.store(), args.id)
    commit = reset(sandbox, args.rev)
    print(f"so: sandbox {sandbox.record.id} reset to {args.rev} ({commit[:12]})")
    return 0
