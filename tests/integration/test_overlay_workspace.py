"""Copy-on-write workspaces on real bwrap and Docker: snapshot semantics against a host
that keeps changing (edit, add, delete, dependency install, commit), and the review
commands on top of the overlay."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from helpers import git, make_repo, so

pytestmark = pytest.mark.integration

# Writes what the sandbox sees into files it commits, so the test can read them back.
AGENT = """#!/bin/sh
n=$SO_ITERATION
cat src/app.py > "seen-app-$n.txt"
ls -A | grep -v '^\\.git$' | sort > "seen-ls-$n.txt"
ls node_modules | sort > "seen-deps-$n.txt"
git add -A && git commit -qm "observations $n"
"""


def agent(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "agent.sh"
    path.parent.mkdir(parents=True)
    path.write_text(AGENT)
    path.chmod(0o755)
    tmp_path.chmod(tmp_path.stat().st_mode | stat.S_IXOTH)
    return str(path)


def project(tmp_path: Path, backend: str) -> tuple[Path, dict[str, str]]:
    repo = make_repo(
        tmp_path / "proj",
        {
            ".gitignore": "node_modules/\n",
            "README.md": "# p\n",
            "src/app.py": "print('base')\n",
            "specs/prompt.md": "Look around.\n",
        },
    )
    (repo / "node_modules" / "lib").mkdir(parents=True)
    (repo / "node_modules" / "lib" / "index.js").write_text("1\n")
    env = {"SO_WORKSPACE": "overlay"}
    if backend == "docker" and os.getuid() == 0:
        # Docker's overlay needs the project owned by the container user (uid 1000 for a
        # root host); root then runs git on a repo it does not own.
        os.system(f"chown -R 1000:1000 {repo}")
        env |= {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory"}
        env |= {"GIT_CONFIG_VALUE_0": "*"}
    return repo, env


def seen(repo: Path, env: dict[str, str], sandbox_id: str, name: str) -> str:
    out = so("shell", sandbox_id, "--", "cat", name, cwd=repo, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_host_changes_never_enter_the_sandbox(tmp_path: Path, backend: str) -> None:
    repo, env = project(tmp_path, backend)
    env |= {"SO_SANDBOX": backend}
    cmd = agent(tmp_path)
    first = so("run", "-H", "custom", "--agent-cmd", cmd, "-i", "1", "--yes", cwd=repo, env=env)
    assert first.returncode in (0, 5), first.stderr
    assert "copy-on-write over" in first.stderr
    sandbox_id = json.loads(so("list", "--json", cwd=repo, env=env).stdout)[0]["id"]

    # The user keeps working on the host.
    (repo / "src" / "app.py").write_text("print('host edit')\n")
    (repo / "README.md").unlink()
    (repo / "new.txt").write_text("host file\n")
    (repo / "node_modules" / "dep").mkdir()
    (repo / "node_modules" / "dep" / "i.js").write_text("installed\n")
    (repo / "committed.txt").write_text("host commit\n")
    git(repo, "add", "committed.txt")
    git(repo, "commit", "-q", "-m", "host commit")

    again = so("continue", sandbox_id, "-i", "1", "--yes", cwd=repo, env=env)
    assert again.returncode in (0, 5), again.stderr
    out = again.stdout + again.stderr
    assert "the host changed under the sandbox" in out
    assert "restored from the base commit" in out
    assert seen(repo, env, sandbox_id, "seen-app-2.txt") == "print('base')\n"
    listing = seen(repo, env, sandbox_id, "seen-ls-2.txt").split()
    assert "README.md" in listing  # deleted on the host: the frozen lower layer keeps it
    assert "new.txt" not in listing  # added on the host: never in the lower layer
    assert "committed.txt" not in listing  # committed on the host: same
    # Installed on the host after creation: not seen either (the names are frozen).
    assert seen(repo, env, sandbox_id, "seen-deps-2.txt").split() == ["lib"]
    status = so("shell", sandbox_id, "--", "git", "status", "--porcelain", cwd=repo, env=env)
    assert status.stdout.strip() == ""

    # Review commands on top of the overlay.
    diff = so("diff", sandbox_id, "--stat", cwd=repo, env=env)
    assert diff.returncode == 0, diff.stderr
    assert "seen-app-2.txt" in diff.stdout
    assert "src/app.py" not in diff.stdout
    reset = so("reset", sandbox_id, "iter-1", "--yes", cwd=repo, env=env)
    assert reset.returncode == 0, reset.stderr
    gone = so("shell", sandbox_id, "--", "test", "-e", "seen-app-2.txt", cwd=repo, env=env)
    assert gone.returncode == 1

    # The host's own edits are its business; the merge brings only the sandbox's work.
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "host edits")
    merged = so("merge", sandbox_id, "--yes", cwd=repo, env=env)
    assert merged.returncode == 0, merged.stderr
    staged = git(repo, "diff", "--cached", "--name-only").split()
    assert sorted(staged) == ["seen-app-1.txt", "seen-deps-1.txt", "seen-ls-1.txt"]
    assert (repo / "src" / "app.py").read_text() == "print('host edit')\n"
    assert "print('base')" in (repo / "seen-app-1.txt").read_text()
