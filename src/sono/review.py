"""Review operations on a sandbox: diff, reset, merge back into the host."""

from __future__ import annotations

import fnmatch
import os
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sono import proc
from sono.errors import SoError
from sono.sandbox import Sandbox, remove_sandbox
from sono.state import STOPPED
from sono.workspace import host_git, inspect_host, require_clean

_ITER = re.compile(r"^iter-?(\d+)$")


def resolve_rev(sandbox: Sandbox, rev: str) -> str:
    """``iter-N`` / ``base`` / any commit-ish → a commit id in the sandbox repo."""
    rec = sandbox.record
    match = _ITER.match(rev)
    if rev == "base" or (match and int(match.group(1)) == 0):
        target = rec.base_ref
    elif match:
        target = rec.iter_ref(int(match.group(1)))
    else:
        target = rev
    out = sandbox.git("rev-parse", "--verify", "-q", f"{target}^{{commit}}", check=False)
    if out.returncode != 0:
        raise SoError(
            f"{rev!r} is not a commit or iteration of sandbox {rec.id}; "
            f"see `so diff {rec.id} --stat` and `so shell {rec.id} -- git log`"
        )
    return out.stdout.strip()


def diff_range(sandbox: Sandbox, iteration: int | None) -> tuple[str, str]:
    if iteration is None:
        return sandbox.record.base_ref, "HEAD"
    end = resolve_rev(sandbox, f"iter-{iteration}")
    start = (
        resolve_rev(sandbox, f"iter-{iteration - 1}")
        if iteration > 1
        else resolve_rev(sandbox, "base")
    )
    return start, end


def drift_notes(sandbox: Sandbox) -> list[str]:
    """Check a copy-on-write sandbox for host changes (fixing what can be fixed) and say
    where host edits may already be in the sandbox's commits."""
    notes = []
    drift = sandbox.fix_drift()
    if drift:
        notes.append(f"the host changed under sandbox {sandbox.record.id}: {drift.summary()}")
    if sandbox.record.drift:
        changed = set(
            sandbox.git("diff", "--name-only", sandbox.record.base_ref, "HEAD").stdout.split()
        )
        both = [p for p in sandbox.record.drift if p in changed]
        if both:
            notes.append(
                f"{', '.join(both[:5])} changed on the host after sandbox {sandbox.record.id} "
                "was created and in its commits: check that your host edits are not in the result"
            )
    return notes


def diff_text(sandbox: Sandbox, *, iteration: int | None, stat: bool, color: bool) -> str:
    start, end = diff_range(sandbox, iteration)
    args = ["diff", "--no-ext-diff", "--no-textconv", f"--color={'always' if color else 'never'}"]
    if stat:
        args.append("--stat")
    return sandbox.git(*args, start, end).stdout


def show_diff(
    sandbox: Sandbox, *, iteration: int | None, stat: bool, pager: str | None = None
) -> None:
    tty = sys.stdout.isatty()
    color = tty and not os.environ.get("NO_COLOR")
    delta = shutil.which("delta") if tty and not stat else None
    for note in drift_notes(sandbox):
        print(f"so: {note}", file=sys.stderr)
    text = diff_text(sandbox, iteration=iteration, stat=stat, color=color and delta is None)
    if not text.strip():
        print("(no changes)")
        return
    command = [delta] if delta else _pager(pager) if tty else None
    if command is None:
        sys.stdout.write(text)
        return
    with subprocess.Popen(command, stdin=subprocess.PIPE) as child:
        assert child.stdin is not None
        try:
            child.stdin.write(text.encode())
            child.stdin.close()
        except BrokenPipeError:
            pass


def _pager(configured: str | None) -> list[str]:
    import shlex

    value = configured or os.environ.get("PAGER") or "less -R"
    return shlex.split(value)


def reset(sandbox: Sandbox, rev: str) -> str:
    if sandbox.record.live_status() == "running":
        raise SoError(f"sandbox {sandbox.record.id} is running; stop it first (Ctrl-C)")
    commit = resolve_rev(sandbox, rev)
    sandbox.git("reset", "-q", "--hard", commit)
    sandbox.git("clean", "-q", "-fd")
    sandbox.save(
        status=STOPPED,
        stop_reason=f"reset to {rev}",
        commits=len(sandbox.git.commits(sandbox.record.base_ref)),
    )
    return commit


@dataclass(frozen=True)
class MergeResult:
    commits: int
    files: list[str]
    committed: bool
    branch: str
    notes: list[str] = field(default_factory=list)


def merge(sandbox: Sandbox, *, commit: bool, keep: bool) -> MergeResult:
    """Squash the sandbox branch onto the host's current branch; on conflict restore the host."""
    rec = sandbox.record
    host = inspect_host(Path(rec.project))
    require_clean(host, action="merge", hint=" before merging")
    notes = drift_notes(sandbox)
    commits = sandbox.git.commits(rec.base_ref)
    if not sandbox.git.commits(rec.host_head):
        raise SoError(f"nothing to merge: sandbox {rec.id} has no commits since it started")
    tip = _import_commits(sandbox)
    conflicts = _predict_conflicts(host.root, tip)
    if conflicts:
        raise SoError(_conflict_message(rec.id, f"conflicts in {', '.join(conflicts[:5])}"))
    saved = _merge_state(host.root)
    # A squash creates no commit, but git insists on an identity up front.
    ident = (
        []
        if host_git(host.root, "config", "user.email", check=False).stdout.strip()
        else ["-c", "user.name=so", "-c", "user.email=so@localhost"]
    )
    result = host_git(host.root, *ident, "merge", "--squash", "--no-verify", tip, check=False)
    if result.returncode != 0:
        conflicts = host_git(host.root, "diff", "--name-only", "--diff-filter=U").stdout.split()
        _restore(host.root, saved)
        what = (
            f"conflicts in {', '.join(conflicts[:5])}"
            if conflicts
            else (result.stderr.strip().splitlines() or ["git merge failed"])[-1]
        )
        raise SoError(_conflict_message(rec.id, what))
    files = host_git(host.root, "diff", "--cached", "--name-only").stdout.split()
    risky = [f for f in files if runs_code(f)]
    if risky:
        notes.append(
            f"the sandbox changed files that run code in git, hooks or CI ({', '.join(risky[:5])}"
            f"{' …' if len(risky) > 5 else ''}): read them before you commit or push"
        )
    if commit:
        message = (
            f"so: squash of sandbox {rec.id} ({len(commits)} commit(s))\n\n"
            + sandbox.git.out("log", "--format=* %s", f"{rec.host_head}..HEAD")
        )
        proc.run(["git", "-C", str(host.root), "commit", "-q", "-F", "-"], input=message)
    if not keep:
        remove_sandbox(sandbox)
    return MergeResult(len(commits), files, commit, host.branch, notes)


# Paths whose content git, hook managers or CI execute: a merge that touches them is flagged.
RUNS_CODE = (
    ".gitattributes",
    ".gitmodules",
    ".github/workflows/*",
    ".github/actions/*",
    ".gitlab-ci.yml",
    ".circleci/*",
    ".travis.yml",
    ".buildkite/*",
    "azure-pipelines.yml",
    "Jenkinsfile",
    ".husky/*",
    ".githooks/*",
    ".pre-commit-config.yaml",
    ".lefthook.yml",
    "lefthook.yml",
)


def runs_code(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name == ".gitattributes" or any(fnmatch.fnmatchcase(path, p) for p in RUNS_CODE)


def _conflict_message(sandbox_id: str, what: str) -> str:
    return (
        f"merge of {sandbox_id} failed ({what}); your repository is exactly as it was "
        f"and the sandbox is kept: resolve inside with `so shell {sandbox_id}` (or reset "
        f"it), or commit the host side differently, then merge again"
    )


def _predict_conflicts(root: Path, tip: str) -> list[str]:
    """Merge in memory (git >= 2.38) so a conflict never touches the host's files.
    Older git: [] and the caller's restore path handles conflicts."""
    probe = host_git(
        root, "merge-tree", "--write-tree", "--name-only", "--no-messages", "HEAD", tip, check=False
    )
    if probe.returncode != 1:
        return []
    return [line for line in probe.stdout.splitlines()[1:] if line.strip()] or ["unknown"]


def _import_commits(sandbox: Sandbox) -> str:
    """Move the sandbox's commits into the host object store as pure data (a bundle):
    nothing from the sandbox repo's config, hooks or attributes runs on the host."""
    rec = sandbox.record
    name = f"so-merge-{secrets.token_hex(4)}.bundle"
    # Relative to the workspace root, where every sandbox command starts.
    sandbox.git("bundle", "create", "-q", f".git/{name}", rec.branch, f"^{rec.host_head}")
    bundle = sandbox.git_dir / name
    try:
        if bundle.is_symlink() or not bundle.is_file():
            raise SoError(f"sandbox {rec.id} produced no readable bundle; try again")
        out = host_git(Path(rec.project), "bundle", "unbundle", str(bundle)).stdout
    finally:
        bundle.unlink(missing_ok=True)
    tip = out.split()[0] if out.split() else ""
    if not re.fullmatch(r"[0-9a-f]{40,64}", tip):
        raise SoError(f"could not read sandbox {rec.id}'s commits (bundle said {out.strip()!r})")
    return tip


MERGE_STATE = (
    "index",
    "ORIG_HEAD",
    "SQUASH_MSG",
    "MERGE_MSG",
    "MERGE_HEAD",
    "AUTO_MERGE",
    "MERGE_MODE",
)


def _merge_state(root: Path) -> dict[Path, bytes | None]:
    git_dir = Path(host_git(root, "rev-parse", "--absolute-git-dir").stdout.strip())
    return {
        git_dir / n: (git_dir / n).read_bytes() if (git_dir / n).is_file() else None
        for n in MERGE_STATE
    }


def _restore(root: Path, saved: dict[Path, bytes | None]) -> None:
    """Index and files back to HEAD without moving any ref (no reflog entry), and the
    merge bookkeeping files exactly as they were."""
    host_git(root, "read-tree", "--reset", "-u", "HEAD")
    for path, content in saved.items():
        if content is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(content)
