"""so shell ID [-- CMD...]: a shell (or one command) INSIDE the sandbox, agent policy."""

from __future__ import annotations

import argparse

from sono.app.sandboxes import open_shell
from sono.commands import _common as c


def run(args: argparse.Namespace) -> int:
    command = [a for a in args.cmd if a != "--"] if args.cmd and args.cmd[0] == "--" else args.cmd
    return open_shell(c.context(args), args.id, command)
