"""Create a sandbox from the current project and run a loop in it (run/step/clean/dup)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from sono import specs
from sono.commands import _common as c
from sono.config import Config
from sono.errors import SoError
from sono.sandbox import Sandbox, create_sandbox
from sono.workspace import inspect_host, require_clean


def network_line(cfg: Config) -> str:
    if cfg.network_mode == "none":
        return "none (the model gateway only)"
    allowed = ", ".join(cfg.network_allow) or "nothing else"
    if cfg.network_mode == "open":
        return "open through so's proxy (private ranges and deny list blocked)"
    return f"model gateway + {allowed}"


def launch(
    args: argparse.Namespace,
    *,
    needs_spec: bool = True,
    prompt: Callable[[Sandbox], str] | None = None,
    step: bool = False,
) -> int:
    host = inspect_host(Path.cwd())
    cfg = c.config(args, host.root)
    if needs_spec and not (host.root / specs.PROMPT).is_file():
        raise SoError(
            f"{host.root / specs.PROMPT} not found; run `so plan` to create the "
            "specs, edit them, commit, then run again"
        )
    if not getattr(args, "allow_dirty", False):
        require_clean(
            host,
            action="start a sandbox",
            hint=", or pass --allow-dirty to snapshot them into the sandbox",
        )
    chosen = c.backend_for(cfg, host.root)
    backend = chosen.backend
    limits = c.enforceable_limits(cfg, backend)  # fail closed before creating anything
    c.extra_files(cfg)  # a missing files.ro/rw path, too
    agent = c.resolve_agent(cfg)
    hook = None
    if step:
        from sono.commands.step import ask_between

        hook = ask_between(args)  # before creating anything: it may refuse (no terminal)
    sandbox = create_sandbox(
        store=c.store(),
        host=host,
        harness=agent.harness.name,
        backend_name=backend.name,
        backend=backend,
        exclude=cfg.exclude,
        allow_dirty=bool(getattr(args, "allow_dirty", False)),
        model=cfg.model,
        effort=cfg.effort,
        mounts=agent.mounts,
        agent_cmd=cfg.agent_cmd,
        workspace=cfg.workspace,
        notice=lambda text: print(f"so: {text}", file=sys.stderr),
        limits=limits,
    )
    if needs_spec:
        c.reset_status(sandbox)
    if not getattr(args, "json", False):
        print(
            f"so: sandbox {sandbox.record.id} · {backend.name} ({chosen.why}) · "
            f"agent {agent.description}\n"
            f"    {sandbox.describe_workspace()} (branch {sandbox.record.branch}); "
            f"network: {network_line(cfg)}",
            file=sys.stderr,
        )
    result = c.run_loop(args, sandbox, agent, cfg, prompt=prompt, step_hook=hook)
    if result is None:
        return 130
    c.summarize(args, sandbox, result)
    if not c.yes(args) and c.interactive_tty() and not getattr(args, "json", False):
        from sono.commands.menu import sandbox_menu

        sandbox_menu(args, sandbox.record.id)
    return result.exit_code
