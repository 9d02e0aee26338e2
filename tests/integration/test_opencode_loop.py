"""opencode end to end: real `so`, real bwrap, real git, the real pinned opencode CLI,
against the scripted model server speaking OpenAI Chat Completions (which runs the
<so-script> steps through opencode's bash tool)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import DO_ITEM, in_sandbox, so, spec_repo
from sono.testing.model_server import ModelServer

pytestmark = pytest.mark.integration

PLAN2 = "# Plan\n\n- [ ] first\n- [ ] second\n"


@pytest.fixture
def opencode_env(
    installed_agent: Callable[[str], Path], model_server: ModelServer
) -> dict[str, str]:
    installed_agent("opencode")
    # A bare host, as for codex: the harness adds /v1 (the same value serves both).
    return {"OPENAI_BASE_URL": model_server.url, "OPENAI_API_KEY": "sk-test-placeholder"}


def test_opencode_runs_two_iterations_and_commits(
    tmp_path: Path, opencode_env: dict[str, str], model_server: ModelServer
) -> None:
    repo = spec_repo(tmp_path, DO_ITEM, PLAN2)
    start = time.monotonic()
    out = so("run", "-H", "opencode", "-e", "high", "--yes", "--json", cwd=repo, env=opencode_env)
    assert time.monotonic() - start < 60
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["outcome"] == "done"
    assert len(summary["iterations"]) == 2

    kinds = {x.get("kind") for x in lines}
    assert {"session_started", "thinking", "tool_call", "tool_result", "usage", "result"} <= kinds
    assert "raw" not in kinds and "error" not in kinds
    calls = [x for x in lines if x.get("kind") == "tool_call"]
    assert [c["name"] for c in calls] == ["bash", "bash"]
    assert calls[0]["summary"].startswith("n=1 ")
    assert all(x["ok"] for x in lines if x.get("kind") == "tool_result")
    usage = [x for x in lines if x.get("kind") == "usage"]
    assert usage and all(u["input_tokens"] > 0 and u["cached_tokens"] > 0 for u in usage)
    assert [x["ok"] for x in lines if x.get("kind") == "result"] == [True, True]
    sid = summary["id"]
    assert in_sandbox(
        sid, "git", "log", "--format=%s", f"refs/so/{sid}/base..HEAD", cwd=repo
    ).split("\n") == [
        "item 2",
        "item 1",
    ]
    assert in_sandbox(sid, "cat", "item2.txt", cwd=repo) == "item 2"

    # opencode reached the server through the provider the harness defined, with the key
    # from the environment and the chosen effort as its variant.
    posts = [r for r in model_server.requests if r.path == "/v1/chat/completions"]
    turns = [r for r in posts if r.body.get("tools")]
    assert len(turns) == 4  # two iterations x (step + done)
    assert all(r.headers.get("authorization") == "Bearer sk-test-placeholder" for r in posts)
    assert {r.body["model"] for r in turns} == {"gpt-5"}
    assert {r.body.get("reasoning_effort") for r in turns} == {"high"}
    assert all(r.body.get("stream") is True for r in turns)
    assert [r.path for r in model_server.requests if r.path != "/v1/chat/completions"] == []
