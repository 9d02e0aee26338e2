"""Fail fast and say why: a real agent CLI whose model cannot be used ends its iteration
within seconds, with one line naming the harness, the endpoint, where it was configured
and the fix — instead of minutes of retries (real so, bwrap, the pinned claude CLI)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from helpers import so, spec_repo

pytestmark = pytest.mark.integration

STEP = "echo hi > a.txt && git add -A && git commit -qm a"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Refusing(BaseHTTPRequestHandler):
    """An Anthropic-style upstream that refuses every credential."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps(
            {
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid x-api-key"},
            }
        ).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST


@pytest.fixture
def refusing() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _run(repo: Path, env: dict[str, str]) -> tuple[int, str, float]:
    start = time.monotonic()
    out = so("run", "-H", "claude", "-i", "3", "--yes", cwd=repo, env=env, timeout=240)
    return out.returncode, out.stderr, time.monotonic() - start


def test_an_unreachable_model_server_ends_the_run_in_seconds_and_says_where(
    tmp_path: Path, claude_bin: Path
) -> None:
    port = _closed_port()
    repo = spec_repo(tmp_path, STEP, "- [ ] one\n")
    env = {
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
        "ANTHROPIC_API_KEY": "sk-test-unused",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    code, err, took = _run(repo, env)
    assert code != 0
    assert took < 60, err  # not claude's ten retries with back-off
    lines = [ln for ln in err.splitlines() if "cannot use its model" in ln]
    assert lines, err
    assert (
        f"claude cannot use its model: http://127.0.0.1:{port} (configured in env "
        "ANTHROPIC_BASE_URL) is unreachable (" in lines[0]
    )
    assert "sk-test-unused" not in err
    # one iteration, not three: the next would fail the same way
    listed = json.loads(so("list", "--json", cwd=repo).stdout)
    assert listed[0]["iterations"] == 1


def test_a_refused_key_names_the_upstreams_reason_and_the_key_source(
    tmp_path: Path, claude_bin: Path, refusing: str
) -> None:
    repo = spec_repo(tmp_path, STEP, "- [ ] one\n")
    env = {
        "ANTHROPIC_BASE_URL": refusing,
        "ANTHROPIC_API_KEY": "sk-test-refused",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    code, err, took = _run(repo, env)
    assert code != 0 and took < 60, err
    assert f"claude cannot use its model: 401 from {refusing} (configured in env " in err
    assert ": invalid x-api-key — the API key from env ANTHROPIC_API_KEY was refused" in err
