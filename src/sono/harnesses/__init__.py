"""Harness registry: name → implementation. Core code looks harnesses up here only.

Entries are ``module:Class`` strings imported on first use, so `so list` never pays for
importing every harness.
"""

from __future__ import annotations

import importlib

from sono.errors import SoError
from sono.harnesses.base import Harness

HARNESSES: dict[str, str] = {
    "claude": "sono.harnesses.claude:ClaudeHarness",
    "codex": "sono.harnesses.codex:CodexHarness",
    "opencode": "sono.harnesses.opencode:OpencodeHarness",
    "pi": "sono.harnesses.pi:PiHarness",
    "custom": "sono.harnesses.custom:CustomHarness",
}


def harness_class(name: str) -> type[Harness]:
    if name not in HARNESSES:
        raise SoError(f"unknown harness {name!r}; choose one of: {', '.join(HARNESSES)}")
    module, _, cls = HARNESSES[name].partition(":")
    try:
        loaded: type[Harness] = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        raise SoError(
            f"harness {name!r} is not supported yet; use -H claude or -H custom"
        ) from None
    return loaded


def available() -> list[str]:
    """Harnesses whose implementation is present."""
    out = []
    for name in HARNESSES:
        try:
            harness_class(name)
        except SoError:
            continue
        out.append(name)
    return out


def get_harness(name: str) -> Harness:
    return harness_class(name)()
