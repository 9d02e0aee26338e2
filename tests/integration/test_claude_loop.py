"""The Foundation scenarios end to end: real `so`, real bwrap, real git, the real pinned
claude CLI, against the scripted model server (which runs the <so-script> steps)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import helpers
from helpers import DO_ITEM, PLAN3, SO, git, in_sandbox, pids, so, tree_snapshot, unique_sleep
from sono.testing.model_server import ModelServer

pytestmark = pytest.mark.integration


def spec_repo(tmp_path: Path, script: str, plan: str = PLAN3) -> Path:
    return helpers.spec_repo(tmp_path, script, plan)


def sandboxes(repo: Path) -> list[dict[str, object]]:
    data = json.loads(so("list", "--json", cwd=repo).stdout)
    assert isinstance(data, list)
    return data


def test_three_iterations_then_merge(
    tmp_path: Path, claude_env: dict[str, str], backend: str
) -> None:
    repo = spec_repo(tmp_path, DO_ITEM)
    before = tree_snapshot(repo)
    out = so(
        "run", "-s", backend, "-H", "claude", "-i", "5", "--yes", "--json", cwd=repo, env=claude_env
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["outcome"] == "done"
    assert summary["planned"] == 3 and len(summary["iterations"]) == 3
    kinds = {x.get("kind") for x in lines}
    assert {"tool_call", "usage", "result", "session_started"} <= kinds
    tool_calls = [x for x in lines if x.get("kind") == "tool_call"]
    assert tool_calls and tool_calls[0]["name"] == "Bash"

    sid = summary["id"]
    for n in (1, 2, 3):
        assert in_sandbox(sid, "git", "rev-parse", f"refs/so/{sid}/iter/{n}", cwd=repo)
    assert in_sandbox(sid, "git", "rev-parse", f"refs/so/{sid}/base", cwd=repo) == git(
        repo, "rev-parse", "HEAD"
    )
    assert in_sandbox(
        sid, "git", "log", "--format=%s", f"refs/so/{sid}/base..HEAD", cwd=repo
    ).split("\n") == [
        "item 3",
        "item 2",
        "item 1",
    ]
    stat = so("diff", sid, "--stat", cwd=repo).stdout
    assert "item1.txt" in stat and "item3.txt" in stat
    assert "item2.txt" in so("diff", sid, "--iter", "2", cwd=repo).stdout
    assert "item1.txt" not in so("diff", sid, "--iter", "2", "--stat", cwd=repo).stdout
    listed = sandboxes(repo)
    assert listed[0]["id"] == sid and listed[0]["status"] == "done"
    assert listed[0]["iterations"] == 3 and listed[0]["commits"] == 3

    assert tree_snapshot(repo) == before  # the host repo is byte-identical until merge

    merged = so("merge", sid, "--yes", cwd=repo)
    assert merged.returncode == 0, merged.stderr
    staged = git(repo, "diff", "--cached", "--name-only").split()
    assert staged == [
        "item1.txt",
        "item2.txt",
        "item3.txt",
        "specs/implementation-plan.md",
        "specs/status.md",
    ]
    assert git(repo, "log", "--format=%s") == "initial"  # staged, not committed
    assert sandboxes(repo) == []
    records = Path(os.environ["SO_HOME"]) / "sandboxes"
    assert not (records / sid).exists()


def test_agent_that_never_commits(tmp_path: Path, claude_env: dict[str, str], backend: str) -> None:
    repo = spec_repo(tmp_path, 'echo "work" > wip.txt', plan="- [ ] one\n")
    out = so("run", "-s", backend, "--yes", "--json", cwd=repo, env=claude_env)
    summary = json.loads(out.stdout.splitlines()[-1])
    rec = summary["iterations"][0]
    assert rec["commit_retries"] == 3 and rec["auto_committed"] is True
    assert (
        in_sandbox(summary["id"], "git", "log", "-1", "--format=%s", cwd=repo)
        == "so: uncommitted changes after iteration 1"
    )
    assert in_sandbox(summary["id"], "git", "status", "--porcelain", cwd=repo) == ""


def test_hanging_agent_is_killed_with_its_tree(
    tmp_path: Path, claude_env: dict[str, str], backend: str
) -> None:
    sleep = unique_sleep()
    repo = spec_repo(tmp_path, f"{sleep} & {sleep}", plan="- [ ] one\n")
    start = time.monotonic()
    out = so("run", "-s", backend, "--yes", "--json", "--timeout", "8s", cwd=repo, env=claude_env)
    assert time.monotonic() - start < 60
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["iterations"][0]["timed_out"] is True
    time.sleep(1)
    assert pids(sleep) == [], "agent processes outlived the timeout"
    assert str(sandboxes(repo)[0]["last_error"]).startswith("iteration 1 timed out")


def test_sigint_stops_cleanly_and_continue_works(
    tmp_path: Path, claude_env: dict[str, str], backend: str
) -> None:
    sleep = unique_sleep()
    script = f"[ -f .slept ] || {{ touch .slept; {sleep}; }}\n" + DO_ITEM
    repo = spec_repo(tmp_path, script, plan="- [ ] one\n")
    proc = subprocess.Popen(
        [SO, "run", "-s", backend, "--yes", cwd_arg := "-i", "1"],
        cwd=repo,
        env={**os.environ, **claude_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    del cwd_arg
    deadline = time.monotonic() + 60
    while not pids(sleep) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids(sleep), "the agent never started its step"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "so continue" in err
    time.sleep(0.5)
    assert pids(sleep) == []
    [rec] = sandboxes(repo)
    assert rec["status"] == "stopped"
    sid = str(rec["id"])
    out = so("continue", sid, "-i", "1", "--yes", "--json", cwd=repo, env=claude_env)
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["outcome"] == "done", out.stderr
    assert summary["iterations"][0]["n"] == 2  # the interrupted iteration 1 stays recorded


def test_agent_cannot_write_outside_the_workspace(
    tmp_path: Path, claude_env: dict[str, str], backend: str
) -> None:
    outside = tmp_path / "outside.txt"
    script = (
        f"echo pwned > {outside}; echo pwned > {tmp_path}/project/pwned.txt; "
        f"echo pwned > {tmp_path}/project/.git/objects/pwned; echo pwned > /usr/pwned; "
        "echo pwned > $HOME/../../etc/pwned; "
        "ls ~/.ssh /var/run/docker.sock > probe.txt 2>&1; git add -A; git commit -qm probe"
    )
    repo = spec_repo(tmp_path, script, plan="- [ ] one\n")
    before = tree_snapshot(repo)
    out = so("run", "-s", backend, "--yes", "--json", cwd=repo, env=claude_env)
    summary = json.loads(out.stdout.splitlines()[-1])
    assert not outside.exists()
    assert tree_snapshot(repo) == before
    assert not Path("/usr/pwned").exists() and not Path("/etc/pwned").exists()
    probe = in_sandbox(summary["id"], "cat", "probe.txt", cwd=repo)
    assert probe.count("No such file") == 2


def test_merge_conflict_restores_host(
    tmp_path: Path, claude_env: dict[str, str], backend: str
) -> None:
    script = "echo sandbox > README.md; git commit -qam 'sandbox edit'"
    repo = spec_repo(tmp_path, script, plan="- [ ] one\n")
    out = so("run", "-s", backend, "--yes", "--json", cwd=repo, env=claude_env)
    sid = json.loads(out.stdout.splitlines()[-1])["id"]
    (repo / "README.md").write_text("host\n")
    git(repo, "commit", "-qam", "host edit")
    before = {k: v for k, v in tree_snapshot(repo).items() if not k.startswith(".git/objects")}
    merged = so("merge", sid, "--yes", cwd=repo)
    assert merged.returncode == 1 and "conflicts in README.md" in merged.stderr
    after = {k: v for k, v in tree_snapshot(repo).items() if not k.startswith(".git/objects")}
    assert after == before
    assert [r["id"] for r in sandboxes(repo)] == [sid]


def test_the_api_key_stays_on_the_host(
    tmp_path: Path, claude_env: dict[str, str], model_server: ModelServer, backend: str
) -> None:
    """The real claude CLI reaches the model through so's gateway: the sandbox holds a
    placeholder, the model server sees the real key, usage lands in the iteration record."""
    tail = os.urandom(8).hex()
    real = "sk-ant-real-" + tail
    script = (  # the key is searched for in two halves: the prompt must not contain it
        "env | grep -E '^(ANTHROPIC|HTTPS?_PROXY)' | sort > seen-env.txt; "
        f'a=sk-ant-real-; grep -rl "${{a}}{tail}" / --exclude-dir=proc --exclude-dir=sys '
        "2>/dev/null > found.txt; "
        "git add -A; git commit -qm probe"
    )
    repo = spec_repo(tmp_path, script, plan="- [ ] one\n")
    env = {**claude_env, "ANTHROPIC_API_KEY": real}
    out = so("run", "-s", backend, "--yes", "--json", cwd=repo, env=env)
    summary = json.loads(out.stdout.splitlines()[-1])
    seen = in_sandbox(summary["id"], "cat", "seen-env.txt", cwd=repo)
    assert "ANTHROPIC_API_KEY=so-placeholder" in seen
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:3129/anthropic" in seen
    assert real not in seen
    assert in_sandbox(summary["id"], "cat", "found.txt", cwd=repo) == ""
    messages = [r for r in model_server.requests if r.path == "/v1/messages"]
    assert messages and {r.headers["x-api-key"] for r in messages} == {real}
    rec = summary["iterations"][0]
    assert rec["gateway_requests"] == len(messages)
    assert rec["gateway_tokens_in"] > 0 and rec["gateway_tokens_out"] > 0
    assert real not in out.stdout + out.stderr
