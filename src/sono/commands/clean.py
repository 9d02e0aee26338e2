"""so clean: a loop that fixes one code smell per iteration."""

from __future__ import annotations

import argparse

from sono import specs
from sono.app.runs import LoopRequest
from sono.commands.launch import launch


def run(args: argparse.Namespace) -> int:
    return launch(args, LoopRequest(prompt=lambda _sb: specs.CLEAN_PROMPT), needs_spec=False)
