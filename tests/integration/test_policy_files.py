"""files.ro / files.rw: extra host paths inside the sandbox, read-only or writable, on
bwrap and Docker; a missing one is an error before anything is created."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import make_repo, so

pytestmark = pytest.mark.integration

AGENT = """#!/bin/sh
cat "$RO/data.txt" > seen.txt
echo nope > "$RO/new.txt" 2>/dev/null && echo "ro writable" >> seen.txt
echo from-sandbox > "$RW/out.txt"
git add -A && git commit -qm files
"""


def test_extra_paths_are_mounted_as_configured(tmp_path: Path, backend: str) -> None:
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "data.txt").write_text("shared data\n")
    rw.chmod(0o777)  # the container user writes here
    script = tmp_path / "agent.sh"
    script.write_text(AGENT.replace("$RO", str(ro)).replace("$RW", str(rw)))
    script.chmod(0o755)
    repo = make_repo(tmp_path / "proj", {"specs/prompt.md": "go\n"})
    env = {"SO_SANDBOX": backend, "SO_FILES_RO": str(ro), "SO_FILES_RW": str(rw)}
    out = so("run", "-H", "custom", "--agent-cmd", str(script), "-i", "1", "--yes", "--json",
             cwd=repo, env=env)  # fmt: skip
    summary = json.loads(out.stdout.splitlines()[-1])
    seen = so("shell", summary["id"], "--", "cat", "seen.txt", cwd=repo, env=env).stdout
    assert seen == "shared data\n"  # readable, and the write to ro failed
    assert not (ro / "new.txt").exists()
    assert (rw / "out.txt").read_text() == "from-sandbox\n"


def test_a_missing_path_is_an_error_before_anything_starts(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"specs/prompt.md": "go\n"})
    env = {"SO_FILES_RO": str(tmp_path / "nope")}
    out = so("run", "-H", "custom", "--agent-cmd", "true", "--yes", cwd=repo, env=env)
    assert out.returncode == 1
    assert f"files.ro: {tmp_path / 'nope'} does not exist" in out.stderr
    assert not (Path(os.environ["SO_HOME"]) / "sandboxes").exists() or not any(
        (Path(os.environ["SO_HOME"]) / "sandboxes").iterdir()
    )
