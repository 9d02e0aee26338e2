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
    rec = sandbox.record
    # The sandbox keeps the agent it was started with unless a flag says otherwise.
    remembered = {
        "harness": rec.harness,
        "model": rec.model,
        "effort": rec.effort,
        "agent_cmd": rec.agent_cmd,
    }
    for key, value in remembered.items():
        if getattr(args, key, None) is None and value is not None:
            setattr(args, key, value)
    cfg = c.config(args, Path(rec.project))
    harness = cfg.harness
    agent = c.resolve_agent(cfg, harness_name=harness)
    result = c.run_loop(args, sandbox, agent, cfg)
    if result is None:
        return 130
    c.summarize(args, sandbox, result)
    return result.exit_code
