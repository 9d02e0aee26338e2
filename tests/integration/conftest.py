"""Integration fixtures: the real claude CLI (pinned, installed once per session) and the
scripted model server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import AGENTS_CACHE

from sono import agents
from sono.harnesses.claude import ClaudeHarness
from sono.testing.model_server import ModelServer


@pytest.fixture(scope="session")
def claude_bin() -> Path:
    """CI must run these tests, so a missing CLI is installed, never skipped."""
    pkg = ClaudeHarness.npm
    assert pkg is not None
    path = agents.installed_bin(AGENTS_CACHE, "claude", pkg)
    if not path.exists():
        agents.install("claude", pkg, AGENTS_CACHE)
    return path


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def claude_env(claude_bin: Path, model_server: ModelServer) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": model_server.url, "ANTHROPIC_API_KEY": "sk-test-placeholder",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
