"""opencode configured the way its docs say, and nothing else: real `so`, real bwrap, the
real pinned opencode CLI, a fake HOME whose ``~/.config/opencode/opencode.json`` names a
provider (``options.baseURL`` = the scripted model server, a key, the model), or whose
``auth.json`` holds an OAuth-style login. The server must get the real credential; nothing
inside the sandbox may hold it (the scan runs from the agent's own seat)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import credscan
from helpers import DO_ITEM, PLAN1, PLAN3, in_sandbox, so, spec_repo
from sono.testing.model_server import ModelServer

pytestmark = pytest.mark.integration

SCAN_THEN_ITEM = credscan.scan_step(commit=False) + "\n" + DO_ITEM
FAR_MS = int((time.time() + 30 * 86400) * 1000)


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only the config files may say where the model is."""
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPENAI_", "OPENCODE_", "OPENROUTER_")):
            monkeypatch.delenv(name)
    yield


def fake_home(tmp_path: Path, config: dict[str, Any], auth: dict[str, Any] | None = None) -> Path:
    home = tmp_path / "home"
    conf = home / ".config" / "opencode"
    conf.mkdir(parents=True)
    (conf / "opencode.json").write_text(json.dumps(config, indent=2))
    if auth is not None:
        data = home / ".local" / "share" / "opencode"
        data.mkdir(parents=True)
        (data / "auth.json").write_text(json.dumps(auth, indent=2))
        (data / "auth.json").chmod(0o600)
    return home


def home_env(home: Path) -> dict[str, str]:
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
    }


def provider(server: ModelServer, **options: str) -> dict[str, Any]:
    return {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Scripted",
        "options": {"baseURL": f"{server.url}/v1", **options},
        "models": {"gpt-5": {"name": "gpt-5"}},
    }


def run_loop(repo: Path, home: Path, iterations: int) -> tuple[dict[str, Any], str]:
    out = so("run", "-H", "opencode", "--yes", "--json", cwd=repo, env=home_env(home))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["outcome"] == "done", out.stdout[-2000:]
    assert len(summary["iterations"]) == iterations
    sid = summary["id"]
    log = in_sandbox(
        sid, "git", "log", "--format=%s", f"refs/so/{sid}/base..HEAD", cwd=repo, env=home_env(home)
    )
    assert log.split("\n") == [f"item {n}" for n in range(iterations, 0, -1)]
    scan = in_sandbox(sid, "cat", credscan.RESULT, cwd=repo, env=home_env(home))
    return summary, scan


def test_provider_from_user_config_three_iterations(
    tmp_path: Path, installed_agent: Callable[[str], Path], model_server: ModelServer
) -> None:
    installed_agent("opencode")
    key = credscan.real_token("sk-")
    config = {
        "$schema": "https://opencode.ai/config.json",
        "model": "scripted/gpt-5",
        "provider": {"scripted": provider(model_server, apiKey=key)},
    }
    home = fake_home(tmp_path, config)
    repo = spec_repo(tmp_path, SCAN_THEN_ITEM, PLAN3)
    _, scan = run_loop(repo, home, 3)
    assert "scanned" in scan and credscan.findings(scan) == []

    posts = [r for r in model_server.requests if r.path == "/v1/chat/completions"]
    assert posts and all(r.headers.get("authorization") == f"Bearer {key}" for r in posts)
    assert {r.body["model"] for r in posts if r.body.get("tools")} == {"gpt-5"}


def test_oauth_login_in_auth_json_reaches_only_the_upstream(
    tmp_path: Path, installed_agent: Callable[[str], Path], model_server: ModelServer
) -> None:
    installed_agent("opencode")
    access, refresh = credscan.real_token("at-"), credscan.real_token("rt-")
    # Poe's login (opencode's built-in plugin) is an OAuth login whose access token is
    # the provider's bearer key.
    config = {"model": "poe/gpt-5", "provider": {"poe": provider(model_server)}}
    auth = {"poe": {"type": "oauth", "access": access, "refresh": refresh, "expires": FAR_MS}}
    home = fake_home(tmp_path, config, auth)
    repo = spec_repo(tmp_path, SCAN_THEN_ITEM, PLAN1)
    _, scan = run_loop(repo, home, 1)
    assert "scanned" in scan and credscan.findings(scan) == []

    posts = [r for r in model_server.requests if r.path == "/v1/chat/completions"]
    assert posts and all(r.headers.get("authorization") == f"Bearer {access}" for r in posts)
    # The host's login file is untouched (no refresh was due).
    saved = json.loads((home / ".local/share/opencode/auth.json").read_text())
    assert saved["poe"]["access"] == access and saved["poe"]["refresh"] == refresh
