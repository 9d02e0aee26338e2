"""A fake Backend at the unit-test seam: runs commands directly in the workspace on the
host (no namespaces). Only for unit tests of the loop's logic; integration tests use bwrap."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from sono import proc
from sono.backends.base import Health, SandboxSpec
from sono.limits import Enforcement, Limits
from sono.sandbox import Sandbox, create_sandbox
from sono.state import Store
from sono.workspace import inspect_host


class HostBackend:
    name: ClassVar[str] = "fake"

    def __init__(self) -> None:
        self.execs: list[list[str]] = []

    def _env(self, spec: SandboxSpec, env: Mapping[str, str] | None) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(spec.home_seed),
            "GIT_CONFIG_NOSYSTEM": "1",
            "SO_SANDBOX_ID": spec.id,
            **(env or {}),
        }

    def create(self, *, spec: SandboxSpec) -> None:
        spec.home_seed.mkdir(parents=True, exist_ok=True)

    def overlay_obstacle(self, project: Path, home: Path) -> str | None:
        return "the fake backend runs on the host"

    def overlay_owner(self) -> tuple[int, int] | None:
        return None

    def refresh(self, *, spec: SandboxSpec) -> None:
        """Nothing is mounted."""

    def plan_limits(self, limits: Limits) -> dict[str, Enforcement]:
        return {
            name: Enforcement(name, "none", "the fake backend runs on the host")
            for name in ("memory", "cpus", "pids", "disk")
            if getattr(limits, name) is not None
        }

    def exec(
        self,
        *,
        spec: SandboxSpec,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdin_text: str | None,
        timeout: float | None,
        on_line: Callable[[str], None],
        stop: Callable[[], str | None] | None = None,
    ) -> proc.Streamed:
        self.execs.append(list(argv))
        return proc.stream(
            argv,
            on_line=on_line,
            stdin_text=stdin_text,
            timeout=timeout,
            stop=stop,
            env=self._env(spec, env),
            cwd=spec.workspace,
        )

    def run(
        self,
        *,
        spec: SandboxSpec,
        argv: Sequence[str],
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> proc.Completed:
        return proc.run(argv, check=check, env=self._env(spec, env), cwd=spec.workspace)

    def shell(self, *, spec: SandboxSpec, argv: Sequence[str] = ()) -> int:
        return proc.interactive(list(argv) or ["sh"], cwd=spec.workspace)

    def destroy(self, *, spec: SandboxSpec) -> None:
        pass

    def health(self) -> Health:
        return Health(True, "fake")


def fake_sandbox(
    tmp_path: Path,
    repo: Path,
    *,
    backend: HostBackend | None = None,
    exclude: tuple[str, ...] = (),
    allow_dirty: bool = False,
) -> Sandbox:
    """A real workspace (real git) around the fake backend, in ``tmp_path/so``."""
    return create_sandbox(
        store=Store(tmp_path / "so"),
        host=inspect_host(repo),
        harness="custom",
        backend_name="fake",
        backend=backend or HostBackend(),
        exclude=exclude,
        allow_dirty=allow_dirty,
        model=None,
        effort=None,
    )
