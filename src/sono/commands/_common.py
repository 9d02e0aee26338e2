"""Shared plumbing for commands: config, store, agent lookup, prompts, the loop launcher."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sono import agents, specs
from sono.backends import BackendSettings, choose_auto, get_backend
from sono.backends.base import Backend, Mount
from sono.config import Config, load_config
from sono.errors import SoError
from sono.harnesses import HARNESSES, get_harness
from sono.harnesses.base import AgentOptions, Harness
from sono.limits import Limits
from sono.loop import Loop, LoopOptions, LoopResult, Reporter, StepHook
from sono.net.session import NetSession
from sono.sandbox import Sandbox
from sono.state import Store, agents_dir, so_home
from sono.textsafe import one_line
from sono.ui.reporter import JsonReporter, PlainReporter

# Per-task default effort (the seed's): used when no file, env var or flag sets one and
# the harness takes that value.
TASK_EFFORT = {"code": "medium", "plan": "high", "learn": "medium"}

FLAG_KEYS = (
    "harness",
    "iterations",
    "sandbox",
    "model",
    "effort",
    "agent_cmd",
    "iteration_timeout",
    "max_cost",
    "max_tokens",
)
# argparse dest → config key, for flags of dotted (table) keys.
FLAG_DESTS = {
    "network": "network.mode",
    "allow": "network.allow",
    "deny": "network.deny",
    "memory": "limits.memory",
    "cpus": "limits.cpus",
    "pids": "limits.pids",
}


def environ() -> Mapping[str, str]:
    return os.environ


def store() -> Store:
    return Store(so_home(environ()))


def flags(args: argparse.Namespace) -> dict[str, object]:
    found = {k: getattr(args, k) for k in FLAG_KEYS if getattr(args, k, None) is not None}
    for dest, key in FLAG_DESTS.items():
        value = getattr(args, dest, None)
        if value is not None:
            found[key] = ",".join(value) if isinstance(value, list) else value
    return found


def config(args: argparse.Namespace, project: Path | None) -> Config:
    return load_config(
        project=project,
        env=environ(),
        home=Path.home(),
        flags=flags(args),
        harness_choices=list(HARNESSES),
    )


def yes(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "yes", False))


def interactive_tty() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def confirm(args: argparse.Namespace, question: str) -> bool:
    if yes(args):
        return True
    if not interactive_tty():
        raise SoError(f"{question} — no terminal to ask on; pass --yes to confirm")
    answer = input(f"{question} [y/N] ").strip().lower()
    return answer in ("y", "yes")


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


@dataclass(frozen=True)
class Agent:
    harness: Harness
    options: AgentOptions
    mounts: tuple[Mount, ...]
    description: str


ENDPOINT_ENV = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}


def endpoints(env: Mapping[str, str]) -> dict[str, str]:
    """Model API base URLs the user points agents at, by wire family."""
    return {family: env[var] for family, var in ENDPOINT_ENV.items() if env.get(var)}


def effort_for(cfg: Config, harness: Harness, task: str) -> str | None:
    """The configured effort, validated for the harness, else the task's default."""
    if cfg.is_default("effort"):
        default = TASK_EFFORT.get(task)
        return default if default in harness.efforts else None
    effort = cfg.effort
    if effort is None or harness.efforts == ("*",) or effort in harness.efforts:
        return effort
    if not harness.efforts:
        raise SoError(f"{harness.name} takes no effort setting; drop -e/--effort ({effort!r})")
    raise SoError(
        f"effort {effort!r} is not valid for {harness.name}; "
        f"choose one of {', '.join(harness.efforts)}"
    )


def resolve_agent(
    cfg: Config,
    *,
    harness_name: str | None = None,
    extra_mounts: tuple[Mount, ...] = (),
    task: str = "code",
) -> Agent:
    """Pick the harness, validate model/effort, and find its CLI."""
    harness = get_harness(harness_name or cfg.harness)
    opts = AgentOptions(
        model=cfg.model,
        effort=effort_for(cfg, harness, task),
        agent_cmd=cfg.agent_cmd,
        endpoints=endpoints(environ()),
        task=task,
    )
    name = harness.executable_name(opts)
    if name is None:
        return Agent(harness, opts, extra_mounts, harness.name)
    found = agents.locate(name, harness.npm, agents_dir(environ()))
    if found is None:
        hint = (
            f"install it with `so agents install {harness.name}` (needs npm)"
            if harness.npm
            else "check --agent-cmd and PATH"
        )
        raise SoError(f"{name} not found: {hint}")
    opts = dataclasses.replace(opts, executable=str(found.path))
    return Agent(
        harness, opts, found.mounts + extra_mounts, f"{harness.name} ({found.path}, {found.source})"
    )


def backend_settings(cfg: Config | None = None) -> BackendSettings:
    def progress(line: str) -> None:
        print(f"so: {line}", file=sys.stderr, flush=True)

    if cfg is None:
        return BackendSettings(progress=progress)
    return BackendSettings(bwrap=cfg.bwrap, docker_base=cfg.docker_base, progress=progress)


@dataclass(frozen=True)
class ChosenBackend:
    backend: Backend
    why: str


def backend_for(cfg: Config, project: Path | None = None) -> ChosenBackend:
    """The backend to create sandboxes on, checked to work here, and why it was chosen
    (``auto``: with ``project``, the one that gives it the better workspace)."""
    settings = backend_settings(cfg)
    name, why = cfg.sandbox, f"-s/SANDBOX/config: {cfg.sandbox}"
    if name == "auto":
        judged = project if cfg.workspace != "copy" else None
        name, why = choose_auto(settings, judged, store().root)
    backend = get_backend(name, settings)
    health = backend.health()
    if not health.ok:
        raise SoError(f"{health.detail}; fix: {health.fix}")
    return ChosenBackend(backend, why)


def reporter(args: argparse.Namespace) -> Reporter:
    if getattr(args, "json", False):
        return JsonReporter()
    quiet = bool(getattr(args, "quiet", False))
    if not quiet and sys.stderr.isatty() and os.environ.get("TERM") != "dumb":
        from sono.ui.reporter import LiveReporter

        return LiveReporter()
    return PlainReporter(quiet=quiet)


default_reporter = reporter  # run_loop's `reporter` parameter shadows the function


def run_loop(
    args: argparse.Namespace,
    sandbox: Sandbox,
    agent: Agent,
    cfg: Config,
    *,
    prompt: Callable[[Sandbox], str] | None = None,
    step_hook: StepHook | None = None,
    env_overrides: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
) -> LoopResult | None:
    """Run the loop; on Ctrl-C print how to continue and return None. ``reporter``
    replaces the one the flags choose (the review TUI shows progress itself)."""
    sandbox.with_mounts(agent.mounts)
    if sandbox.limits is None:
        sandbox.limits = enforceable_limits(cfg, sandbox.backend)
    sandbox.files = extra_files(cfg)
    opts = LoopOptions(
        iterations=cfg.iterations,
        timeout_s=cfg.iteration_timeout,
        no_progress_limit=cfg.no_progress_limit,
        commit_retries=cfg.commit_retries,
        prompt=prompt,
        step=step_hook is not None,
        max_cost=cfg.max_cost,
        max_tokens=cfg.max_tokens,
        total_time_s=cfg.total_time,
        stop_on_kill=cfg.on_kill == "stop",
    )
    with network(sandbox, agent, cfg) as (net, netted, host_env, net_env):
        # The network's own variables (secret placeholders, CA trust) after the harness's
        # choice: a harness keeps only the host variables it knows.
        env = {
            **netted.harness.env(host_env, netted.options),
            **net_env,
            **(env_overrides or {}),
        }
        loop = Loop(
            sandbox,
            harness=netted.harness,
            agent=netted.options,
            opts=opts,
            reporter=reporter or default_reporter(args),
            env=env,
            step_hook=step_hook,
            net=net,
        )
        try:
            return loop.run()
        except KeyboardInterrupt:
            pass
    sid = sandbox.record.id
    print(
        f"so: interrupted; sandbox {sid} kept. Continue with: so continue {sid} -i "
        f"{cfg.iterations}  (or review: so diff {sid})",
        file=sys.stderr,
    )
    return None


def extra_files(cfg: Config) -> tuple[Mount, ...]:
    """``files.ro`` / ``files.rw`` as mounts at the same path inside; a missing path is
    an error (a typo must not silently run without the data)."""
    mounts = []
    for key, paths, writable in (
        ("files.ro", cfg.files_ro, False),
        ("files.rw", cfg.files_rw, True),
    ):
        for raw in paths:
            path = Path(raw)
            if not path.exists():
                raise SoError(f"{key}: {path} does not exist; create it or remove it from {key}")
            mounts.append(Mount(path.resolve(), str(path), writable=writable))
    return tuple(mounts)


def limits_of(cfg: Config) -> Limits | None:
    limits = Limits(memory=cfg.memory, cpus=cfg.cpus, pids=cfg.pids, disk=cfg.disk)
    return limits if limits.any() else None


def enforceable_limits(cfg: Config, backend: Backend) -> Limits | None:
    """The configured limits, after checking that this backend can enforce each of them
    here: fail closed (an error) unless ``enforce = "best-effort"`` downgrades it."""
    limits = limits_of(cfg)
    if limits is None:
        return None
    weak = [e for e in backend.plan_limits(limits).values() if e.mechanism == "none"]
    if weak and cfg.enforce == "strict":
        what = "; ".join(f"limits.{e.limit} ({e.detail})" for e in weak)
        raise SoError(
            f"{what} cannot be enforced on {backend.name} here; use another sandbox "
            '(so doctor shows what each enforces), drop the limit, or set enforce = "best-effort"'
        )
    for e in weak:
        print(
            f"so: warning: limits.{e.limit} is not enforced on {backend.name} here "
            f"({e.detail}); running anyway (enforce = best-effort)",
            file=sys.stderr,
        )
    return limits


@contextlib.contextmanager
def serving(sandbox: Sandbox, cfg: Config | None = None) -> Iterator[NetSession | None]:
    """The sandbox's proxy and gateway for an interactive shell (the project's policy)."""
    if sandbox.spec.net is None:
        yield None
        return
    from sono.net.session import session_for

    if cfg is None:
        cfg = load_config(
            project=Path(sandbox.record.project),
            env=environ(),
            home=Path.home(),
            flags={},
            harness_choices=list(HARNESSES),
        )
    session, _ = session_for(sandbox.net_dir, cfg, environ())
    with session:
        yield session


@contextlib.contextmanager
def network(
    sandbox: Sandbox, agent: Agent, cfg: Config, host_env: Mapping[str, str] | None = None
) -> Iterator[tuple[NetSession | None, Agent, Mapping[str, str], Mapping[str, str]]]:
    """Serve the sandbox's proxy and model gateway while the block runs; yield the agent
    pointed at the gateway, the host env it may see (keys replaced by placeholders) and
    the variables every agent process must get on top of its harness's (secrets'
    placeholders, CA trust). Sandboxes made before the network policy keep the host's
    network."""
    env = environ() if host_env is None else host_env
    if sandbox.spec.net is None:
        yield None, agent, env, {}
        return
    from sono.net.session import session_for

    session, gatewayed = session_for(sandbox.net_dir, cfg, env)
    options = dataclasses.replace(agent.options, endpoints=gatewayed.endpoints)
    with session:
        yield (
            session,
            dataclasses.replace(agent, options=options),
            gatewayed.env,
            (gatewayed.sandbox_env),
        )


def summarize(args: argparse.Namespace, sandbox: Sandbox, result: LoopResult) -> None:
    sid = sandbox.record.id
    if getattr(args, "json", False):
        print(
            json.dumps(
                {
                    "kind": "summary",
                    "id": sid,
                    "outcome": result.outcome,
                    "exit_code": result.exit_code,
                    "message": result.message,
                    "planned": result.planned,
                    "branch": sandbox.record.branch,
                    "workspace": sandbox.record.workspace,
                    "iterations": [r.to_json() for r in result.iterations],
                }
            )
        )
        return
    print(
        one_line(
            f"so: {result.outcome}: {result.message} (sandbox {sid}, "
            f"{len(result.iterations)} iteration(s))",
            400,
        ),
        file=sys.stderr,
    )
    print(
        f"  review:   so diff {sid}   so shell {sid}   so reset {sid} iter-N\n"
        f"  continue: so continue {sid} -i N\n"
        f"  merge:    so merge {sid}   (or remove: so rm {sid})",
        file=sys.stderr,
    )


def reset_status(sandbox: Sandbox) -> None:
    """A status left at done/blocked by an earlier run would stop the loop at once."""
    text = sandbox.read_file(specs.STATUS)
    if text is not None and specs.parse_status(text) != specs.PENDING:
        sandbox.write_file(specs.STATUS, "Status: pending\n")
        sandbox.git.commit_all("so: reset specs/status.md to pending for this run")
