"""Backend registry: name → implementation, and the ``auto`` choice. Core code looks
backends up here only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sono.backends.base import Backend
from sono.errors import SoError

if TYPE_CHECKING:
    from sono.net.policy import NetworkPolicy
    from sono.net.secrets import Secret

BACKENDS = ("bwrap", "docker", "microvm")
PLANNED: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackendSettings:
    bwrap: str | None = None  # a system bwrap instead of the bundled one
    docker_base: str | None = None  # base image of the Docker runner image
    progress: Callable[[str], None] = field(default=lambda line: None)
    # For a backend that can enforce the network policy and secrets itself (microvm:
    # microsandbox's policy and placeholders). None: so's proxy, on every backend.
    network: NetworkPolicy | None = None
    secrets: tuple[Secret, ...] = ()


def get_backend(name: str, settings: BackendSettings | None = None) -> Backend:
    settings = settings or BackendSettings()
    if name == "auto":
        name, _ = choose_auto(settings)
    if name == "bwrap":
        from sono.backends.bwrap import BwrapBackend

        return BwrapBackend(bwrap=settings.bwrap)
    if name == "docker":
        from sono.backends.docker import DockerBackend

        return DockerBackend(base=settings.docker_base, progress=settings.progress)
    if name == "microvm":
        from sono.backends.microvm import MicrovmBackend, MicrovmNet

        net = None if settings.network is None else MicrovmNet(settings.network, settings.secrets)
        return MicrovmBackend(base=settings.docker_base, net=net, progress=settings.progress)
    if name in PLANNED:
        raise SoError(f"sandbox {name!r} is not supported yet; use -s bwrap or -s docker")
    raise SoError(f"unknown sandbox {name!r}; choose one of: auto, {', '.join(BACKENDS)}")


def choose_auto(settings: BackendSettings) -> tuple[str, str]:
    """``auto``: Docker when an engine answers and the runner image is there or buildable
    from a local base, else bwrap. Returns (backend, why) for the run header and doctor.

    Never microvm: it is opted into with ``-s microvm`` (it needs the Docker-built image
    too, so it could only ever replace Docker here, and Docker stays the preference)."""
    from sono.backends.docker import DockerBackend

    docker = DockerBackend(base=settings.docker_base)
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
