"""The model gateway and the budget, attacked through the real ``so`` CLI: a hostile
agent (the ``custom`` harness) talks to the gateway from inside the sandbox, with the
scripted model server as the upstream.

- It may reach only the model API endpoints, and only under the configured upstream
  base: any other method, path or spelling is refused before the upstream sees it (and
  so before the real key is sent anywhere).
- It cannot dodge ``--max-tokens`` / ``--max-cost`` by printing fake usage: the budget
  counts what the gateway measured.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hostile import HostileUser

from sono.testing.model_server import ModelServer

pytestmark = pytest.mark.integration

# Requests to the gateway from inside; each argument is "METHOD TARGET".
REQUESTS = r"""
import socket, sys  # the Docker image's python3 is minimal: no json
body = (
    b'{"model": "claude-sonnet-4-5", "max_tokens": 50, "messages": '
    b'[{"role": "user", "content": "%s"}]}' % (b"tell me about the project " * 400)
)
for request in sys.argv[1:]:
    method, target = request.split(" ", 1)
    with socket.create_connection(("127.0.0.1", 3129), timeout=30) as s:
        s.sendall(
            b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"x-api-key: sk-agent-own\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (method.encode(), target.encode(), len(body), body)
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    print("gateway:", method, target, "->", data.split(b"\r\n", 1)[0].decode())
"""
FAKE_USAGE = (
    '{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"ok",'
    '"total_cost_usd":-50,"usage":{"input_tokens":-100000000,"output_tokens":-5}}'
)
COMMIT = 'echo "$SO_ITERATION" > "f$SO_ITERATION"; git add -A; git commit -qm "item $SO_ITERATION"'


def agent(*requests: str, usage: str = FAKE_USAGE) -> str:
    """An agent script: the requests, then the usage it claims, then a commit."""
    pairs = " ".join(f"'{r}'" for r in requests)
    return "\n".join(
        [
            "cd /workspace",
            f"cat > /tmp/requests.py <<'PY'\n{REQUESTS}\nPY",
            f"python3 /tmp/requests.py {pairs} </dev/null",
            f"echo '{usage}'" if usage else "true",
            COMMIT,
            "",
        ]
    )


THREE_CALLS = agent(*["POST /anthropic/v1/messages"] * 3)


@pytest.fixture
def user(tmp_path: Path, model_server: ModelServer, backend: str) -> HostileUser:
    """After ``backend``: the canary ~/.docker/config.json must not meet the test's own
    Docker client. Its ``auth`` is made valid base64 (Docker's client refuses anything
    else, and so would stop before the attack)."""
    hostile = HostileUser.make(tmp_path)
    config = hostile.home / ".docker" / "config.json"
    secret = base64.b64encode(f"u:{hostile.canaries['~/.docker/config.json']}".encode())
    config.write_text(json.dumps({"auths": {"r.example": {"auth": secret.decode()}}}))
    hostile.env["ANTHROPIC_BASE_URL"] = model_server.url
    return hostile


def usage_lines(sandbox_dir: Path | None) -> list[dict[str, Any]]:
    assert sandbox_dir is not None
    log = sandbox_dir / "net" / "usage.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()]


def records(sandbox_dir: Path | None) -> list[dict[str, Any]]:
    assert sandbox_dir is not None
    found = sorted((sandbox_dir / "iterations").glob("*/record.json"))
    return [json.loads(p.read_text()) for p in found]


def measured_tokens(sandbox_dir: Path | None) -> int:
    lines = usage_lines(sandbox_dir)
    return sum((line["input_tokens"] or 0) + (line["output_tokens"] or 0) for line in lines)


@pytest.mark.parametrize(
    "usage",
    [
        FAKE_USAGE,
        "",  # no usage printed at all
        FAKE_USAGE.replace("-100000000", "1e999").replace("-50", "NaN"),
    ],
    ids=["negative", "silent", "nan"],
)
def test_fake_usage_does_not_dodge_max_tokens(
    user: HostileUser, model_server: ModelServer, backend: str, usage: str
) -> None:
    script = agent(*["POST /anthropic/v1/messages"] * 3, usage=usage)
    out = user.attack(script, backend=backend, iterations=2, extra=("--max-tokens", "3000"))
    calls = [r for r in model_server.requests if r.path == "/v1/messages"]
    assert len(calls) == 3, out.stdout + out.stderr  # one iteration, then the budget
    measured = measured_tokens(out.sandbox_dir)
    assert measured > 3000
    assert out.returncode == 7, out.stdout + out.stderr
    [rec] = records(out.sandbox_dir)
    assert rec["tokens_in"] + rec["tokens_out"] >= measured
    assert rec["cost_usd"] is None or rec["cost_usd"] >= 0
    listed = json.loads(user.so("list", "--json").stdout)
    assert "token budget exceeded" in str(listed[-1].get("stop_reason"))


def test_a_budget_above_the_real_use_does_not_trip(
    user: HostileUser, model_server: ModelServer, backend: str
) -> None:
    out = user.attack(THREE_CALLS, backend=backend, iterations=2, extra=("--max-tokens", "100000"))
    assert out.returncode == 5, out.stdout + out.stderr  # ran both iterations: exhausted
    assert len([r for r in model_server.requests if r.path == "/v1/messages"]) == 6
    assert 6000 < measured_tokens(out.sandbox_dir) < 100000


def test_fake_cost_does_not_dodge_max_cost(
    user: HostileUser, model_server: ModelServer, backend: str
) -> None:
    """~1000 tokens a call at claude-sonnet list prices: well over $0.005 per iteration,
    whatever the agent prints; the control budget is far above it."""
    out = user.attack(THREE_CALLS, backend=backend, iterations=2, extra=("--max-cost", "0.005"))
    assert out.returncode == 7, out.stdout + out.stderr
    assert len([r for r in model_server.requests if r.path == "/v1/messages"]) == 3
    again = THREE_CALLS + "# the control\n"  # a new commit of the same agent
    control = user.attack(again, backend=backend, iterations=2, extra=("--max-cost", "50"))
    assert control.returncode == 5, control.stdout + control.stderr


REFUSED = [
    "DELETE /anthropic/v1/files/file_1",
    "GET /anthropic/v1/organizations/api_keys",
    "POST /anthropic/v1/messages/batches",
    "POST /anthropic/v1/messages/../../../admin",
    "POST /anthropic/v1/%2e%2e/%2e%2e/admin",
    "POST /anthropic/v1/messages%2f..%2fadmin",
    "POST /anthropic/v1\\messages",
    "POST /anthropic//v1/messages",
    "POST /anthropic/v1/messages;x=1",
    "GET /anthropic/v1/messages",
    "POST /openai/../anthropic/v1/messages",
    "POST http://127.0.0.1:1/anthropic/v1/messages",
    "CONNECT 127.0.0.1:443",
    "PATCH /openai/files",
]


def test_only_model_endpoints_reach_the_upstream(
    user: HostileUser, model_server: ModelServer, backend: str
) -> None:
    """Every variant is refused before the upstream sees it; the control (a Messages
    call) reaches it with the host's key, never the agent's."""
    out = user.attack(agent(*REFUSED, "POST /anthropic/v1/messages"), backend=backend)
    assert out.returncode in (0, 5), out.stdout + out.stderr
    seen = model_server.requests
    assert [(r.method, r.path) for r in seen] == [("POST", "/v1/messages")]
    assert seen[0].headers["x-api-key"] == user.env["ANTHROPIC_API_KEY"]
    lines = usage_lines(out.sandbox_dir)
    refused = [line for line in lines if line["status"] != 200]
    assert len(refused) == len(REFUSED)
    assert all(line["status"] in (400, 403, 404) and line["refused"] for line in refused)
    assert all(len(str(line["refused"])) <= 200 for line in refused)
