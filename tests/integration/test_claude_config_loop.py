"""claude configured the way its docs say, and nothing else: real `so`, real bwrap, the
real pinned claude CLI, a fake HOME whose ``~/.claude/settings.json`` ``env`` names the
endpoint (the scripted model server) and a token, or whose ``~/.claude/.credentials.json``
holds a subscription (OAuth) login, or whose settings name an ``apiKeyHelper``. The
server must get the real credential; nothing inside the sandbox may hold it (the scan
runs from the agent's own seat)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import credscan
from helpers import DO_ITEM, PLAN1, PLAN3, git, in_sandbox, so, spec_repo
from sono.testing.model_server import ModelServer

pytestmark = pytest.mark.integration

SCAN_THEN_ITEM = credscan.scan_step(commit=False) + "\n" + DO_ITEM


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only the config files may say where the model is."""
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE_CODE_")):
            monkeypatch.delenv(name)
    yield


def fake_home(
    tmp_path: Path, settings: dict[str, Any], credentials: dict[str, Any] | None = None
) -> Path:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "settings.json").write_text(json.dumps(settings, indent=2))
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
    if credentials is not None:
        path = home / ".claude" / ".credentials.json"
        path.write_text(json.dumps(credentials, indent=2))
        path.chmod(0o600)
    return home


def run_loop(repo: Path, home: Path, iterations: int) -> tuple[str, str]:
    """The credential scan's result and so's notes."""
    env = {"HOME": str(home)}
    out = so("run", "-H", "claude", "--yes", "--json", cwd=repo, env=env)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["outcome"] == "done", out.stdout[-2000:]
    assert len(summary["iterations"]) == iterations
    sid = summary["id"]
    log = in_sandbox(
        sid, "git", "log", "--format=%s", f"refs/so/{sid}/base..HEAD", cwd=repo, env=env
    )
    assert log.split("\n") == [f"item {n}" for n in range(iterations, 0, -1)]
    notes = "\n".join(x["message"] for x in lines if x.get("kind") == "note")
    return in_sandbox(sid, "cat", credscan.RESULT, cwd=repo, env=env), notes


def messages(server: ModelServer) -> list[Any]:
    return [r for r in server.requests if r.path == "/v1/messages"]


def test_endpoint_and_token_from_user_settings_three_iterations(
    tmp_path: Path, installed_agent: Callable[[str], Path], model_server: ModelServer
) -> None:
    installed_agent("claude")
    token = credscan.real_token("sk-ant-")
    settings = {"env": {"ANTHROPIC_BASE_URL": model_server.url, "ANTHROPIC_AUTH_TOKEN": token}}
    repo = spec_repo(tmp_path, SCAN_THEN_ITEM, PLAN3)
    scan, _ = run_loop(repo, fake_home(tmp_path, settings), 3)
    assert "scanned" in scan and credscan.findings(scan) == []
    posts = messages(model_server)
    assert posts and all(r.headers.get("authorization") == f"Bearer {token}" for r in posts)


def test_oauth_login_reaches_only_the_upstream(
    tmp_path: Path, installed_agent: Callable[[str], Path], model_server: ModelServer
) -> None:
    installed_agent("claude")
    access, refresh = credscan.real_token("sk-ant-oat01-"), credscan.real_token("sk-ant-ort01-")
    expires = int((time.time() + 30 * 86400) * 1000)
    login = {
        "claudeAiOauth": {
            "accessToken": access,
            "refreshToken": refresh,
            "expiresAt": expires,
            "scopes": ["user:inference", "user:profile", "user:sessions:claude_code"],
            "subscriptionType": "max",
        }
    }
    # The endpoint is the scripted server (a user would not set it with a login; the test
    # must not reach api.anthropic.com); the credential is the login alone.
    home = fake_home(tmp_path, {"env": {"ANTHROPIC_BASE_URL": model_server.url}}, login)
    repo = spec_repo(tmp_path, SCAN_THEN_ITEM, PLAN1)
    scan, _ = run_loop(repo, home, 1)
    assert "scanned" in scan and credscan.findings(scan) == []
    posts = messages(model_server)
    assert posts and all(r.headers.get("authorization") == f"Bearer {access}" for r in posts)
    assert all("x-api-key" not in r.headers for r in posts)
    saved = json.loads((home / ".claude" / ".credentials.json").read_text())["claudeAiOauth"]
    assert saved["accessToken"] == access and saved["refreshToken"] == refresh


def test_api_key_helper_runs_on_the_host_never_the_projects(
    tmp_path: Path, installed_agent: Callable[[str], Path], model_server: ModelServer
) -> None:
    installed_agent("claude")
    key = credscan.real_token("sk-ant-api03-")
    ran, project_ran = tmp_path / "helper-ran", tmp_path / "project-helper-ran"
    helper = tmp_path / "helper.sh"
    helper.write_text(f'#!/bin/sh\necho "$PWD" >> {ran}\necho "{key}"\n')
    helper.chmod(0o700)
    settings = {"apiKeyHelper": str(helper), "env": {"ANTHROPIC_BASE_URL": model_server.url}}
    repo = spec_repo(tmp_path, SCAN_THEN_ITEM, PLAN1)
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.json").write_text(
        json.dumps(
            {
                "apiKeyHelper": f"touch {project_ran}; echo project-key",
                # so's --settings outranks the project's: claude still talks to the gateway
                "env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
            }
        )
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "project settings")
    scan, notes = run_loop(repo, fake_home(tmp_path, settings), 1)
    assert "scanned" in scan and credscan.findings(scan) == []
    posts = messages(model_server)
    assert posts and all(r.headers.get("x-api-key") == key for r in posts)
    assert all(r.headers.get("authorization") == f"Bearer {key}" for r in posts)
    assert ran.exists()  # on the host
    assert not project_ran.exists()
    assert ".claude/settings.json sets ANTHROPIC_BASE_URL, apiKeyHelper: not used" in notes
