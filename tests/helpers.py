"""Helpers shared by the test modules (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AGENTS_CACHE = Path(os.environ.get("SO_TEST_AGENTS_DIR", REPO / ".cache" / "agents"))
SO = str(Path(sys.executable).parent / "so")
IDENT = [
    "-c",
    "user.name=Test User",
    "-c",
    "user.email=test@example.invalid",
    "-c",
    "safe.directory=*",
]  # Docker workspaces belong to the container user


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", *IDENT, "-C", str(repo), *args], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    for name, text in (files or {"README.md": "# project\n"}).items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def so(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real `so` console script."""
    return subprocess.run(
        [SO, *args],
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin if stdin is not None else "",
    )


def in_sandbox(sandbox_id: str, *argv: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``argv`` inside the sandbox (``so shell ID -- argv``); its stripped stdout."""
    out = so("shell", sandbox_id, "--", *argv, cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (including .git) → bytes: proof a host repo is untouched."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def unique_sleep() -> str:
    """A `sleep N` command line no other process on the machine is running (to find and
    count an agent's processes with pgrep even when test runs overlap)."""
    return f"sleep {secrets.randbelow(900_000) + 100_000}"


def pids(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", pattern], check=False, capture_output=True, text=True)
    return out.stdout.split()


# A plan of three (one) items, and a <so-script> step that does one item per iteration
# (``{i}`` is the iteration) and marks the status done after the last.
PLAN3 = "# Plan\n\n- [ ] first\n- [ ] second\n- [ ] third\n"
PLAN1 = "# Plan\n\n- [ ] only\n"
DO_ITEM = r"""
n={i}
echo "item $n" > "item$n.txt"
sed -i '0,/- \[ \]/s//- [x]/' specs/implementation-plan.md
grep -q -- '- \[ \]' specs/implementation-plan.md || echo "Status: done" > specs/status.md
git add -A && git commit -q -m "item $n"
"""


def spec_repo(tmp_path: Path, script: str, plan: str) -> Path:
    """A project whose prompt carries a `<so-script>` step for the scripted model server."""
    prompt = f"Do one item of the plan.\n<so-script>{script}</so-script>\n"
    files = {
        "README.md": "# project\n",
        "specs/prompt.md": prompt,
        "specs/implementation-plan.md": plan,
        "specs/status.md": "Status: pending\n",
    }
    return make_repo(tmp_path / "project", files)
