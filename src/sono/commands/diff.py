"""so diff ID [--iter N] [--stat]: the sandbox's changes, paged."""

from __future__ import annotations

import argparse

from sono.app.sandboxes import open_sandbox
from sono.commands import _common as c
from sono.review import show_diff


def run(args: argparse.Namespace) -> int:
    opened = open_sandbox(c.context(args), args.id)
    show_diff(opened.sandbox, iteration=args.iter, stat=args.stat, pager=opened.config.pager)
    return 0
