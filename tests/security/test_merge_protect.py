"""`so merge` never destroys what git does not track on the host, runs no filter driver
(git-lfs included) and no hook, lists the files that run code before anything is
written and asks — the real CLI, a hostile agent.

Each destruction case: the agent commits a path the host ignores (or has untracked); the
merge is refused with the list, and the host's bytes are unchanged; the control merges a
plain change of the same sandbox once the path is out of the way.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hostile import HostileUser, run_in_pty

from helpers import SO, git, tree_snapshot

pytestmark = pytest.mark.integration

IGNORES = ".env\n.venv/\ndata/\n"


def host_state(repo: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree_snapshot(repo).items() if not k.startswith(".git/objects/")}


# name → (host files the user has and git does not track, the agent's commit)
CASES = {
    "ignored-env": (
        {".env": "API_KEY={canary}\n"},
        "printf 'API_KEY=agent\\n' > .env && git add -f .env",
    ),
    "venv-python": (
        {".venv/bin/python": "#!/bin/sh\n# real interpreter {canary}\n"},
        "mkdir -p .venv/bin && printf '#!/bin/sh\\necho pwned\\n' > .venv/bin/python"
        " && chmod +x .venv/bin/python && git add -f .venv/bin/python",
    ),
    "ignored-dir-replaced-by-file": (
        {"data/train.csv": "{canary}\n", "data/sub/model.bin": "weights\n"},
        "rm -rf data && echo file > data && git add -f data",
    ),
    "untracked-file": (
        {"notes.txt": "my notes {canary}\n"},
        "echo agent > notes.txt && git add notes.txt",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_merge_refuses_to_destroy_host_files(tmp_path: Path, case: str) -> None:
    user = HostileUser.make(tmp_path, {".gitignore": IGNORES})
    host_files, agent = CASES[case]
    run = user.attack(
        f"set -e\n{agent}\necho ok > plain.txt && git add plain.txt\ngit commit -qm work\n",
        backend="bwrap",
    )
    assert run.returncode in (0, 5), run.stderr
    sid = user.sandbox_id()
    canary = user.canaries["$GITHUB_TOKEN"]
    for rel, text in host_files.items():
        (user.project / rel).parent.mkdir(parents=True, exist_ok=True)
        (user.project / rel).write_text(text.format(canary=canary))
    before = host_state(user.project)
    merged = user.so("merge", sid, "--yes")
    assert merged.returncode == 1, merged.stdout + merged.stderr
    assert "nothing was changed" in merged.stderr or "uncommitted changes" in merged.stderr
    first = next(iter(host_files)).split("/")[0]
    assert first in merged.stderr
    assert host_state(user.project) == before
    assert git(user.project, "diff", "--cached", "--name-only") == ""
    # Control: the user moves the file away; the same sandbox merges, plain change included.
    for rel in host_files:
        (user.project / rel).unlink()
    again = user.so("merge", sid, "--yes")
    assert again.returncode == 0, again.stderr
    assert (user.project / "plain.txt").read_text() == "ok\n"


def test_merge_refusal_on_both_backends(tmp_path: Path, backend: str) -> None:
    user = HostileUser.make(tmp_path, {".gitignore": IGNORES})
    run = user.attack(
        "set -e\nprintf 'K=agent\\n' > .env && git add -f .env && git commit -qm env\n",
        backend=backend,
    )
    assert run.returncode in (0, 5), run.stderr
    sid = user.sandbox_id()
    (user.project / ".env").write_text("K=host-value\n")
    merged = user.so("merge", sid, "--yes")
    assert merged.returncode == 1 and ".env (a file git does not track)" in merged.stderr
    assert (user.project / ".env").read_text() == "K=host-value\n"
    (user.project / ".env").unlink()  # control
    assert user.so("merge", sid, "--yes").returncode == 0
    assert (user.project / ".env").read_text() == "K=agent\n"


LFS_AGENT = """set -e
printf '* filter=lfs diff=lfs merge=lfs -text\\n' > .gitattributes
printf '[lfs]\\n\\turl = http://127.0.0.1:9/agent-endpoint\\n' > .lfsconfig
echo changed > README.md
git add -A && git commit -qm lfs
"""


@pytest.mark.parametrize("keys", [("smudge", "clean"), ("process",)])
def test_no_host_filter_runs_during_merge(tmp_path: Path, keys: tuple[str, ...]) -> None:
    """A fake git-lfs in the host's config: the merge must not start it, whatever the
    agent's `.gitattributes` and `.lfsconfig` say."""
    user = HostileUser.make(tmp_path)
    run = user.attack(LFS_AGENT, backend="bwrap")
    assert run.returncode in (0, 5), run.stderr
    sid = user.sandbox_id()
    marker = tmp_path / "LFS-RAN"
    fake = tmp_path / "git-lfs"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {marker}\ncat\n')
    fake.chmod(0o755)
    for key in keys:
        git(user.project, "config", f"filter.lfs.{key}", f"{fake} filter-{key} %f")
    git(user.project, "config", "filter.lfs.required", "true")
    git(user.project, "config", "user.name", "Host")
    git(user.project, "config", "user.email", "host@example.invalid")
    merged = user.so("merge", sid, "--yes", "--commit")
    assert merged.returncode == 0, merged.stderr
    assert not marker.exists(), marker.read_text()
    assert "so:   .lfsconfig" in merged.stderr and "so:   .gitattributes" in merged.stderr
    assert (user.project / "README.md").read_text() == "changed\n"
    # Control: the user's own git does start the fake git-lfs now.
    os.utime(user.project / "README.md", (1, 1))
    subprocess.run(["git", "-C", str(user.project), "status"], check=False, capture_output=True)
    assert marker.exists()


RISKY_AGENT = """set -e
mkdir -p .github/workflows
echo 'on: push' > .github/workflows/ci.yml
echo 'be nice' > AGENTS.md
echo plain > plain.txt
git add -A && git commit -qm risky
"""


def test_files_that_run_code_are_confirmed_before_anything_is_written(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    user.attack(RISKY_AGENT, backend="bwrap")
    sid = user.sandbox_id()
    before = host_state(user.project)
    # No terminal, no --yes: refused, with the list and what to pass.
    refused = user.so("merge", sid)
    assert refused.returncode == 1
    assert ".github/workflows/ci.yml" in refused.stderr and "AGENTS.md" in refused.stderr
    assert "--yes" in refused.stderr
    assert host_state(user.project) == before
    # A terminal: the list, then the question; "n" leaves everything as it was.
    env = {**user.env, "TERM": "xterm"}
    said_no = run_in_pty([SO, "merge", sid], env=env, cwd=user.project, keys=b"n\r")
    text = said_no.output.decode(errors="replace")
    assert said_no.returncode == 1 and "AGENTS.md" in text and "cancelled" in text
    assert text.index("AGENTS.md") < text.index("[y/N]")
    assert host_state(user.project) == before
    # --yes: the list is still printed, before the result.
    merged = user.so("merge", sid, "--yes")
    assert merged.returncode == 0, merged.stderr
    assert "so:   AGENTS.md" in merged.stderr
    assert (user.project / "plain.txt").read_text() == "plain\n"


def test_control_plain_change_merges_without_a_list(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path, {".gitignore": IGNORES})
    user.attack("set -e\necho ok > plain.txt && git add -A && git commit -qm ok\n", backend="bwrap")
    sid = user.sandbox_id()
    (user.project / ".env").write_text("K=host\n")  # ignored, untouched by this change
    merged = user.so("merge", sid, "--yes")
    assert merged.returncode == 0, merged.stderr
    assert "run code" not in merged.stderr
    assert (user.project / ".env").read_text() == "K=host\n"
    assert git(user.project, "diff", "--cached", "--name-only") == "plain.txt"


def test_a_conflict_leaves_no_trace(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    user.attack(
        "set -e\necho agent > README.md && echo new > new.txt && git add -A && git commit -qm c\n",
        backend="bwrap",
    )
    sid = user.sandbox_id()
    user.commit({"README.md": "host\n"})
    before = host_state(user.project)
    merged = user.so("merge", sid, "--yes")
    assert merged.returncode == 1 and "conflicts in README.md" in merged.stderr
    assert host_state(user.project) == before
