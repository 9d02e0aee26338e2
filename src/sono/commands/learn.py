"""so learn: an interactive teaching session with the agent (explains, does not solve),
inside a temporary sandbox that sees the project and gives nothing back."""

from __future__ import annotations

import argparse
from pathlib import Path

from sono import specs
from sono.commands import _common as c
from sono.commands.plan import interactive_session
from sono.errors import SoError
from sono.workspace import inspect_host


def run(args: argparse.Namespace) -> int:
    if not c.interactive_tty():
        raise SoError("so learn is an interactive session and needs a terminal")
    root = inspect_host(Path.cwd()).root
    return interactive_session(args, root, specs.LEARN_PROMPT, "learn")
