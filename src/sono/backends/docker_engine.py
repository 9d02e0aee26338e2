"""The Docker engine connection, shared by the Docker backend and the microVM backend
(whose image is built with Docker and exported from it)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from sono.errors import SoError


def connect() -> Any:
    """A client for ``DOCKER_HOST`` (or the default socket) that answered a ping; a
    :class:`SoError` that says what to do otherwise."""
    import docker
    import docker.errors

    try:
        client = _client_without_credentials(docker)
        client.ping()
    except docker.errors.DockerException as exc:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise SoError(
            f"no Docker engine answers at {where} ({_short(exc)}); start "
            "dockerd (or set DOCKER_HOST), or use -s bwrap"
        ) from None
    return client


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:160] if text else type(exc).__name__


def _client_without_credentials(docker: Any) -> Any:
    """A client for ``DOCKER_HOST`` (or the default socket) that never reads the user's
    ``~/.docker/config.json``: so pulls nothing from registries, so it needs none of the
    credentials there (and a malformed file must not break so)."""

    saved = os.environ.get("DOCKER_CONFIG")
    with tempfile.TemporaryDirectory(prefix="so-docker-config-") as empty:
        Path(empty, "config.json").write_text("{}\n")  # found first: no fallback to ~/.docker
        os.environ["DOCKER_CONFIG"] = empty
        try:
            return docker.from_env(timeout=30)
        finally:
            if saved is None:
                os.environ.pop("DOCKER_CONFIG", None)
            else:
                os.environ["DOCKER_CONFIG"] = saved
