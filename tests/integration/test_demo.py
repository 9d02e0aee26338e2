"""`so demo` — the README's main-job command — end to end, with both agents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import git, so

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("agent", "label"),
    [
        ("builtin", "the built-in scripted agent"),
        ("claude", "the real claude CLI"),
    ],
)
def test_demo_runs_a_full_loop_and_merges(
    tmp_path: Path, agent: str, label: str, claude_bin: Path
) -> None:
    out = so("demo", "--agent", agent, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"agent used: {label}" in out.stdout
    assert out.stderr.count("── iteration") == 3
    assert "=== iteration 3: 1 commit(s) ===" in out.stdout
    repo = Path(re.search(r"so demo: repo (\S+)", out.stderr).group(1))  # type: ignore[union-attr]
    staged = git(repo, "diff", "--cached", "--name-only").split()
    assert {"greet.py", "test_greet.py", "README.md", "specs/status.md"} <= set(staged)
    assert json.loads(so("list", "--json", cwd=tmp_path).stdout) == []  # merged → removed
    assert "DEMO_SECRET" not in out.stdout
    # One plan item per iteration, and the steps say so (not "step 1" three times).
    steps = re.findall(r"Running step (\d+)\.", out.stderr)
    assert steps == ["1", "2", "3"], steps
    # The scripted model costs nothing: no dollar figure anywhere, whatever the agent says.
    assert "offline: costs nothing" in out.stderr
    assert not re.search(r"\$\d", out.stdout + out.stderr), out.stderr


def test_demo_honours_the_backend_and_the_iterations(
    tmp_path: Path, backend: str, claude_bin: Path
) -> None:
    out = so("demo", "--agent", "claude", "-s", backend, "-i", "1", cwd=tmp_path, timeout=600)
    assert out.returncode == 5, out.stdout + out.stderr  # exhausted: the plan has 3 items
    assert out.stderr.count("── iteration") == 1 and "── iteration 1/1" in out.stderr
    assert re.search(rf"so demo: sandbox \S+ \({backend}\)", out.stderr), out.stderr
    assert "1 of 3 items" in out.stdout
    [rec] = json.loads(so("list", "--json", cwd=tmp_path).stdout)
    assert (rec["backend"], rec["iterations"]) == (backend, 1)


def test_builtin_demo_agent_refuses_docker_with_the_way_out(
    tmp_path: Path, docker_ready: str
) -> None:
    out = so("demo", "--agent", "builtin", "-s", "docker", cwd=tmp_path)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "-s bwrap" in lines[0] and "--agent claude" in lines[0]
    assert json.loads(so("list", "--json", cwd=tmp_path).stdout) == []
