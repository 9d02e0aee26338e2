"""so dup: a loop that removes one duplicate per iteration, guided by jscpd run in the sandbox."""

from __future__ import annotations

import argparse

from sono import agents, specs
from sono.commands import _common as c
from sono.commands.launch import launch
from sono.errors import SoError
from sono.sandbox import Sandbox
from sono.state import agents_dir

REPORT_LINES = 200


def run(args: argparse.Namespace) -> int:
    pkg = agents.TOOLS["jscpd"]
    found = agents.locate("jscpd", pkg, agents_dir(c.environ()))
    if found is None:
        raise SoError("dup needs jscpd: install it with `so agents install jscpd` (needs npm)")

    def prompt(sandbox: Sandbox) -> str:
        sandbox.with_mounts(found.mounts)
        out = sandbox.backend.run(
            spec=sandbox.spec,
            check=False,
            argv=[
                str(found.path),
                "--silent",
                "--reporters",
                "consoleFull",
                "--min-lines",
                "6",
                "--ignore",
                "**/node_modules/**,**/.git/**",
                ".",
            ],
        )
        report = "\n".join((out.stdout or out.stderr).splitlines()[:REPORT_LINES])
        return specs.DUP_PROMPT + (report or "(jscpd found no duplicates)")

    return launch(args, needs_spec=False, prompt=prompt)
