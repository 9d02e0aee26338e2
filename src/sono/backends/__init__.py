"""Backend registry: name → implementation, imported only when asked for, and the
``auto`` choice. Core code looks backends up here only.

Adding a backend is one entry in :data:`REGISTRY`: a module under ``sono.backends`` whose
class implements :class:`~sono.backends.base.Backend` and builds itself from the
:class:`~sono.backends.base.BackendSettings` (``from_settings``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from sono.backends.base import Backend, BackendSettings
from sono.errors import SoError

if TYPE_CHECKING:
    from sono.backends.docker import DockerBackend

__all__ = ["BACKENDS", "REGISTRY", "Backend", "BackendSettings", "choose_auto", "get_backend"]

# name → (module, class); the module is imported by get_backend, never before.
REGISTRY: dict[str, tuple[str, str]] = {
    "bwrap": ("sono.backends.bwrap", "BwrapBackend"),
    "docker": ("sono.backends.docker", "DockerBackend"),
    "microvm": ("sono.backends.microvm", "MicrovmBackend"),
}
BACKENDS = tuple(REGISTRY)


class _Buildable(Protocol):
    def __call__(self, settings: BackendSettings) -> Backend: ...


def get_backend(name: str, settings: BackendSettings | None = None) -> Backend:
    settings = settings or BackendSettings()
    if name == "auto":
        name, _ = choose_auto(settings)
    if name not in REGISTRY:
        raise SoError(f"unknown sandbox {name!r}; choose one of: auto, {', '.join(BACKENDS)}")
    module, attr = REGISTRY[name]
    from_settings = cast(_Buildable, getattr(importlib.import_module(module), attr).from_settings)
    return from_settings(settings)


def choose_auto(
    settings: BackendSettings, project: Path | None = None, home: Path | None = None
) -> tuple[str, str]:
    """``auto``: Docker when an engine answers and the runner image is there or buildable
    from a local base, else bwrap — unless Docker could only copy ``project`` where bwrap
    mounts it copy-on-write (``home``: where upper layers live; both or neither given).
    Returns (backend, why) for the run header and doctor.

    Never microvm: it is opted into with ``-s microvm`` (it needs the Docker-built image
    too, so it could only ever replace Docker here, and Docker stays the preference)."""
    docker = cast("DockerBackend", get_backend("docker", settings))
    name, why = _engine_choice(docker)
    if name != "docker" or project is None or home is None:
        return name, why
    return prefer_overlay((name, why), docker, get_backend("bwrap", settings), project, home)


def _engine_choice(docker: DockerBackend) -> tuple[str, str]:
    try:
        docker.client()
    except SoError as exc:
        return "bwrap", f"auto → bwrap: {str(exc).split(';')[0]}"
    spec = docker.runner_spec()
    images = docker.images()
    if images.exists(images.runner_tag(spec)):
        return "docker", "auto → docker: the engine answers and the runner image is ready"
    if images.exists(spec.base):
        return (
            "docker",
            f"auto → docker: the engine answers; runner image buildable from {spec.base}",
        )
    return "bwrap", (
        f"auto → bwrap: Docker answers but the base image {spec.base} is not "
        "here (offline? run `so image bootstrap`)"
    )


def prefer_overlay(
    chosen: tuple[str, str], first: Backend, other: Backend, project: Path, home: Path
) -> tuple[str, str]:
    """``chosen`` (made for ``first``) unless ``first`` would copy ``project`` while
    ``other`` works here and mounts it copy-on-write: the workspace decides then."""
    obstacle = first.overlay_obstacle(project, home)
    if obstacle is None:
        return chosen
    try:
        usable = other.health().ok and other.overlay_obstacle(project, home) is None
    except SoError:
        usable = False
    if not usable:
        return chosen
    return other.name, (
        f"auto → {other.name}: {first.name} would copy the project ({obstacle}); "
        f"{other.name} gives it a copy-on-write workspace"
    )
