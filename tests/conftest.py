"""Shared fixtures. Every test runs with HOME, XDG dirs and SO_HOME in a temp dir, so
nothing can touch the real home; agent CLIs are cached per session in .cache/agents."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
AGENTS_CACHE = Path(os.environ.get("SO_TEST_AGENTS_DIR", REPO / ".cache" / "agents"))
SO = str(Path(sys.executable).parent / "so")
IDENT = ["-c", "user.name=Test User", "-c", "user.email=test@example.invalid"]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    real_home = Path.home()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("SO_HOME", str(tmp_path / "so-home"))
    monkeypatch.setenv("SO_AGENTS_DIR", str(AGENTS_CACHE))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("SANDBOX", "SO_HARNESS", "SO_ITERATIONS", "SO_SANDBOX", "ANTHROPIC_API_KEY",
                "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    before = _snapshot(real_home)
    yield home
    assert _snapshot(real_home) == before, "a test wrote to the real home directory"


def _snapshot(home: Path) -> set[str]:
    watched = [home / ".config" / "so", home / ".local" / "state" / "so", home / ".claude"]
    return {str(p) for w in watched if w.exists() for p in w.rglob("*")}


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *IDENT, "-C", str(repo), *args], check=True,
                         capture_output=True, text=True)
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


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "project")


def so(*args: str, cwd: Path, env: dict[str, str] | None = None,
       timeout: float = 300, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `so` console script."""
    return subprocess.run([SO, *args], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout,
                          input=stdin if stdin is not None else "")


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (including .git) → bytes: proof a host repo is untouched."""
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}
