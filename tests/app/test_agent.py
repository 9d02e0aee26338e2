"""Agent resolution rules: per-task effort defaults and validation."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from sono.app.agent import effort_for, endpoints
from sono.config import load_config
from sono.errors import SoError
from sono.harnesses.claude import ClaudeHarness
from sono.harnesses.custom import CustomHarness


class NoEffort(CustomHarness):
    efforts: ClassVar[tuple[str, ...]] = ()


def cfg(tmp_path: Path, **env: str):  # type: ignore[no-untyped-def]
    return load_config(project=None, env=env, home=tmp_path, flags={})


@pytest.mark.parametrize(
    ("task", "expected"), [("code", "medium"), ("plan", "high"), ("learn", "medium")]
)
def test_task_defaults(tmp_path: Path, task: str, expected: str) -> None:
    assert effort_for(cfg(tmp_path), ClaudeHarness(), task) == expected


def test_configured_effort_wins_over_task_default(tmp_path: Path) -> None:
    assert effort_for(cfg(tmp_path, SO_EFFORT="low"), ClaudeHarness(), "plan") == "low"


def test_effort_a_harness_cannot_take_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SoError, match="not valid for claude"):
        effort_for(cfg(tmp_path, SO_EFFORT="turbo"), ClaudeHarness(), "code")
    with pytest.raises(SoError, match="takes no effort"):
        effort_for(cfg(tmp_path, SO_EFFORT="low"), NoEffort(), "code")


def test_no_default_for_harness_without_efforts(tmp_path: Path) -> None:
    assert effort_for(cfg(tmp_path), NoEffort(), "code") is None
    assert effort_for(cfg(tmp_path), CustomHarness(), "code") is None
    assert effort_for(cfg(tmp_path, SO_EFFORT="x"), CustomHarness(), "code") == "x"


def test_endpoints_from_env() -> None:
    env = {"ANTHROPIC_BASE_URL": "http://a", "OPENAI_BASE_URL": "http://o", "OTHER": "x"}
    assert endpoints(env) == {"anthropic": "http://a", "openai": "http://o"}
    assert endpoints({}) == {}
