"""Backend registry: name → implementation. Core code looks backends up here only."""

from __future__ import annotations

from sono.backends.base import Backend
from sono.backends.bwrap import BwrapBackend
from sono.errors import SoError

BACKENDS: dict[str, type[BwrapBackend]] = {BwrapBackend.name: BwrapBackend}
PLANNED = ("docker", "microvm")


def get_backend(name: str, *, bwrap: str | None = None) -> Backend:
    if name == "auto":
        name = "bwrap"
    if name in BACKENDS:
        return BACKENDS[name](bwrap=bwrap)
    if name in PLANNED:
        raise SoError(f"sandbox {name!r} is not supported yet; use -s bwrap")
    raise SoError(f"unknown sandbox {name!r}; choose one of: {', '.join(BACKENDS)}")
