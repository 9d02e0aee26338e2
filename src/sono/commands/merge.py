"""so merge ID [--commit]: squash the sandbox's work onto the host's current branch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sono.app.sandboxes import open_sandbox, require_idle
from sono.commands import _common as c
from sono.review import merge


def run(args: argparse.Namespace) -> int:
    sandbox = open_sandbox(c.context(args), args.id).sandbox
    require_idle(sandbox)
    rec = sandbox.record

    def approve(risky: Sequence[str]) -> bool:
        """Asked after every check and before any file is written; the files that run
        code are listed first, whatever the answer (--yes too)."""
        question = f"squash-merge sandbox {rec.id} into {rec.project}?"
        if risky:
            print(
                f"so: sandbox {rec.id} changes files that run code or that git, hooks, CI, "
                "your editor, so or your agents trust (read them: "
                f"`so diff {rec.id}`):",
                file=sys.stderr,
            )
            for name in risky:
                print(f"so:   {name}", file=sys.stderr)
            question = (
                f"squash-merge sandbox {rec.id} into {rec.project}, "
                f"with the {len(risky)} file(s) listed above?"
            )
        return c.confirm(args, question)

    result = merge(sandbox, commit=args.commit, keep=args.keep, approve=approve)
    for note in result.notes:
        print(f"so: {note}", file=sys.stderr)
    state = "committed" if result.committed else "staged (review, then git commit)"
    where = f"{result.branch or 'detached HEAD'} of {rec.project}"
    if result.files:
        print(
            f"so: merged {result.commits} commit(s) from {rec.id} into {where}: "
            f"{len(result.files)} file(s) {state}"
        )
    else:
        print(f"so: nothing to merge: the changes of {rec.id} are already in {where}")
    if not args.keep:
        print(f"so: sandbox {rec.id} removed")
    return 0
