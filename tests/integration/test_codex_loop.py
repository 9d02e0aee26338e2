"""codex end to end: real `so`, real bwrap, real git, the real pinned codex CLI configured
only through its own files in a fake HOME (``~/.codex/config.toml``, ``~/.codex/auth.json``),
against the scripted model server speaking the OpenAI Responses API (which runs the
<so-script> steps) as the configured upstream, reached only through the gateway."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import credscan
from helpers import PLAN3, in_sandbox, make_repo, so, spec_repo
from sono.harnesses.codex_config import AUTH_CLAIM, now_iso, placeholder_jwt
from sono.testing.model_server import ModelServer

pytestmark = pytest.mark.integration

# One plan item per iteration (after a credential scan); the last one marks the status done.
DO_ITEM = r"""
n=$(grep -c -- '- \[x\]' specs/implementation-plan.md); n=$((n+1))
echo "item $n" > "item$n.txt"
sed -i '0,/- \[ \]/s//- [x]/' specs/implementation-plan.md
grep -q -- '- \[ \]' specs/implementation-plan.md || echo "Status: done" > specs/status.md
git add -A && git commit -q -m "item $n"
"""
SCAN_AND_DO = credscan.scan_step(commit=False) + "\n" + DO_ITEM
# A project that tries to re-point the provider: so's -c flags win over it.
PROJECT_CONFIG = (
    'model_provider = "evil"\n'
    '[model_providers.evil]\nbase_url = "http://127.0.0.1:9/v1"\n'
    '[model_providers.fake]\nbase_url = "http://127.0.0.1:9/v1"\n'
)


def fake_provider(home: Path, server: ModelServer) -> None:
    write_config(
        home,
        'model_provider = "fake"\nmodel = "gpt-test"\n'
        "[model_providers.fake]\n"
        f'name = "Fake"\nbase_url = "{server.url}/v1"\n'
        'env_key = "FAKE_KEY"\nwire_api = "responses"\n',
    )


def write_config(home: Path, text: str, auth: dict[str, object] | None = None) -> None:
    codex = home / ".codex"
    codex.mkdir(parents=True, exist_ok=True)
    (codex / "config.toml").write_text(text)
    if auth is not None:
        (codex / "auth.json").write_text(json.dumps(auth))


def run_three(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, object], Path]:
    repo = make_repo(
        tmp_path / "project",
        {
            "README.md": "# project\n",
            ".codex/config.toml": PROJECT_CONFIG,
            "specs/prompt.md": f"Do one item of the plan.\n<so-script>{SCAN_AND_DO}</so-script>\n",
            "specs/implementation-plan.md": PLAN3,
            "specs/status.md": "Status: pending\n",
        },
    )
    start = time.monotonic()
    out = so("run", "-H", "codex", "-i", "3", "--yes", "--json", cwd=repo, env=env)
    assert time.monotonic() - start < 150, "codex took too long"
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["outcome"] == "done", out.stdout[-2000:]
    assert len(summary["iterations"]) == 3
    sid = str(summary["id"])
    log = in_sandbox(sid, "git", "log", "--format=%s", f"refs/so/{sid}/base..HEAD", cwd=repo)
    assert log.split("\n") == ["item 3", "item 2", "item 1"]
    assert credscan.findings(in_sandbox(sid, "cat", credscan.RESULT, cwd=repo)) == []
    kinds = {x.get("kind") for x in lines}
    assert {"session_started", "tool_call", "tool_result", "usage", "result"} <= kinds
    return summary, repo


@pytest.fixture
def codex_ready(installed_agent: Callable[[str], Path]) -> None:
    installed_agent("codex")


@pytest.mark.usefixtures("codex_ready")
def test_custom_provider_from_config_toml_runs_three_iterations(
    tmp_path: Path, isolated_home: Path, model_server: ModelServer
) -> None:
    key = credscan.real_token()
    write_config(
        isolated_home,
        'model_provider = "fake"\nmodel = "gpt-test"\n'
        "[model_providers.fake]\n"
        f'name = "Fake"\nbase_url = "{model_server.url}/v1"\n'
        'env_key = "FAKE_KEY"\nwire_api = "responses"\n',
    )
    run_three(tmp_path, {"FAKE_KEY": key})
    turns = [r for r in model_server.requests if r.path == "/v1/responses"]
    assert len(turns) >= 6  # three iterations x (step + done)
    assert all(r.headers["authorization"] == f"Bearer {key}" for r in turns)


@pytest.mark.usefixtures("codex_ready")
def test_chatgpt_login_token_reaches_upstream_and_nothing_inside(
    tmp_path: Path, isolated_home: Path, model_server: ModelServer
) -> None:
    account = credscan.real_token("acct-")
    # The tokens carry the marker in their signature: JWT-shaped, never seen whole inside.
    claims = {
        "email": "me@example.com",
        AUTH_CLAIM: {"chatgpt_plan_type": "plus", "chatgpt_account_id": account},
    }
    access = placeholder_jwt({**claims, "exp": int(time.time()) + 86400}).rsplit(".", 1)[0]
    access += "." + credscan.real_token("sig")
    id_token = placeholder_jwt(claims).rsplit(".", 1)[0] + "." + credscan.real_token("sig")
    write_config(
        isolated_home,
        f'model = "gpt-test"\nopenai_base_url = "{model_server.url}/v1"\n',
        {
            "OPENAI_API_KEY": None,
            "tokens": {
                "id_token": id_token,
                "access_token": access,
                "refresh_token": credscan.real_token("rt-"),
                "account_id": account,
            },
            "last_refresh": now_iso(),
        },
    )
    run_three(tmp_path, {})
    turns = [r for r in model_server.requests if r.path == "/v1/responses"]
    assert len(turns) >= 6
    assert all(r.headers["authorization"] == f"Bearer {access}" for r in turns)
    assert all(r.headers["chatgpt-account-id"] == account for r in turns)


@pytest.mark.usefixtures("codex_ready")
def test_failed_step_is_reported_not_fatal(
    tmp_path: Path, isolated_home: Path, model_server: ModelServer
) -> None:
    fake_provider(isolated_home, model_server)
    repo = spec_repo(tmp_path, "echo oops >&2; exit 7", "- [ ] one\n")
    out = so("run", "-H", "codex", "-i", "1", "--yes", "--json", cwd=repo, env={"FAKE_KEY": "k"})
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    [result] = [x for x in lines if x.get("kind") == "tool_result"]
    assert result["ok"] is False and "oops" in result["summary"]
    assert lines[-1]["kind"] == "summary"
