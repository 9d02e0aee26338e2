"""so diff ID [--iter N] [--stat]: the sandbox's changes, paged."""

from __future__ import annotations

import argparse
from pathlib import Path

from sono.commands import _common as c
from sono.review import show_diff
from sono.sandbox import open_sandbox


def run(args: argparse.Namespace) -> int:
    sandbox = open_sandbox(c.store(), args.id)
    cfg = c.config(args, Path(sandbox.record.project))
    show_diff(sandbox, iteration=args.iter, stat=args.stat, pager=cfg.pager)
    return 0
