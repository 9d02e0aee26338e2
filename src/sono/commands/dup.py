"""so dup: a loop that removes one duplicate per iteration, guided by jscpd run in the sandbox."""

from __future__ import annotations

import argparse
import re

from sono import agents, specs
from sono.app.runs import LoopRequest
from sono.commands import _common as c
from sono.commands.launch import launch
from sono.errors import SoError
from sono.sandbox import Sandbox
from sono.state import agents_dir

REPORT_LINES = 200
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TABLE_CHARS = ("┌", "│", "├", "└")


def run(args: argparse.Namespace) -> int:
    pkg = agents.TOOLS["jscpd"]
    found = agents.locate("jscpd", pkg, agents_dir(c.environ()))
    if found is None:
        raise SoError("dup needs jscpd: install it with `so agents install jscpd` (needs npm)")

    def prompt(sandbox: Sandbox) -> str:
        sandbox.with_mounts(found.mounts)
        argv = [
            str(found.path),
            "--reporters",
            "console",
            "--min-lines",
            "6",
            "--ignore",
            "**/node_modules/**,**/.git/**,**/.venv/**",
            ".",
        ]
        out = sandbox.backend.run(
            spec=sandbox.spec, argv=argv, check=False, env={"NO_COLOR": "1", "FORCE_COLOR": "0"}
        )
        return specs.DUP_PROMPT + jscpd_report(out.stdout or out.stderr)

    return launch(args, LoopRequest(prompt=prompt), needs_spec=False)


def jscpd_report(output: str) -> str:
    """The clone list from jscpd's console output, without colours or the summary table."""
    lines = [ANSI.sub("", line) for line in output.splitlines()]
    clones = [line for line in lines if not line.startswith(TABLE_CHARS)]
    report = "\n".join(clones[:REPORT_LINES]).strip()
    return report or "(jscpd found no duplicates)"
