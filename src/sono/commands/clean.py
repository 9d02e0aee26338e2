"""so clean: a loop that fixes one code smell per iteration."""

from __future__ import annotations

import argparse

from sono import specs
from sono.commands.launch import launch


def run(args: argparse.Namespace) -> int:
    return launch(args, needs_spec=False, prompt=lambda _sb: specs.CLEAN_PROMPT)
