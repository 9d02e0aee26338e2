"""Open, shell into and remove sandboxes under the policy of their project's config."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sono.app.context import Context
from sono.app.policy import backend_settings, policy_for
from sono.backends import get_backend
from sono.config import Config
from sono.errors import SoError
from sono.net.session import NetSession
from sono.sandbox import Sandbox, remove_sandbox


@dataclass(frozen=True)
class Opened:
    sandbox: Sandbox
    config: Config


def open_sandbox(ctx: Context, ref: str, *, run: bool = False) -> Opened:
    """The sandbox ``ref`` names, on its backend with the settings and run policy of its
    project's config (and its remembered agent). ``run``: a person or agent will run
    processes in it — limits it cannot enforce and missing ``files`` paths are errors."""
    store = ctx.store
    record = store.resolve(ref)
    cfg = ctx.config(Path(record.project), sandbox=record)
    backend = get_backend(record.backend, backend_settings(ctx, cfg))
    policy = policy_for(ctx, cfg, backend, run=run)
    return Opened(Sandbox.of(record, store, backend, policy), cfg)


def require_idle(sandbox: Sandbox) -> None:
    rec = sandbox.record
    if rec.live_status() == "running":
        raise SoError(f"sandbox {rec.id} is already running (pid {rec.runner_pid})")


@contextlib.contextmanager
def serving(sandbox: Sandbox, env: Mapping[str, str]) -> Iterator[NetSession | None]:
    """The sandbox's proxy and gateway under its policy while the block runs (a shell).
    Sandboxes made before the network policy keep the host's network."""
    if sandbox.spec.net is None:
        yield None
        return
    from sono.net.session import session_for

    policy = sandbox.policy
    session, _ = session_for(sandbox.net_dir, policy.network, policy.secrets, env)
    with session:
        yield session


def shell(ctx: Context, sandbox: Sandbox, argv: Sequence[str] = ()) -> int:
    """A terminal shell (or ``argv``) inside, under the sandbox's policy and network;
    what the human committed there becomes the commit under review."""
    with serving(sandbox, ctx.env):
        return sandbox.shell(argv)


def open_shell(ctx: Context, ref: str, argv: Sequence[str] = ()) -> int:
    return shell(ctx, open_sandbox(ctx, ref, run=True).sandbox, argv)


def remove(sandbox: Sandbox) -> None:
    require_idle(sandbox)
    remove_sandbox(sandbox)
