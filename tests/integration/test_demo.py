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
