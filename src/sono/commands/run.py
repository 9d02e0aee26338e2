"""so run: the Ralph loop over specs/ in a new sandbox."""

from __future__ import annotations

import argparse

from sono.commands.launch import launch


def run(args: argparse.Namespace) -> int:
    return launch(args)
