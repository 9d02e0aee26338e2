"""What every operation needs from outside, in one frozen object."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from sono.config import Config, load_config
from sono.state import SandboxRecord, Store, agents_dir, so_home

# A sandbox keeps the agent it was started with unless a flag says otherwise.
REMEMBERED = ("harness", "model", "effort", "agent_cmd")


def to_stderr(text: str) -> None:
    print(f"so: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Context:
    """The environment and home `so` runs with, the config keys set on the command line
    (``flags``: key → value, the highest config layer) and where one-line notices for the
    human go (warnings, progress of an image build)."""

    env: Mapping[str, str]
    home: Path
    flags: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    notice: Callable[[str], None] = to_stderr

    @property
    def store(self) -> Store:
        return Store(so_home(self.env))

    @property
    def agents_dir(self) -> Path:
        return agents_dir(self.env)

    def config(self, project: Path | None, *, sandbox: SandboxRecord | None = None) -> Config:
        """The layered config for ``project``; for an existing ``sandbox`` its remembered
        agent (harness, model, effort, command) where no flag names another."""
        from sono.harnesses import HARNESSES

        flags = dict(self.flags)
        if sandbox is not None:
            for key in REMEMBERED:
                value = getattr(sandbox, key)
                if key not in flags and value is not None:
                    flags[key] = value
        return load_config(
            project=project,
            env=self.env,
            home=self.home,
            flags=flags,
            harness_choices=list(HARNESSES),
        )

    def with_flags(self, **flags: object) -> Context:
        return Context(self.env, self.home, {**self.flags, **flags}, self.notice)
