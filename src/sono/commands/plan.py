"""so plan: write specs/ templates (never overwriting), then plan with the agent on the host."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sono import proc, specs
from sono.commands import _common as c
from sono.errors import ConfigError, SoError
from sono.workspace import inspect_host


def write_templates(root: Path) -> tuple[list[str], list[str]]:
    written, kept = [], []
    folder = root / "specs"
    folder.mkdir(exist_ok=True)
    for name in specs.TEMPLATES:
        path = folder / name
        if path.exists():
            kept.append(f"specs/{name}")
        else:
            path.write_text(specs.template(name))
            written.append(f"specs/{name}")
    return written, kept


def interactive_session(args: argparse.Namespace, root: Path, prompt: str, task: str) -> int:
    """Hand the terminal to the harness on the host, with ``prompt``."""
    cfg = c.config(args, root)
    agent = c.resolve_agent(cfg, task=task)
    argv = agent.harness.interactive_argv(agent.options, prompt)
    # Harnesses that cannot take the prompt as an argument (custom) find it in $SO_PROMPT.
    env = {**os.environ, **agent.harness.env(os.environ, agent.options), "SO_PROMPT": prompt}
    return proc.interactive(argv, cwd=root, env=env)


def run(args: argparse.Namespace) -> int:
    root = inspect_host(Path.cwd()).root
    written, kept = write_templates(root)
    if written:
        print(f"so: wrote {', '.join(written)}")
    if kept:
        print(f"so: kept existing {', '.join(kept)}")
    if args.no_agent or not c.interactive_tty():
        print("so: next: edit specs/*.md, commit them, then `so run`")
        return 0
    try:
        return interactive_session(args, root, specs.PLAN_PROMPT, "plan")
    except ConfigError:
        raise  # a broken or untrusted config is an error, not a reason to skip the agent
    except SoError as exc:
        print(f"so: not starting the planning agent: {exc}")
        print("so: next: edit specs/*.md, commit them, then `so run`")
        return 0
