"""so continue ID -i N: more iterations in an existing sandbox."""

from __future__ import annotations

import argparse
from pathlib import Path

from sono.commands import _common as c
from sono.errors import SoError
from sono.sandbox import open_sandbox


def run(args: argparse.Namespace) -> int:
    sandbox = open_sandbox(c.store(), args.id)
    if sandbox.record.live_status() == "running":
        raise SoError(
            f"sandbox {sandbox.record.id} is already running (pid {sandbox.record.runner_pid})"
        )
    cfg = c.config(args, Path(sandbox.record.project))
    harness = getattr(args, "harness", None) or sandbox.record.harness
    agent = c.resolve_agent(cfg, harness_name=harness)
    result = c.run_loop(args, sandbox, agent, cfg)
    if result is None:
        return 130
    c.summarize(args, sandbox, result)
    return result.exit_code
