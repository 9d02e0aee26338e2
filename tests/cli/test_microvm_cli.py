"""`-s microvm` through the real `so` CLI on a host where no microVM can boot: it fails at
once with the precise reason (one line), and doctor says the same."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import git, so
from sono.kvm import boot_support

SUPPORT = boot_support()
pytestmark = pytest.mark.skipif(
    SUPPORT.ok, reason=f"a microVM can boot here ({SUPPORT.reason}): no fail-fast path to see"
)


def specs(repo: Path) -> Path:
    (repo / "specs").mkdir()
    (repo / "specs" / "prompt.md").write_text("x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "specs")
    return repo


def test_run_fails_fast_with_the_reason_on_one_line(repo: Path) -> None:
    specs(repo)
    start = time.monotonic()
    out = so("run", "-s", "microvm", "-H", "custom", "--agent-cmd", "true", "--yes", cwd=repo)
    elapsed = time.monotonic() - start
    assert out.returncode == 1, out.stderr
    assert elapsed < 5, elapsed
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("so: error: cannot boot a microVM here: ")
    assert SUPPORT.reason in lines[0] and "-s docker or -s bwrap" in lines[0]
    assert json.loads(so("list", "--json", cwd=repo).stdout) == []  # nothing was made


def test_env_selection_fails_the_same_way(repo: Path) -> None:
    specs(repo)
    out = so(
        "run", "-H", "custom", "--agent-cmd", "true", "--yes", cwd=repo, env={"SANDBOX": "microvm"}
    )
    assert out.returncode == 1 and SUPPORT.reason in out.stderr


def test_doctor_names_the_reason(repo: Path) -> None:
    out = so("doctor", "-s", "microvm", cwd=repo)
    assert out.returncode == 1
    line = next(x for x in out.stdout.splitlines() if "backend microvm" in x)
    assert line.startswith("[FAIL] backend microvm: cannot boot a microVM here: ")
    assert SUPPORT.reason in line
