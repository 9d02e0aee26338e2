"""Harness registry: name → implementation. Core code looks harnesses up here only."""

from __future__ import annotations

from sono.errors import SoError
from sono.harnesses.base import Harness
from sono.harnesses.claude import ClaudeHarness
from sono.harnesses.custom import CustomHarness

HARNESSES: dict[str, type[Harness]] = {
    ClaudeHarness.name: ClaudeHarness,
    CustomHarness.name: CustomHarness,
}
# Known to the seed; implemented in the next milestone.
PLANNED = ("codex", "opencode", "pi")


def get_harness(name: str) -> Harness:
    if name in HARNESSES:
        return HARNESSES[name]()
    if name in PLANNED:
        raise SoError(f"harness {name!r} is not supported yet; use -H claude or -H custom")
    raise SoError(f"unknown harness {name!r}; choose one of: {', '.join(HARNESSES)}")
