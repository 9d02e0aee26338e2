"""The backend registry: lazy plug-ins, and ``auto`` preferring the better workspace."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from helpers import make_repo
from sono import proc
from sono.backends import BACKENDS, REGISTRY, BackendSettings, choose_auto, get_backend
from sono.backends.base import Health
from sono.errors import SoError


def test_importing_one_backend_imports_no_other_and_no_network_stack() -> None:
    for name in BACKENDS:
        others = [f"sono.backends.{o}" for o in BACKENDS if o != name]
        heavy = ["sono.net.session", "sono.config", "sono.sandbox", "sono.state", "asyncio"]
        code = (
            f"import sys, sono.backends.{name}; "
            f"print([m for m in {others + heavy!r} if m in sys.modules])"
        )
        if name == "microvm":  # the SDK runs on asyncio: its backend may load it
            code = code.replace("'asyncio'", "'no-such-module'")
        out = proc.run([sys.executable, "-c", code], check=False)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "[]", (name, out.stdout)


def test_every_registered_backend_builds_from_the_settings() -> None:
    for name in REGISTRY:
        backend = get_backend(name, BackendSettings(docker_base="img:tag"))
        assert backend.name == name
    with pytest.raises(SoError, match="unknown sandbox 'nope'; choose one of: auto, bwrap"):
        get_backend("nope")


class Stub:
    """A backend that only answers the two questions ``auto`` asks."""

    name: ClassVar[str] = "stub"

    def __init__(self, name: str, obstacle: str | None, ok: bool = True) -> None:
        self.name = name  # type: ignore[misc]  # one class, several names
        self.obstacle = obstacle
        self.ok = ok

    def overlay_obstacle(self, project: Path, home: Path) -> str | None:
        return self.obstacle

    def health(self) -> Health:
        return Health(self.ok, "stub")


def test_prefer_overlay_takes_the_backend_that_does_not_copy(tmp_path: Path) -> None:
    from sono.backends import prefer_overlay

    chosen = ("docker", "auto → docker: the engine answers")
    owned = "project is owned by uid 0"
    args = (tmp_path, tmp_path)
    docker, bwrap = Stub("docker", owned), Stub("bwrap", None)
    name, why = prefer_overlay(chosen, docker, bwrap, *args)  # type: ignore[arg-type]
    assert name == "bwrap"
    assert why == (
        f"auto → bwrap: docker would copy the project ({owned}); "
        "bwrap gives it a copy-on-write workspace"
    )
    # Docker keeps it when it can mount the overlay, or when bwrap would copy too or fails.
    for first, other in [
        (Stub("docker", None), bwrap),
        (docker, Stub("bwrap", "no overlay here")),
        (docker, Stub("bwrap", None, ok=False)),
    ]:
        assert prefer_overlay(chosen, first, other, *args) == chosen  # type: ignore[arg-type]


@pytest.mark.integration
@pytest.mark.skipif(os.getuid() != 0, reason="a root-owned project needs root")
def test_auto_prefers_bwrap_for_a_root_owned_project(docker_ready: str, tmp_path: Path) -> None:
    """As root, Docker's agent is uid 1000: a root-owned project could only be copied into
    its container, while bwrap (the caller's uid inside) mounts it copy-on-write."""
    project = make_repo(tmp_path / "proj")
    home = tmp_path / "so" / "sandboxes"
    assert choose_auto(BackendSettings())[0] == "docker"  # without a project: Docker
    name, why = choose_auto(BackendSettings(), project, home)
    assert name == "bwrap", why
    assert "docker would copy the project" in why and "owned by uid 0" in why
