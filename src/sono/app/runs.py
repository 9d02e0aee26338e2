"""Run the loop: in a new sandbox (``so run``/``step``/``clean``/``dup``) or more
iterations in an existing one (``so continue``, the menu, the TUI)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from sono import specs
from sono.app.agent import Agent, resolve_agent
from sono.app.context import Context
from sono.app.policy import ChosenBackend, backend_for, policy_for
from sono.app.sandboxes import require_idle
from sono.config import Config
from sono.errors import SoError
from sono.harnesses.base import Access
from sono.loop import (
    EXIT_INTERRUPTED,
    Loop,
    LoopOptions,
    LoopResult,
    Reporter,
    StepHook,
    interrupted_exit,
)
from sono.net.session import NetSession
from sono.sandbox import Sandbox, create_sandbox
from sono.workspace import HostRepo, inspect_host, require_clean

Prompt = Callable[[Sandbox], str]


@dataclass(frozen=True)
class LoopRequest:
    """What a run asks of the loop beyond the config: a preset prompt (clean/dup; None:
    ``specs/prompt.md``), the step dialogue, variables on top of the agent's."""

    prompt: Prompt | None = None
    step_hook: StepHook | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class StartOptions:
    """``so run`` and its kin: a new sandbox from the project at ``cwd``."""

    cwd: Path
    allow_dirty: bool = False
    needs_spec: bool = True  # specs/prompt.md must exist (not for clean/dup)
    request: LoopRequest = field(default_factory=LoopRequest)
    announce: bool = True  # a notice naming the sandbox, backend, agent and network


@dataclass(frozen=True)
class Outcome:
    """A run's sandbox and result; ``result`` is None when Ctrl-C or a signal stopped it
    (``exit_code`` then says which: 130, or 128 + the signal)."""

    sandbox: Sandbox
    result: LoopResult | None
    config: Config
    stopped_exit: int = EXIT_INTERRUPTED

    @property
    def exit_code(self) -> int:
        return self.result.exit_code if self.result is not None else self.stopped_exit


def start(ctx: Context, opts: StartOptions, reporter: Reporter) -> Outcome:
    """Create a sandbox from the project and run the loop in it. Everything that can
    refuse (spec, clean host, backend, limits, files, agent CLI) is checked before
    anything is created."""
    host = inspect_host(opts.cwd)
    cfg = ctx.config(host.root)
    if opts.needs_spec and not (host.root / specs.PROMPT).is_file():
        raise SoError(
            f"{host.root / specs.PROMPT} not found; run `so plan` to create the "
            "specs, edit them, commit, then run again"
        )
    if not opts.allow_dirty:
        require_clean(
            host,
            action="start a sandbox",
            hint=", or pass --allow-dirty to snapshot them into the sandbox",
        )
    made = new_sandbox(ctx, cfg, host, allow_dirty=opts.allow_dirty)
    sandbox, chosen, agent = made.sandbox, made.chosen, made.agent
    if opts.needs_spec:
        reset_status(sandbox)
    if opts.announce:
        ctx.notice(
            f"sandbox {sandbox.record.id} · {chosen.backend.name} ({chosen.why}) · "
            f"agent {agent.description}\n"
            f"    {sandbox.describe_workspace()} (branch {sandbox.record.branch}); "
            f"network: {network_line(cfg)}"
        )
    return _outcome(ctx, sandbox, agent, cfg, reporter, request=opts.request)


@dataclass(frozen=True)
class Made:
    sandbox: Sandbox
    chosen: ChosenBackend
    agent: Agent


def new_sandbox(
    ctx: Context, cfg: Config, host: HostRepo, *, allow_dirty: bool, task: str = "code"
) -> Made:
    """A sandbox from ``host`` under ``cfg``: the backend, the run policy and the agent
    are settled first — every refusal (backend health, limits, files, the agent's CLI)
    comes before anything is created."""
    chosen = backend_for(ctx, cfg, host.root)
    policy = policy_for(ctx, cfg, chosen.backend)
    agent = resolve_agent(ctx, cfg, task=task)
    sandbox = create_sandbox(
        store=ctx.store,
        host=host,
        harness=agent.harness.name,
        backend_name=chosen.backend.name,
        backend=chosen.backend,
        exclude=cfg.exclude,
        allow_dirty=allow_dirty,
        model=cfg.model,
        effort=cfg.effort,
        mounts=agent.mounts,
        agent_cmd=cfg.agent_cmd,
        workspace=cfg.workspace,
        notice=ctx.notice,
        policy=policy,
    )
    return Made(sandbox, chosen, agent)


def continue_run(
    ctx: Context,
    sandbox: Sandbox,
    iterations: int | None,
    reporter: Reporter,
    request: LoopRequest | None = None,
) -> Outcome:
    """More iterations in ``sandbox`` (opened to run: :func:`sono.app.sandboxes.
    open_sandbox`), with its remembered agent unless flags say otherwise;
    ``iterations`` None: the config's."""
    if iterations is not None:
        ctx = ctx.with_flags(iterations=iterations)
    require_idle(sandbox)
    cfg = ctx.config(Path(sandbox.record.project), sandbox=sandbox.record)
    agent = resolve_agent(ctx, cfg)
    # Flags may name another agent: the record says which one runs from now on.
    chosen = {
        "harness": agent.harness.name,
        "model": cfg.model,
        "effort": cfg.effort,
        "agent_cmd": cfg.agent_cmd,
    }
    rec = sandbox.record
    if any(getattr(rec, key) != value for key, value in chosen.items()):
        sandbox.save(**chosen)
    return _outcome(ctx, sandbox, agent, cfg, reporter, request=request)


def _outcome(
    ctx: Context,
    sandbox: Sandbox,
    agent: Agent,
    cfg: Config,
    reporter: Reporter,
    *,
    request: LoopRequest | None,
) -> Outcome:
    try:
        return Outcome(sandbox, run_loop(ctx, sandbox, agent, cfg, reporter, request=request), cfg)
    except KeyboardInterrupt as exc:
        return Outcome(sandbox, None, cfg, interrupted_exit(exc))


def run_loop(
    ctx: Context,
    sandbox: Sandbox,
    agent: Agent,
    cfg: Config,
    reporter: Reporter,
    *,
    request: LoopRequest | None = None,
) -> LoopResult:
    """Run the loop under the sandbox's policy. Ctrl-C or a signal raises
    ``KeyboardInterrupt`` once the agent is stopped and the sandbox's record says so."""
    request = request or LoopRequest()
    sandbox.with_mounts(agent.mounts)
    opts = LoopOptions(
        iterations=cfg.iterations,
        timeout_s=cfg.iteration_timeout,
        no_progress_limit=cfg.no_progress_limit,
        commit_retries=cfg.commit_retries,
        prompt=request.prompt,
        step=request.step_hook is not None,
        max_cost=cfg.max_cost,
        max_tokens=cfg.max_tokens,
        total_time_s=cfg.total_time,
        stop_on_kill=cfg.on_kill == "stop",
    )
    with network(sandbox, agent, ctx.env, ctx.home) as netted:
        for line in netted.access.notes:
            reporter.note(line)
        # The network's own variables (secret placeholders, CA trust) after the harness's
        # choice: a harness keeps only the host variables it knows.
        env = {
            **netted.agent.harness.env(netted.host_env, netted.agent.options),
            **netted.env,
            **request.env,
        }
        loop = Loop(
            sandbox,
            harness=netted.agent.harness,
            agent=netted.agent.options,
            opts=opts,
            reporter=reporter,
            env=env,
            step_hook=request.step_hook,
            net=netted.session,
            host_home=ctx.home,
            access=netted.access,
            secrets=netted.secrets,
        )
        return loop.run()


@dataclass(frozen=True)
class Netted:
    """A run's network: the session (None for sandboxes made before the network policy),
    the agent pointed at the gateway, the host env as the harness may see it (credentials
    replaced by placeholders), the variables every agent process gets on top of its
    harness's (secrets' placeholders, CA trust) and what the harness read of its config."""

    session: NetSession | None
    agent: Agent
    host_env: Mapping[str, str]
    env: Mapping[str, str]
    access: Access = field(default_factory=Access)
    secrets: tuple[str, ...] = field(default=(), repr=False)  # never inside: scrubbed


@contextlib.contextmanager
def network(
    sandbox: Sandbox, agent: Agent, host_env: Mapping[str, str], home: Path
) -> Iterator[Netted]:
    """Serve the sandbox's proxy and model gateway while the block runs. The gateway's
    upstreams are what the harness's own configuration names (read on the host from
    ``host_env`` and ``home``); a setup ``so`` cannot route is refused before anything
    starts. Sandboxes made before the network policy keep the host's network."""
    if sandbox.spec.net is None:
        yield Netted(None, agent, host_env, {})
        return
    from sono.net.session import session_for

    access = agent.harness.access(host_env, home)
    if access.refusal:
        raise SoError(access.refusal)
    policy = sandbox.policy
    session, gatewayed = session_for(
        sandbox.net_dir, policy.network, policy.secrets, host_env, access.upstreams
    )
    options = dataclasses.replace(agent.options, endpoints=gatewayed.endpoints)
    with session:
        yield Netted(
            session,
            dataclasses.replace(agent, options=options),
            gatewayed.env,
            gatewayed.sandbox_env,
            access,
            gatewayed.secrets,
        )


def network_line(cfg: Config) -> str:
    if cfg.network_mode == "none":
        return "none (the model gateway only)"
    allowed = ", ".join(cfg.network_allow) or "nothing else"
    if cfg.network_mode == "open":
        return "open through so's proxy (private ranges and deny list blocked)"
    return f"model gateway + {allowed}"


def reset_status(sandbox: Sandbox) -> None:
    """A status left at done/blocked by an earlier run would stop the loop at once."""
    text = sandbox.read_file(specs.STATUS)
    if text is not None and specs.parse_status(text) != specs.PENDING:
        sandbox.write_file(specs.STATUS, "Status: pending\n")
        sandbox.git.commit_all("so: reset specs/status.md to pending for this run")
