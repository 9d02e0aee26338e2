"""Which agent runs: the harness, its options (model, effort, command) and where its CLI is."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from sono import agents
from sono.app.context import Context
from sono.backends.base import Mount
from sono.config import Config
from sono.errors import SoError
from sono.harnesses import get_harness
from sono.harnesses.base import AgentOptions, Harness

# Per-task default effort (the seed's): used when no file, env var or flag sets one and
# the harness takes that value.
TASK_EFFORT = {"code": "medium", "plan": "high", "learn": "medium"}
ENDPOINT_ENV = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}


@dataclass(frozen=True)
class Agent:
    harness: Harness
    options: AgentOptions
    mounts: tuple[Mount, ...]
    description: str


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
    ctx: Context, cfg: Config, *, extra_mounts: tuple[Mount, ...] = (), task: str = "code"
) -> Agent:
    """Pick the harness, validate model/effort, and find its CLI."""
    harness = get_harness(cfg.harness)
    if cfg.agent_cmd and "agent_cmd" in ctx.flags and harness.name != "custom":
        raise SoError(
            f"--agent-cmd is the command of the custom harness, not of {harness.name}: "
            "add -H custom (or drop --agent-cmd)"
        )
    opts = AgentOptions(
        model=cfg.model,
        effort=effort_for(cfg, harness, task),
        agent_cmd=cfg.agent_cmd,
        endpoints=endpoints(ctx.env),
        task=task,
    )
    name = harness.executable_name(opts)
    if name is None:
        return Agent(harness, opts, extra_mounts, harness.name)
    found = agents.locate(name, harness.npm, ctx.agents_dir)
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
