"""so shell ID [-- CMD...]: a shell (or one command) INSIDE the sandbox, agent policy."""

from __future__ import annotations

import argparse
from pathlib import Path

from sono.commands import _common as c
from sono.sandbox import open_sandbox


def run(args: argparse.Namespace) -> int:
    sandbox = open_sandbox(c.store(), args.id)
    command = [a for a in args.cmd if a != "--"] if args.cmd and args.cmd[0] == "--" else args.cmd
    cfg = c.config(args, Path(sandbox.record.project))
    sandbox.limits = c.enforceable_limits(cfg, sandbox.backend)
    sandbox.files = c.extra_files(cfg)
    with c.serving(sandbox, cfg):
        return sandbox.shell(command)
