"""so plan: write specs/ templates (never overwriting), then plan with the agent in a sandbox.

The planning (and ``so learn``'s teaching) session runs the harness's interactive TUI
inside a temporary sandbox made for it, with the loop's backend, network policy, model
gateway (the real key stays host-side) and limits: never on the host, where the project's
own agent settings (hooks, plugins, MCP servers) would run with the user's environment.
The sandbox sees the project as it is now (uncommitted specs included); when the session
ends, only regular files the agent wrote under ``specs/`` come back (:mod:`sono.harvest`,
plan only) and the sandbox is removed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from sono import harvest, specs
from sono.app.agent import Agent
from sono.app.context import Context
from sono.app.runs import network, new_sandbox
from sono.commands import _common as c
from sono.errors import ConfigError, SoError
from sono.net import scrub
from sono.sandbox import Sandbox, remove_sandbox
from sono.workspace import host_git, inspect_host


def write_templates(root: Path) -> tuple[list[str], list[str]]:
    written, kept = [], []
    folder = root / "specs"
    if folder.is_symlink():
        raise SoError(f"{folder} is a symbolic link; make it a plain folder, then run so plan")
    folder.mkdir(exist_ok=True)
    for name in specs.TEMPLATES:
        path = folder / name
        if path.exists() or path.is_symlink():
            kept.append(f"specs/{name}")
        else:
            harvest.write_back(root, {f"specs/{name}": specs.template(name).encode()})
            written.append(f"specs/{name}")
    return written, kept


def note(text: str) -> None:
    print(f"so: {text}", file=sys.stderr, flush=True)


def interactive_session(
    args: argparse.Namespace, root: Path, prompt: str, task: str, *, bring_back: bool = False
) -> int:
    """Hand the terminal to the harness inside a temporary sandbox, with ``prompt``;
    ``bring_back``: the agent's ``specs/`` files come back to ``root`` afterwards."""
    host = inspect_host(root)
    ctx = c.context(args)
    cfg = ctx.config(host.root)
    # The templates just written and the user's uncommitted specs go in: allow_dirty.
    made = new_sandbox(ctx, cfg, host, allow_dirty=True, task=task)
    sandbox, chosen, agent = made.sandbox, made.chosen, made.agent
    try:
        kept = "only specs/ comes back" if bring_back else "nothing comes back"
        note(
            f"{task} session in sandbox {sandbox.record.id} ({chosen.backend.name}, "
            f"{chosen.why}); the project is a throwaway copy there: {kept}"
        )
        code = attach(ctx, sandbox, agent, prompt)
        if bring_back and not take_specs(sandbox, host.root):
            return code or 1
        return code
    finally:
        remove_sandbox(sandbox)


def attach(ctx: Context, sandbox: Sandbox, agent: Agent, prompt: str) -> int:
    """The harness's interactive command inside, on the user's terminal, pointed at the
    gateway; its environment is built from scratch (placeholders, never host keys)."""
    prompt_file = sandbox.home_seed / ".so" / "prompt.md"
    prompt_file.parent.mkdir(exist_ok=True)
    prompt_file.write_text(prompt)
    with network(sandbox, agent, ctx.env, ctx.home) as netted:
        for line in netted.access.notes:
            note(line)
        harness, options = netted.agent.harness, netted.agent.options
        harness.provision(home_seed=sandbox.home_seed, host_home=ctx.home, opts=options)
        scrub.scrub_tree(sandbox.home_seed, netted.secrets)  # nothing credential-shaped in
        env = {
            **harness.env(netted.host_env, options),
            **netted.env,  # secrets' placeholders and CA trust, for every harness
            # Harnesses that cannot take the prompt as an argument (custom) find it here.
            "SO_PROMPT": prompt,
            "SO_PROMPT_FILE": f"{sandbox.spec.home}/.so/prompt.md",
        }
        spec = dataclasses.replace(sandbox.spec, env={**sandbox.spec.env, **env})
        argv = harness.interactive_argv(options, prompt)
        return sandbox.backend.shell(spec=spec, argv=argv)


def take_specs(sandbox: Sandbox, project: Path) -> bool:
    """Bring the agent's ``specs/`` files to the host project; False if that failed."""
    found = harvest.collect(sandbox.work)
    for why in found.refused:
        note(f"not taken from the sandbox: {why}")
    try:
        written = harvest.write_back(project, found.files)
    except SoError as exc:
        note(f"the session's specs were not written: {exc}")
        return False
    if written:
        note(f"from the session: {', '.join(written)}")
    return True


def run(args: argparse.Namespace) -> int:
    from sono.commands.list import project_dir

    top = project_dir(str(Path.cwd()))
    if top is None:
        inspect_host(Path.cwd())  # its error: not inside a git repository
    root = Path(str(top))
    written, kept = write_templates(root)
    if written:
        print(f"so: wrote {', '.join(written)}")
    if kept:
        print(f"so: kept existing {', '.join(kept)}")
    if not host_git(root, "rev-parse", "--verify", "-q", "HEAD", check=False).stdout.strip():
        print("so: next: edit specs/*.md and commit them (the repository's first commit), "
              "then `so plan` to plan with the agent, or `so run`")  # fmt: skip
        return 0
    if args.no_agent or not c.interactive_tty():
        print("so: next: edit specs/*.md, commit them, then `so run`")
        return 0
    try:
        return interactive_session(args, root, specs.PLAN_PROMPT, "plan", bring_back=True)
    except ConfigError:
        raise  # a broken or untrusted config is an error, not a reason to skip the agent
    except SoError as exc:
        print(f"so: not starting the planning agent: {exc}")
        print("so: next: edit specs/*.md, commit them, then `so run`")
        return 0
