"""A reader that stops early (``so config | head -1``) ends the command quietly: exit 0,
no traceback, no crash log — for every command, fast path and argparse's help included."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import SO


def closed_pipe_run(argv: list[str], cwd: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``so`` with stdout a pipe whose reader is already gone: its first write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [SO, *argv],
            cwd=cwd,
            stdout=write_end,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            check=False,
            env={**os.environ, "TMPDIR": str(tmp)},
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "argv",
    [["config"], ["config", "--json"], ["doctor"], ["--help"], ["list"], ["list", "--json"]],
)
def test_a_closed_pipe_is_a_quiet_exit_0(argv: list[str], repo: Path, tmp_path: Path) -> None:
    crash_dir = tmp_path / "tmp"
    crash_dir.mkdir()
    out = closed_pipe_run(argv, repo, crash_dir)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr
    assert "unexpected error" not in out.stderr
    assert list(crash_dir.glob("so-crash-*")) == []


def test_list_with_a_config_file_on_a_closed_pipe(
    repo: Path, isolated_home: Path, tmp_path: Path
) -> None:
    """A config file sends `so list` down the full path; it is quiet there too."""
    (repo / ".so").mkdir()
    (repo / ".so" / "config.toml").write_text("iterations = 2\n")
    crash_dir = tmp_path / "tmp"
    crash_dir.mkdir()
    out = closed_pipe_run(["list"], repo, crash_dir)
    assert (out.returncode, out.stderr) == (0, "")


@pytest.mark.integration
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_loop_whose_reader_left_runs_to_its_end(
    stream: str, isolated_home: Path, tmp_path: Path
) -> None:
    """`so run --json | head -1`: the run goes on to its own end and exit code (5: the
    iterations ran out), the sandbox is not marked failed — its output just goes nowhere."""
    import json

    from helpers import make_repo

    repo = make_repo(tmp_path / "proj", {"specs/prompt.md": "go\n"})
    agent = tmp_path / "agent.sh"
    agent.write_text('#!/bin/sh\ncat >/dev/null\ndate >> f\ngit add -A && git commit -qm "s"\n')
    agent.chmod(0o755)
    read_end, write_end = os.pipe()
    os.close(read_end)
    argv = [SO, "run", "-H", "custom", "--agent-cmd", str(agent), "-i", "2", "--yes", "--json"]
    other = subprocess.PIPE
    try:
        out = subprocess.run(
            argv,
            cwd=repo,
            stdout=write_end if stream == "stdout" else other,
            stderr=write_end if stream == "stderr" else other,
            stdin=subprocess.DEVNULL,
            check=False,
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert out.returncode == 5
    listed = subprocess.run([SO, "list", "--json"], capture_output=True, text=True, check=True)
    [rec] = json.loads(listed.stdout)
    assert (rec["status"], rec["iterations"], rec["commits"]) == ("stopped", 2, 2)
