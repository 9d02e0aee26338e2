"""Review operations on a sandbox: diff, reset, merge back into the host."""

from __future__ import annotations

import fnmatch
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sono import proc, squash
from sono.errors import SoError
from sono.sandbox import Sandbox, remove_sandbox
from sono.state import STOPPED
from sono.textsafe import for_terminal, one_line
from sono.vault import valid_commit_id
from sono.workspace import GIT_SAFE, host_git, inspect_host, require_clean

_ITER = re.compile(r"^iter-?(\d+)$")


def resolve_rev(sandbox: Sandbox, rev: str) -> str:
    """``iter-N`` / ``base`` → the commit so recorded for it; any other commit-ish is
    looked up inside the sandbox (the human named it) and checked to be a commit id."""
    rec = sandbox.record
    match = _ITER.match(rev)
    if rev == "base" or (match and int(match.group(1)) == 0):
        return rec.base_commit
    if match:
        return sandbox.iteration_commit(int(match.group(1)))
    out = sandbox.git("rev-parse", "--verify", "-q", f"{rev}^{{commit}}", check=False)
    commit = out.stdout.strip()
    if out.returncode != 0 or not valid_commit_id(commit):
        raise SoError(
            f"{one_line(rev, 80)!r} is not a commit or iteration of sandbox {rec.id}; "
            f"see `so diff {rec.id} --stat` and `so shell {rec.id} -- git log`"
        )
    return commit


def diff_range(sandbox: Sandbox, iteration: int | None) -> tuple[str, str]:
    """The recorded commits a review compares: base..tip, or one iteration's."""
    if iteration is None:
        return sandbox.record.base_commit, sandbox.tip
    done = sandbox.record.iterations
    if not 1 <= iteration <= max(done, 1):
        raise SoError(
            f"sandbox {sandbox.record.id} has no iteration {iteration} "
            f"(it has {done}: --iter 1..{done}); `so diff {sandbox.record.id}` for the whole run"
        )
    end = sandbox.iteration_commit(iteration)
    return sandbox.iteration_start(iteration), end


def drift_notes(sandbox: Sandbox) -> list[str]:
    """Check a copy-on-write sandbox for host changes (fixing what can be fixed) and say
    where host edits may already be in the sandbox's commits."""
    notes = []
    drift = sandbox.fix_drift()
    if drift:
        notes.append(f"the host changed under sandbox {sandbox.record.id}: {drift.summary()}")
    if sandbox.record.drift:
        changed = set(sandbox.vault.changed(sandbox.record.base_commit, sandbox.tip))
        both = [one_line(p, 80) for p in sandbox.record.drift if p in changed]
        if both:
            notes.append(
                f"{', '.join(both[:5])} changed on the host after sandbox {sandbox.record.id} "
                "was created and in its commits: check that your host edits are not in the result"
            )
    return notes


def diff_text(sandbox: Sandbox, *, iteration: int | None, stat: bool, color: bool) -> str:
    """The diff of the recorded commits, computed on the host from the vault, and safe for
    a terminal (sandbox bytes made inert; only git's own colours kept)."""
    start, end = diff_range(sandbox, iteration)
    args = [f"--color={'always' if color else 'never'}"]
    if stat:
        args.append("--stat")
    return for_terminal(sandbox.vault.diff(start, end, *args), sgr=color)


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
    if not tty:
        sys.stdout.write(text)
        return
    try:
        command = [delta] if delta else _pager(pager)
        code = proc.page(command, text)
    except SoError as exc:
        print(f"so: pager: {exc}; the diff follows", file=sys.stderr)
        sys.stdout.write(text)
        return
    if code != 0:
        print(f"so: pager {command[0]!r} exited with {code}; the diff follows", file=sys.stderr)
        sys.stdout.write(text)


def _pager(configured: str | None) -> list[str]:
    import shlex

    value = configured or os.environ.get("PAGER") or "less -R"
    try:
        argv = shlex.split(value)
    except ValueError as exc:
        raise SoError(f"cannot parse {value!r} ({exc})") from exc
    if not argv:
        raise SoError("the pager setting is empty")
    return argv


def reset(sandbox: Sandbox, rev: str) -> str:
    if sandbox.record.live_status() == "running":
        raise SoError(f"sandbox {sandbox.record.id} is running; stop it first (Ctrl-C)")
    commit = resolve_rev(sandbox, rev)
    move_to(sandbox, commit)
    sandbox.save(
        status=STOPPED,
        stop_reason=f"reset to {one_line(rev, 80)}",
        commits=sandbox.vault.count(sandbox.record.base_commit, sandbox.tip),
    )
    return commit


def move_to(sandbox: Sandbox, commit: str) -> None:
    """Hard-reset the sandbox to ``commit`` and record it as the commit under review."""
    sandbox.git("reset", "-q", "--hard", commit)
    sandbox.git("clean", "-q", "-fd")
    taken = sandbox.take()
    if taken != commit:
        raise SoError(f"sandbox {sandbox.record.id} did not move to {commit[:12]}; try again")


@dataclass(frozen=True)
class MergeResult:
    commits: int
    files: list[str]
    committed: bool
    branch: str
    notes: list[str] = field(default_factory=list)


Approve = Callable[[Sequence[str]], bool]


def merge(
    sandbox: Sandbox, *, commit: bool, keep: bool, approve: Approve | None = None
) -> MergeResult:
    """Squash exactly the reviewed change (base..tip, both recorded by so) onto the host's
    current branch, written by so from git's blobs (no filter, no hook, nothing git does
    not track overwritten or deleted). ``approve`` sees the files that run code before
    anything is written (None: such files are refused). The sandbox repo is not consulted."""
    rec = sandbox.record
    host = inspect_host(Path(rec.project))
    require_clean(host, action="merge", hint=" before merging")
    notes = drift_notes(sandbox)
    tip, base, vault = sandbox.tip, rec.base_commit, sandbox.vault
    count = vault.count(base, tip)
    if tip == base or not vault.changed(rec.host_head, tip):
        raise SoError(f"nothing to merge: sandbox {rec.id} has no changes since it started")
    _refuse_odd_names(rec.id, vault.changed(base, tip))
    squash_commit = _import_change(sandbox, tip)
    tree = _merged_tree(host.root, host.head, squash_commit, rec.id)
    if host.head == base and tree != _tree(host.root, tip):
        raise SoError(
            f"merge of {rec.id} would stage something other than the reviewed "
            "change; your repository is exactly as it was"
        )
    todo = squash.changes(host.root, _tree(host.root, host.head), tree)
    _refuse_obstacles(rec.id, host.root, todo)
    risky = _risky(host.root, todo)
    if risky:
        notes.append(
            f"the sandbox changed files that run code in git, hooks, CI, your editor, "
            f"so or your agents ({', '.join(risky[:5])}{' …' if len(risky) > 5 else ''}): "
            "read them before you commit, push or run anything"
        )
    _approved(rec.id, risky, approve)
    subjects = "".join(f"* {one_line(s)}\n" for s in vault.subjects(base, tip)[:200])
    message = f"so: squash of sandbox {rec.id} ({count} commit(s))\n\n{subjects}"
    git_dir = Path(host_git(host.root, "rev-parse", "--absolute-git-dir").stdout.strip())
    target = squash.Target(host.root, git_dir, host.head, tree)
    squash.apply(target, todo, commit_message=message if commit else None, squash_message=message)
    if not keep:
        remove_sandbox(sandbox)
    return MergeResult(count, [c.path for c in todo], commit, host.branch, notes)


def _refuse_odd_names(sandbox_id: str, shown: Sequence[str]) -> None:
    odd = [f for f in shown if for_terminal(f) != f]
    if odd:
        names = ", ".join(one_line(f, 80) for f in odd[:5])
        raise SoError(
            f"sandbox {sandbox_id} names files with control characters ({names}): a plain "
            f"`ls` would send them to your terminal; rename them inside (`so shell "
            f"{sandbox_id}`), then merge again"
        )


def _refuse_obstacles(sandbox_id: str, root: Path, todo: Sequence[squash.Change]) -> None:
    problems = squash.refusals(root, todo)
    if problems:
        raise SoError(
            f"cannot merge {sandbox_id}: it would overwrite, replace or delete what git does "
            f"not track in {root} (ignored or untracked): {'; '.join(problems[:8])}"
            f"{' …' if len(problems) > 8 else ''}. Move these out of the way (or rename the "
            f"sandbox's files with `so shell {sandbox_id}`), then merge again; nothing was "
            "changed"
        )


def _approved(sandbox_id: str, risky: Sequence[str], approve: Approve | None) -> None:
    if approve is None:
        if risky:
            raise SoError(
                f"merge of {sandbox_id} changes files that run code ({', '.join(risky[:5])}"
                f"{' …' if len(risky) > 5 else ''}): merge it with `so merge {sandbox_id}` "
                "in a terminal, which lists them and asks; nothing was changed"
            )
        return
    if not approve(risky):
        raise SoError(f"merge of {sandbox_id} cancelled; nothing was changed")


def _risky(root: Path, todo: Sequence[squash.Change]) -> list[str]:
    """The changed paths that run code or are trusted on their own, and new symlinks that
    point outside the project (shown with their target), for the terminal."""
    found = []
    for c in todo:
        if runs_code(c.path):
            found.append(one_line(c.path, 80))
        elif c.new_mode == squash.LINK:
            target = host_git(root, "cat-file", "blob", c.new_oid).stdout
            if target.startswith("/") or ".." in Path(c.path).parent.joinpath(target).parts:
                found.append(f"{one_line(c.path, 80)} -> {one_line(target, 80)}")
    return found


# The squash's parent: a throwaway commit; only the host user's own identity is recorded.
_IDENT = ("-c", "user.name=so", "-c", "user.email=so@localhost")


def _tree(root: Path, commit: str) -> str:
    return host_git(root, "rev-parse", f"{commit}^{{tree}}").stdout.strip()


# Paths whose content runs without anyone asking: git (attributes, submodules), hook
# managers, CI, direnv, editors' tasks, so's own and the agents' project config (hooks,
# MCP servers, plugins). A merge that touches them is flagged before anything happens.
RUNS_CODE = (
    ".gitattributes",
    "*/.gitattributes",
    ".gitmodules",
    ".github/*",
    ".gitlab-ci.yml",
    ".gitlab/*",
    ".circleci/*",
    ".travis.yml",
    ".buildkite/*",
    "azure-pipelines.yml",
    "jenkinsfile",
    ".husky/*",
    ".githooks/*",
    ".pre-commit-config.yaml",
    ".pre-commit-hooks.yaml",
    ".lefthook.yml",
    "lefthook.yml",
    ".lefthook/*",
    ".envrc",
    "*/.envrc",
    ".env",
    ".so/*",
    ".claude/*",
    "claude.md",
    ".mcp.json",
    ".codex/*",
    "agents.md",
    ".opencode/*",
    "opencode.json",
    "opencode.jsonc",
    ".pi/*",
    ".vscode/*",
    ".idea/*",
    ".devcontainer/*",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".pnpmfile.cjs",
    ".tool-versions",
    ".mise.toml",
    "mise.toml",
    ".python-version",
    ".nvmrc",
    "direnv.toml",
    # git-lfs reads it during checkout, fetch and push (endpoints, credentials helpers).
    ".lfsconfig",
    "*/.lfsconfig",
    "*/.gitmodules",
    # Agents' instructions and settings, nested ones too (read as trusted guidance).
    "*/agents.md",
    "*/claude.md",
    "gemini.md",
    ".gemini/*",
    ".cursor/*",
    ".cursorrules",
    ".windsurf/*",
    ".windsurfrules",
    ".clinerules",
    ".roo/*",
    ".continue/*",
    ".aider*",
    ".zed/*",
    ".amazonq/*",
    # More CI systems.
    ".drone.yml",
    "bitbucket-pipelines.yml",
    ".woodpecker.yml",
    ".woodpecker/*",
    ".forgejo/*",
    ".gitea/*",
    # Environments tools load or run on their own: dotenv files, virtualenvs, package
    # managers' install scripts and loaders, wrappers that download and run a build tool.
    "*/.env",
    ".env.*",
    ".venv/*",
    ".tox/*",
    "venv/*",
    ".direnv/*",
    "node_modules/*",
    "*/node_modules/*",
    "package.json",
    "*/package.json",
    ".pnp.cjs",
    ".pnp.loader.mjs",
    ".yarn/*",
    "*/.npmrc",
    "setup.py",
    "pip.conf",
    "uv.toml",
    ".cargo/*",
    "rust-toolchain",
    "rust-toolchain.toml",
    "gradlew",
    "gradle/wrapper/*",
    "mvnw",
    ".mvn/*",
    ".sdkmanrc",
    ".node-version",
    ".ruby-version",
    "flake.nix",
    "shell.nix",
    "devbox.json",
)


def runs_code(path: str) -> bool:
    """Whether a merged path is one that runs code on its own, at any depth (tools and
    agents read their config in whatever directory they start: ``sub/.claude/``,
    ``app/.env.local``), case-insensitively (a ``.GitAttributes`` on a case-insensitive
    disk counts too)."""
    parts = path.casefold().split("/")
    tails = ["/".join(parts[i:]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(tail, p) for tail in tails for p in RUNS_CODE)


def _conflict_message(sandbox_id: str, what: str) -> str:
    return (
        f"merge of {sandbox_id} failed ({what}); your repository is exactly as it was "
        f"and the sandbox is kept: resolve inside with `so shell {sandbox_id}` (or reset "
        f"it), or commit the host side differently, then merge again"
    )


def _merged_tree(root: Path, head: str, change: str, sandbox_id: str) -> str:
    """The merged tree, computed in memory (git >= 2.38): the host's files are untouched
    until so writes the result itself."""
    probe = host_git(
        root,
        "-c",
        "merge.renormalize=false",
        "merge-tree",
        "--write-tree",
        "--name-only",
        "--no-messages",
        head,
        change,
        check=False,
    )
    lines = probe.stdout.splitlines()
    if probe.returncode == 0 and lines and valid_commit_id(lines[0]):
        return lines[0]
    if probe.returncode == 1:
        conflicts = [one_line(c, 80) for c in lines[1:] if c.strip()] or ["unknown"]
        raise SoError(_conflict_message(sandbox_id, f"conflicts in {', '.join(conflicts[:5])}"))
    return _merged_tree_old_git(root, head, change, sandbox_id)


def _merged_tree_old_git(root: Path, head: str, change: str, sandbox_id: str) -> str:
    """Without merge-tree --write-tree: a three-way merge of whole files in a scratch
    index; a file both sides changed is a conflict (newer git merges its lines)."""
    merge_base = host_git(root, "merge-base", head, change).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="so-merge-") as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        git = ["git", *GIT_SAFE, "-C", str(root)]
        proc.run([*git, "read-tree", "-i", "-m", "--aggressive", merge_base, head, change], env=env)
        unmerged = proc.run([*git, "ls-files", "-u", "-z"], env=env).stdout
        paths = sorted({e.split("\t", 1)[1] for e in unmerged.split("\0") if "\t" in e})
        if paths:
            what = f"conflicts in {', '.join(one_line(p, 80) for p in paths[:5])}"
            raise SoError(_conflict_message(sandbox_id, what + "; git >= 2.38 merges more"))
        return proc.run([*git, "write-tree"], env=env).stdout.strip()


def _import_change(sandbox: Sandbox, tip: str) -> str:
    """Move the reviewed commit from the vault into the host's object store as pure data
    (a bundle) and return a commit with the reviewed tree whose only parent is the
    recorded base: git's merge base then comes from the host's own history, never from
    ancestry the agent wrote, so the squash applies exactly base..tip."""
    rec = sandbox.record
    vault = sandbox.vault
    vault.keep("merge", tip)
    scratch = sandbox.dir / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    bundle = scratch / f"so-merge-{secrets.token_hex(4)}.bundle"
    refs = ["refs/so/merge"]
    if rec.base_commit != rec.host_head and vault.has_commit(rec.base_commit):
        vault.keep("base", rec.base_commit)  # so's snapshot of a dirty host tree
        refs.append("refs/so/base")
    root = Path(rec.project)
    made = vault.git("bundle", "create", "-q", str(bundle), *refs, f"^{rec.host_head}", check=False)
    try:
        if made.returncode == 0:
            host_git(root, "bundle", "unbundle", str(bundle))
    finally:
        bundle.unlink(missing_ok=True)
    for needed in (tip, rec.base_commit):
        if host_git(root, "cat-file", "-t", needed, check=False).stdout.strip() != "commit":
            raise SoError(f"could not bring sandbox {rec.id}'s commits into {root}; try again")
    tree = _tree(root, tip)
    message = f"so: sandbox {rec.id} as reviewed"
    out = host_git(root, *_IDENT, "commit-tree", tree, "-p", rec.base_commit, "-m", message)
    squash = out.stdout.strip()
    if not valid_commit_id(squash):
        raise SoError(f"could not prepare sandbox {rec.id}'s change for merging")
    return squash
