"""Agent resolution rules: per-task effort defaults and validation."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from fakes import HostBackend
from sono.backends.bwrap import BwrapBackend
from sono.commands._common import effort_for, endpoints, enforceable_limits
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


def test_unenforceable_limits_fail_closed(tmp_path: Path) -> None:
    with pytest.raises(SoError, match=r"limits.memory .* cannot be enforced on fake here"):
        enforceable_limits(cfg(tmp_path, SO_LIMIT_MEMORY="1g"), HostBackend())


def test_best_effort_downgrades_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = cfg(tmp_path, SO_LIMIT_MEMORY="1g", SO_ENFORCE="best-effort")
    limits = enforceable_limits(config, HostBackend())
    assert limits is not None and limits.memory == 1 << 30
    assert "limits.memory is not enforced on fake here" in capsys.readouterr().err


def test_no_limits_no_check(tmp_path: Path) -> None:
    assert enforceable_limits(cfg(tmp_path), HostBackend()) is None


def test_bwrap_enforces_limits_here(tmp_path: Path) -> None:
    limits = enforceable_limits(cfg(tmp_path, SO_LIMIT_PIDS="64"), BwrapBackend())
    assert limits is not None and limits.pids == 64
