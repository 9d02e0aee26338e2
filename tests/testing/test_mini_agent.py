"""The built-in mini agent against the scripted server, in a real temp git repo."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sono.events import Error, Event, Result, SessionStarted, Text, ToolCall, ToolResult, Usage
from sono.harnesses.claude_stream import ClaudeStreamParser
from sono.testing.model_server import ModelServer

GIT_ENV = {
    "GIT_AUTHOR_NAME": "so-sandbox",
    "GIT_AUTHOR_EMAIL": "so@sandbox",
    "GIT_COMMITTER_NAME": "so-sandbox",
    "GIT_COMMITTER_EMAIL": "so@sandbox",
}
COMMIT_PROMPT = (
    "Build the thing. Iteration 3/7.\n"
    "<so-script>printf 'made in {i} of {n}\\n' > made.txt && cat made.txt</so-script>\n"
    '<so-script>git add -A && git commit -q -m "Add made.txt ({i}/{n})" && echo committed'
    "</so-script>\n"
)


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    git(path, "commit", "-q", "--allow-empty", "-m", "init")
    return path


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **GIT_ENV},
    )
    return done.stdout


def run_agent(
    cwd: Path, base_url: str, prompt: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # Start from the host env minus what the agent reads, so the host cannot leak in.
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "SO_PROMPT_FILE")}
    env.update(GIT_ENV, ANTHROPIC_BASE_URL=base_url, **(extra_env or {}))
    return subprocess.run(
        [sys.executable, "-m", "sono.testing.mini_agent"],
        input=prompt,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def parse(stdout: str) -> list[Event]:
    parser = ClaudeStreamParser()
    return [event for line in stdout.splitlines() for event in parser.feed(line)]


def test_runs_the_script_and_commits(server: ModelServer, repo: Path) -> None:
    done = run_agent(repo, server.url, COMMIT_PROMPT)
    assert done.returncode == 0, done.stderr
    assert git(repo, "log", "--format=%s").splitlines() == ["Add made.txt (3/7)", "init"]
    assert (repo / "made.txt").read_text() == "made in 3 of 7\n"
    assert git(repo, "status", "--porcelain") == ""

    events = parse(done.stdout)
    assert not [e for e in events if e.kind in ("raw", "error")]
    assert isinstance(events[0], SessionStarted) and events[0].session_id
    calls = [e for e in events if isinstance(e, ToolCall)]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [c.name for c in calls] == ["Bash", "Bash"]
    assert [r.call_id for r in results] == [c.call_id for c in calls]
    assert [r.summary for r in results] == ["made in 3 of 7", "committed"]
    assert all(r.ok for r in results)
    assert [e.text for e in events if isinstance(e, Text)][-1] == "Iteration done."
    usage, result = events[-2], events[-1]
    assert isinstance(usage, Usage) and usage.input_tokens > 0 and usage.cost_usd == 0
    assert result == Result(ok=True, text="Iteration done.", num_turns=3)


def test_sends_bash_tool_and_api_key(server: ModelServer, repo: Path) -> None:
    run_agent(repo, server.url, "<so-script>true</so-script>", {"ANTHROPIC_API_KEY": "sk-xyz"})
    first = server.requests[0]
    assert first.path == "/v1/messages"
    assert first.headers.get("x-api-key") == "sk-xyz"
    assert [t["name"] for t in first.body["tools"]] == ["Bash"]
    assert len(server.requests) == 2


def test_default_api_key_is_a_placeholder(server: ModelServer, repo: Path) -> None:
    run_agent(repo, server.url, "hello")
    assert server.requests[0].headers.get("x-api-key") == "sk-placeholder"


def test_failed_command_is_an_error_result_but_the_run_goes_on(
    server: ModelServer, repo: Path
) -> None:
    done = run_agent(repo, server.url, "<so-script>echo oops >&2; exit 3</so-script>")
    assert done.returncode == 0
    [tool_result] = [e for e in parse(done.stdout) if isinstance(e, ToolResult)]
    assert not tool_result.ok
    assert tool_result.summary == "Exit code 3 oops"


def test_prompt_from_file_when_stdin_is_empty(
    server: ModelServer, repo: Path, tmp_path: Path
) -> None:
    prompt_file = tmp_path / "prompt.md"
    prompt_file.write_text("<so-script>touch from-file</so-script>")
    done = run_agent(repo, server.url, "", {"SO_PROMPT_FILE": str(prompt_file)})
    assert done.returncode == 0, done.stderr
    assert (repo / "from-file").exists()


def test_no_prompt_is_an_error(server: ModelServer, repo: Path) -> None:
    done = run_agent(repo, server.url, "  \n")
    assert done.returncode == 1
    assert "no prompt" in done.stderr
    assert server.requests == []


def test_api_error_exits_1_with_a_clear_line(server: ModelServer, repo: Path) -> None:
    done = run_agent(repo, server.url + "/wrong", "<so-script>true</so-script>")
    assert done.returncode == 1
    assert "API Error: 404" in done.stderr
    events = parse(done.stdout)
    assert any(isinstance(e, Error) and "404" in e.message for e in events)
    assert isinstance(events[-1], Result) and not events[-1].ok


def test_unreachable_server_exits_1(repo: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once we leave: nothing listens there
    done = run_agent(repo, f"http://127.0.0.1:{port}", "<so-script>true</so-script>")
    assert done.returncode == 1
    assert "cannot reach" in done.stderr


def test_missing_base_url_exits_1(repo: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_BASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "sono.testing.mini_agent"],
        input="hi",
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "ANTHROPIC_BASE_URL" in done.stderr
