"""so merge ID [--commit]: squash the sandbox's work onto the host's current branch."""

from __future__ import annotations

import argparse
import sys

from sono.commands import _common as c
from sono.review import merge
from sono.sandbox import open_sandbox


def run(args: argparse.Namespace) -> int:
    sandbox = open_sandbox(c.store(), args.id)
    rec = sandbox.record
    if not c.confirm(args, f"squash-merge sandbox {rec.id} into {rec.project}?"):
        print("so: merge cancelled")
        return 1
    result = merge(sandbox, commit=args.commit, keep=args.keep)
    for note in result.notes:
        print(f"so: {note}", file=sys.stderr)
    state = "committed" if result.committed else "staged (review, then git commit)"
    where = result.branch or "detached HEAD"
    print(
        f"so: merged {result.commits} commit(s) from {rec.id} into {where}: "
        f"{len(result.files)} file(s) {state}"
    )
    if not args.keep:
        print(f"so: sandbox {rec.id} removed")
    return 0
