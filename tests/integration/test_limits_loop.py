"""Resource limits through the real CLI on bwrap and Docker: a fork bomb, a memory hog
and a disk filler are contained, the iteration is recorded as killed, and the loop goes
on (or stops, with limits.on_kill = "stop")."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from helpers import make_repo, so

pytestmark = pytest.mark.integration

SCRIPTS = {
    "pids": "i=0; while [ $i -lt 300 ]; do sleep 60 & i=$((i+1)); done; wait",
    "memory": 'python3 -c "b = bytearray(400 * 1024 * 1024); import time; time.sleep(30)"',
    "disk": "dd if=/dev/zero of=filler bs=1M count=200 2>/dev/null; sleep 30",
}
FLAGS = {"pids": ["--pids", "48"], "memory": ["--memory", "96m"], "disk": []}


def agent(tmp_path: Path, body: str) -> str:
    path = tmp_path / "bin" / "agent.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    for parent in (tmp_path / "bin", tmp_path):
        parent.chmod(parent.stat().st_mode | 0o011)  # the container user runs it
    return str(path)


def project(tmp_path: Path, backend: str) -> tuple[Path, dict[str, str]]:
    repo = make_repo(tmp_path / "proj", {"specs/prompt.md": "go\n", "README.md": "# p\n"})
    env = {"SO_SANDBOX": backend, "SO_LIMIT_DISK": "20m"}
    return repo, env


def records(sandbox_id: str) -> list[dict[str, object]]:
    base = Path(os.environ["SO_HOME"]) / "sandboxes" / sandbox_id / "iterations"
    return [json.loads((base / str(n) / "record.json").read_text()) for n in (1, 2)]


@pytest.mark.parametrize("limit", ["pids", "memory", "disk"])
def test_limit_kills_the_run_and_the_loop_goes_on(tmp_path: Path, backend: str, limit: str) -> None:
    repo, env = project(tmp_path, backend)
    if limit != "disk":
        env.pop("SO_LIMIT_DISK")
    cmd = agent(tmp_path, SCRIPTS[limit])
    start = time.monotonic()
    out = so(
        "run", "-H", "custom", "--agent-cmd", cmd, "-i", "2", "--yes", "--json",
        *FLAGS[limit], cwd=repo, env=env, timeout=240,
    )  # fmt: skip
    took = time.monotonic() - start
    summary = json.loads(out.stdout.splitlines()[-1])
    assert took < 60, f"a contained {limit} run must end at once, not at sleep's end"
    kills = [r["killed"] for r in records(summary["id"])]
    assert kills == [limit, limit], out.stderr
    assert summary["outcome"] != "error"  # on_kill = continue: both iterations ran
    assert f"the {limit} limit was hit" in out.stdout + out.stderr


def test_on_kill_stop_ends_the_loop(tmp_path: Path, backend: str) -> None:
    repo, env = project(tmp_path, backend)
    env.pop("SO_LIMIT_DISK")
    env["SO_LIMIT_ON_KILL"] = "stop"
    cmd = agent(tmp_path, SCRIPTS["pids"])
    out = so("run", "-H", "custom", "--agent-cmd", cmd, "-i", "3", "--yes", "--pids", "48",
             cwd=repo, env=env, timeout=240)  # fmt: skip
    assert out.returncode == 1
    assert "the pids limit killed the agent" in out.stderr + out.stdout


def test_the_host_stays_responsive_during_a_fork_bomb(tmp_path: Path) -> None:
    repo, env = project(tmp_path, "bwrap")
    env.pop("SO_LIMIT_DISK")
    bomb = agent(tmp_path, "bomb() { bomb | bomb & }; bomb; sleep 20")
    start = time.monotonic()
    out = so("run", "-H", "custom", "--agent-cmd", bomb, "-i", "1", "--yes", "--pids", "64",
             cwd=repo, env=env, timeout=120)  # fmt: skip
    assert time.monotonic() - start < 60, out.stderr
    probe = time.monotonic()
    assert so("list", cwd=repo).returncode == 0
    assert time.monotonic() - probe < 10
