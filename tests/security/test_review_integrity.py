"""What you review is what you merge: for each trick an agent can play on its own
repository (refs, replace refs, history, config, attributes, odd names), the files and the
content `so diff` shows equal what `so merge` stages — the real CLI, a hostile agent.

Each trick commits an "evil" change and tries to make the review show something else.
The judge: the patch `so diff ID` prints equals the patch `git diff --cached` shows in the
host after `so merge ID`, and a marker the agent hid is either in both or in neither.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hostile import HostileUser

from helpers import git

pytestmark = pytest.mark.integration

EVIL = "EVIL-CHANGE-MARKER"
BENIGN = "benign change"

TRICKS = {
    # Commit the evil change on the sandbox branch, then check out a decoy at the base.
    "decoy-branch": f"""
echo {EVIL} > evil.txt && git add -A && git commit -qm evil
git checkout -q -b decoy "$(git rev-parse HEAD~1)"
""",
    # Replace the evil commit by a benign twin: the sandbox's own git shows the twin.
    "replace-ref": f"""
echo {EVIL} > evil.txt && git add -A && git commit -qm evil
evil=$(git rev-parse HEAD)
git reset -q --hard HEAD~1
echo "{BENIGN}" > benign.txt && git add -A && git commit -qm benign
twin=$(git rev-parse HEAD)
git reset -q --hard "$evil"
git replace "$evil" "$twin"
""",
    # Move so's base ref in the sandbox to the tip: a naive review shows nothing.
    "moved-base-ref": f"""
echo {EVIL} > evil.txt && git add -A && git commit -qm evil
for r in $(git for-each-ref --format='%(refname)' refs/so/); do git update-ref "$r" HEAD; done
""",
    # A tip whose parent is not the base: git's merge base would come from the agent.
    "forged-ancestry": f"""
echo {EVIL} > evil.txt && echo changed > README.md && git add -A
tree=$(git write-tree)
root=$(git rev-list --max-parents=0 HEAD | tail -1)
forged=$(git commit-tree "$tree" -p "$root" -m "looks harmless")
git reset -q --hard "$forged"
""",
    # Diff drivers and textconv in the sandbox repo: the review would run/print them.
    "textconv-and-attributes": f"""
echo {EVIL} > evil.txt
echo '*.txt diff=hide' > .gitattributes
git config diff.hide.textconv 'sh -c "echo {BENIGN}"'
git config diff.external 'sh -c "echo {BENIGN}"'
git config core.pager 'sh -c "echo {BENIGN}"'
git add -A && git commit -qm "docs"
""",
    # An evil commit and then an empty/orphaned HEAD state via a symbolic ref trick.
    "detached-then-amend": f"""
echo {EVIL} > evil.txt && git add -A && git commit -qm evil
git checkout -q --detach && echo "{BENIGN}" >> README.md && git commit -qam benign
""",
}


def _patch_from_diff(text: str) -> str:
    return text.strip()


STAGED = ("git", "-C")


def _staged_patch(repo: Path) -> str:
    out = subprocess.run(
        [*STAGED, str(repo), "diff", "--cached", "--no-renames", "--no-ext-diff", "--no-textconv"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_review_equals_merge(tmp_path: Path, backend: str, trick: str) -> None:
    user = HostileUser.make(tmp_path)
    run = user.attack("set -e\n" + TRICKS[trick], backend=backend)
    assert run.returncode in (0, 5), run.stderr
    sid = user.sandbox_id()
    shown = user.so("diff", sid)
    assert shown.returncode == 0, shown.stderr
    stat = user.so("diff", sid, "--stat")
    merged = user.so("merge", sid, "--yes")
    if "(no changes)" in shown.stdout:
        # Nothing reviewed: nothing may be merged.
        assert merged.returncode != 0 and "nothing to merge" in merged.stderr
        assert _staged_patch(user.project) == ""
        assert not (user.project / "evil.txt").exists()
        return
    assert merged.returncode == 0, merged.stderr
    staged = _staged_patch(user.project)
    assert _patch_from_diff(shown.stdout) == staged
    assert (EVIL in shown.stdout) == (EVIL in staged)
    names = git(user.project, "diff", "--cached", "--name-only").split()
    for name in names:
        assert name in stat.stdout


def test_the_evil_change_is_what_is_shown_when_a_replace_ref_hides_it(
    tmp_path: Path,
) -> None:
    """Control for the replace trick: the review shows the real (evil) commit."""
    user = HostileUser.make(tmp_path)
    user.attack("set -e\n" + TRICKS["replace-ref"], backend="bwrap")
    sid = user.sandbox_id()
    shown = user.so("diff", sid).stdout
    assert EVIL in shown and BENIGN not in shown


def test_iteration_refs_in_the_sandbox_do_not_change_the_timeline(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    script = """set -e
n=$SO_ITERATION
echo "step $n" > "step$n.txt" && git add -A && git commit -qm "step $n"
if [ "$n" = 2 ]; then
  for r in $(git for-each-ref --format='%(refname)' refs/so/); do git update-ref "$r" HEAD; done
fi
"""
    user.attack(script, backend="bwrap", iterations=2)
    sid = user.sandbox_id()
    first = user.so("diff", sid, "--iter", "1").stdout
    second = user.so("diff", sid, "--iter", "2").stdout
    assert "step1.txt" in first and "step2.txt" not in first
    assert "step2.txt" in second and "step1.txt" not in second
    reset = user.so("reset", sid, "iter-1")
    assert reset.returncode == 0, reset.stderr
    assert "step2.txt" not in user.so("diff", sid, "--stat").stdout


def test_a_commit_made_after_the_run_is_not_merged_unseen(tmp_path: Path) -> None:
    """Only a shell (the human) or an iteration records a new commit: files the sandbox
    holds that were never recorded are not what merge takes."""
    user = HostileUser.make(tmp_path)
    user.attack("set -e\necho ok > ok.txt && git add -A && git commit -qm ok\n", backend="bwrap")
    sid = user.sandbox_id()
    shown = user.so("diff", sid).stdout
    assert "ok.txt" in shown
    merged = user.so("merge", sid, "--yes")
    assert merged.returncode == 0, merged.stderr
    assert _staged_patch(user.project) == shown.strip()


def test_risky_files_are_flagged_before_merge_and_commit_runs_no_hook(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    script = """set -e
mkdir -p .so .claude
printf 'pager = "sh"\\n' > .so/config.toml
printf '{}' > .claude/settings.json
printf 'x' > "$(printf 'caf\\303\\251.envrc')"
printf '*.txt filter=x\\n' > "$(printf '.Git\\101ttributes')"
git add -A && git commit -qm config
"""
    user.attack(script, backend="bwrap")
    sid = user.sandbox_id()
    marker = tmp_path / "HOOK-RAN"  # the user's own hooks: so's commit must not run them
    hooks = user.project / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for name in ("pre-commit", "commit-msg", "post-commit", "prepare-commit-msg"):
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
        hook.chmod(0o755)
    git(user.project, "config", "user.name", "Host")
    git(user.project, "config", "user.email", "host@example.invalid")
    merged = user.so("merge", sid, "--yes", "--commit")
    assert merged.returncode == 0, merged.stderr
    assert ".so/config.toml" in merged.stderr and ".claude/settings.json" in merged.stderr
    assert ".GitAttributes" in merged.stderr
    assert "\x1b" not in merged.stderr + merged.stdout
    assert not marker.exists(), "a host git hook ran during so merge --commit"
    assert git(user.project, "log", "-1", "--format=%s").startswith("so: squash")
    # Control: the same hook does run for a commit the user makes.
    git(user.project, "commit", "-q", "--allow-empty", "-m", "mine")
    assert marker.exists()


def test_file_names_with_control_characters_are_not_merged(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    user.attack(
        "set -e\nprintf x > \"$(printf 'evil\\033]0;TITLE\\007.txt')\"\n"
        "git add -A && git commit -qm odd\n",
        backend="bwrap",
    )
    sid = user.sandbox_id()
    merged = user.so("merge", sid, "--yes")
    assert merged.returncode == 1 and "control characters" in merged.stderr
    assert "\x1b" not in merged.stderr and "evil^[]0;TITLE^G.txt" in merged.stderr
    assert not list(user.project.glob("evil*")) and _staged_patch(user.project) == ""
    # Control: renamed inside, it merges.
    renamed = user.so("shell", sid, "--", "sh", "-c", "git mv evil* plain.txt && git commit -qm mv")
    assert renamed.returncode == 0, renamed.stderr
    assert user.so("merge", sid, "--yes").returncode == 0
    assert (user.project / "plain.txt").exists()
