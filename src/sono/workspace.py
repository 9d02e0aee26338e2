"""The sandbox's own copy of the project, and git on both sides of the wall.

Design: the sandbox repo is a fresh ``git init`` on branch ``so/<id>`` at the host's HEAD,
so ``.git`` costs O(1), not O(history): objects are read through ``alternates`` from
so's per-project store of the objects reachable from the base (:mod:`sono.gitobjects`,
never the host's whole store), which the sandbox mounts read-only. The working tree (ignored
files included, secrets excluded) is copied with ``cp -a --reflink=auto``, a copy-on-write
clone where the filesystem supports it. Swapping the copy for an overlay later changes
only :func:`populate_tree`.

Trust: host-side git runs only on the host repo and on the fresh copy before any agent
has touched it. Once an agent has run, the sandbox repo's config, hooks and attributes
are the agent's; every git command on it runs inside the sandbox (:class:`SandboxGit`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sono import overlay, proc
from sono.backends.base import Backend, SandboxSpec
from sono.errors import SoError
from sono.overlay import Overlay

SANDBOX_IDENTITY = ("so sandbox", "so@sandbox.invalid")
MARK = "@@so-section@@"  # separates the outputs of batched git queries
# No hooks, no fsmonitor daemon, and never an opportunistic index rewrite on the host.
GIT_SAFE = ("--no-optional-locks", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
# so's own git in the sandbox repo, whose config is the agent's: every command is bounded in
# time (a hanging hook, filter or fsmonitor must not hang so), and runs with what could
# start a program or a long job switched off. Given as GIT_CONFIG_* variables (the same
# rank as -c) so that they reach every git of a batched script too.
GIT_TIMEOUT_S = 120.0
SANDBOX_GIT_CONFIG = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.preloadIndex", "false"),
    ("core.splitIndex", "false"),
    ("core.pager", "cat"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("submodule.recurse", "false"),
    ("status.submoduleSummary", "false"),
)
# Runs "$@" under timeout(1) (which signals the command's whole process group) with its
# output in files, so that a child it leaves behind (a filter's setsid'd daemon) cannot hold
# the exec's pipes open; when time is up, also kills everything else this user runs there,
# and exits 124.
_BOUNDED = (
    'd=$(mktemp -d) || exit 125; timeout -k 5 "$0" "$@" </dev/null >"$d/o" 2>"$d/e"; rc=$?; '
    'cat "$d/o"; cat "$d/e" >&2; rm -rf "$d"; '
    'if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then kill -9 -1 2>/dev/null; exit 124; fi; '
    'exit "$rc"'
)


def sandbox_git_env() -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(SANDBOX_GIT_CONFIG)), "GIT_OPTIONAL_LOCKS": "0"}
    env["GIT_TERMINAL_PROMPT"] = "0"
    for i, (key, value) in enumerate(SANDBOX_GIT_CONFIG):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def bounded_argv(argv: Sequence[str], timeout_s: float) -> list[str]:
    """``argv`` under :data:`_BOUNDED` with ``timeout_s`` seconds."""
    return ["sh", "-c", _BOUNDED, f"{max(timeout_s, 1.0):.1f}", *argv]


@dataclass(frozen=True)
class HostRepo:
    root: Path
    branch: str  # "" when HEAD is detached
    head: str
    dirty: tuple[str, ...]


def host_git(root: Path, *args: str, check: bool = True) -> proc.Completed:
    return proc.run(["git", *GIT_SAFE, "-C", str(root), *args], check=check)


def inspect_host(project: Path) -> HostRepo:
    top = proc.run(["git", "-C", str(project), "rev-parse", "--show-toplevel"], check=False)
    if top.returncode != 0:
        raise SoError(f"{project} is not inside a git repository; run so from your project")
    root = Path(top.stdout.strip())
    head = host_git(root, "rev-parse", "--verify", "-q", "HEAD", check=False)
    if head.returncode != 0:
        raise SoError(f"{root} has no commits yet; commit something first, then run so")
    branch = host_git(root, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
    status = host_git(root, "status", "--porcelain", "--untracked-files=all").stdout
    return HostRepo(root, branch, head.stdout.strip(), tuple(status.splitlines()))


def require_clean(host: HostRepo, *, action: str, hint: str) -> None:
    if host.dirty:
        sample = ", ".join(line[3:] for line in host.dirty[:3])
        more = f" and {len(host.dirty) - 3} more" if len(host.dirty) > 3 else ""
        raise SoError(
            f"cannot {action}: {host.root} has uncommitted changes ({sample}{more}); "
            f"commit or stash them{hint}"
        )


@contextlib.contextmanager
def removed_on_failure(path: Path) -> Iterator[Path]:
    """Yield ``path``; delete it if the block raises (including Ctrl-C)."""
    try:
        yield path
    except BaseException:
        overlay.remove_tree(path)
        raise


def create_workspace(
    host: HostRepo,
    work: Path,
    *,
    sandbox_id: str,
    exclude: Sequence[str],
    allow_dirty: bool,
    objects: Sequence[Path],
) -> str:
    """Make ``work`` the sandbox's repo on branch ``so/<id>``; return the base commit.
    ``objects``: the object directories it borrows (see :mod:`sono.gitobjects`)."""
    proc.run(["git", "init", "-q", "--template=", str(work)])
    git = _trusted(work)
    _borrow(work / ".git", host, objects)
    _branch(git, host, sandbox_id)
    git("read-tree", "HEAD")
    populate_tree(host.root, work)
    tracked = set(git("ls-files", "-z").stdout.split("\0"))
    remove_secrets(work, exclude, tracked)
    git("update-index", "-q", "--refresh", check=False)
    if allow_dirty and host.dirty:
        git("add", "-A")
        git("commit", "-q", "--no-verify", "-m", "so: snapshot of the host working tree")
    base = git("rev-parse", "HEAD").stdout.strip()
    git("update-ref", f"refs/so/{sandbox_id}/base", base)
    return base


def create_overlay_workspace(
    host: HostRepo,
    ov: Overlay,
    *,
    sandbox_id: str,
    exclude: Sequence[str],
    allow_dirty: bool,
    objects: Sequence[Path],
    owner: tuple[int, int] | None = None,
) -> str:
    """Make a copy-on-write workspace over the project; return the base commit.

    No file content is copied: the lower layer is a tree of hard links (see
    :func:`overlay.freeze`). The sandbox's git dir starts with the host's index (valid:
    the links have the host's sizes and mtimes) and borrows ``objects``."""
    overlay.prepare(ov, owner=owner)
    gitdir = ov.gitdir
    proc.run(["git", "init", "-q", "--bare", "--template=", str(gitdir)])
    git = _GitDir(gitdir, ov.lower)
    for key, value in (
        ("core.bare", "false"),
        ("core.logAllRefUpdates", "true"),
        # uids, inodes and ctimes differ through the overlay's user namespace; sizes and
        # mtimes do not, so the copied index stays valid without re-hashing every file.
        ("core.checkStat", "minimal"),
        ("core.trustCtime", "false"),
    ):
        git("config", key, value)
    _borrow(gitdir, host, objects)
    _branch(git, host, sandbox_id)
    common = _common_dir(host)
    index = common / "index"
    shared = list(common.glob("sharedindex.*"))
    if index.is_file() and not shared:
        # With its mtime: git re-reads an entry as new as its index ("racily clean"). A
        # fresh mtime made a same-size edit in the second of the last commit look clean
        # once the sandbox was made a second later: --allow-dirty snapshotted the old text.
        shutil.copy2(index, gitdir / "index")
    else:
        git("read-tree", "HEAD")

    def tracked(paths: Sequence[str]) -> set[str]:
        literal = [f":(literal){p}" for p in paths]
        return set(git.worktree("ls-files", "-z", "--", *literal).stdout.split("\0"))

    overlay.freeze(host.root, ov.lower, exclude, tracked)
    overlay.mark_snapshot(ov)  # after linking (it moves ctimes): later edits are drift
    if allow_dirty and host.dirty:
        git.worktree("add", "-A")  # from the frozen tree: the hidden files are not in it
        git.worktree("commit", "-q", "--no-verify", "-m", "so: snapshot of the host working tree")
    base = git("rev-parse", "HEAD").stdout.strip()
    git("update-ref", f"refs/so/{sandbox_id}/base", base)
    if owner is not None:
        proc.run(["chown", "-R", f"{owner[0]}:{owner[1]}", str(gitdir)])
    return base


def _common_dir(host: HostRepo) -> Path:
    common = Path(host_git(host.root, "rev-parse", "--git-common-dir").stdout.strip())
    return (host.root / common).resolve()


def _borrow(gitdir: Path, host: HostRepo, objects: Sequence[Path]) -> None:
    """Point the sandbox repo at ``objects`` (never the host's whole store); a shallow
    host's boundary comes along, or history would end in a missing parent."""
    info = gitdir / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "alternates").write_text("".join(f"{p}\n" for p in objects))
    shallow = _common_dir(host) / "shallow"
    if shallow.is_file():
        shutil.copyfile(shallow, gitdir / "shallow")


def _branch(git: Callable[..., proc.Completed], host: HostRepo, sandbox_id: str) -> None:
    branch = f"so/{sandbox_id}"
    git("update-ref", f"refs/heads/{branch}", host.head)
    git("symbolic-ref", "HEAD", f"refs/heads/{branch}")


class _GitDir:
    """Host-side git on a fresh sandbox git dir no agent has touched yet."""

    def __init__(self, gitdir: Path, worktree: Path) -> None:
        self.gitdir = gitdir
        self.tree = worktree

    def __call__(self, *args: str) -> proc.Completed:
        return proc.run(["git", *GIT_SAFE, f"--git-dir={self.gitdir}", *args])

    def worktree(self, *args: str) -> proc.Completed:
        name, email = SANDBOX_IDENTITY
        return proc.run(
            [
                "git",
                *GIT_SAFE,
                "-c",
                f"user.name={name}",
                "-c",
                f"user.email={email}",
                f"--git-dir={self.gitdir}",
                f"--work-tree={self.tree}",
                "-C",
                str(self.tree),
                *args,
            ]
        )


def _trusted(work: Path) -> _Git:
    return _Git(work)


class _Git:
    """Host-side git on a fresh copy that no agent has touched yet."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, *args: str, check: bool = True) -> proc.Completed:
        name, email = SANDBOX_IDENTITY
        return host_git(
            self.root, "-c", f"user.name={name}", "-c", f"user.email={email}", *args, check=check
        )


def populate_tree(src: Path, dest: Path) -> None:
    """Copy the working tree as the user has it (ignored files too), minus ``.git``."""
    entries = [str(p) for p in sorted(src.iterdir()) if p.name != ".git"]
    if entries:
        proc.run(["cp", "-a", "--reflink=auto", *entries, str(dest)])


def remove_secrets(work: Path, patterns: Sequence[str], tracked: set[str]) -> list[str]:
    """Delete untracked/ignored files matching the exclude list; tracked files stay
    (their content is in the history the sandbox already has)."""
    removed: list[str] = []
    for dirpath, dirnames, filenames in os.walk(work):
        if ".git" in dirnames and Path(dirpath) == work:
            dirnames.remove(".git")
        for name in filenames + [d for d in dirnames if _matches(d, patterns)]:
            if not _matches(name, patterns):
                continue
            path = Path(dirpath) / name
            rel = str(path.relative_to(work))
            if rel in tracked:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
                dirnames.remove(name)
            else:
                path.unlink()
            removed.append(rel)
    return removed


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def alternates(gitdir: Path) -> list[Path]:
    """Object directories the sandbox repo borrows from (to mount read-only)."""
    found: list[Path] = []
    queue = [gitdir / "objects"]
    while queue:
        info = queue.pop() / "info" / "alternates"
        if not info.is_file():
            continue
        for raw in info.read_text().splitlines():
            line = raw.strip()
            if line and not line.startswith("#"):
                path = (info.parent.parent / line).resolve()
                if path not in found:
                    found.append(path)
                    queue.append(path)
    return found


class SandboxGit:
    """git on the sandbox repo, executed inside the sandbox under its policy, each
    command within ``timeout_s`` (:data:`GIT_TIMEOUT_S`) and with
    :data:`SANDBOX_GIT_CONFIG`; a command that runs out of time raises
    :class:`~sono.errors.SoError`, and nothing of it is left running."""

    def __init__(
        self, backend: Backend, spec: SandboxSpec, timeout_s: float = GIT_TIMEOUT_S
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.timeout_s = timeout_s

    def within(self, seconds: float) -> SandboxGit:
        """The same, with at most ``seconds`` per command."""
        return SandboxGit(self.backend, self.spec, min(self.timeout_s, seconds))

    def __call__(self, *args: str, check: bool = True) -> proc.Completed:
        return self._run(["git", *args], check=check)

    def script(self, argv: Sequence[str], *, check: bool = True) -> proc.Completed:
        """Any command (a ``sh -c`` around git) under the same time limit and settings."""
        return self._run(argv, check=check)

    def _run(self, argv: Sequence[str], *, check: bool = True) -> proc.Completed:
        result = self.backend.run(
            spec=self.spec,
            argv=bounded_argv(argv, self.timeout_s),
            check=False,
            env=sandbox_git_env(),
        )
        result = proc.Completed(tuple(argv), result.returncode, result.stdout, result.stderr)
        if result.returncode == 124:
            what = " ".join(argv[:2]) if argv[0] == "git" else "git"
            raise SoError(
                f"{what} in sandbox {self.spec.id} did not finish within "
                f"{self.timeout_s:.0f}s and was killed (a hook, filter, fsmonitor or a huge "
                f"index in the sandbox repo?); `so shell {self.spec.id}` to look, "
                f"`so rm {self.spec.id}` to discard it"
            )
        if check and result.returncode != 0:
            raise proc.CommandError(result)
        return result

    def out(self, *args: str) -> str:
        return self(*args).stdout.strip()

    def head(self) -> str:
        return self.out("rev-parse", "HEAD")

    def dirty(self) -> list[str]:
        return self("status", "--porcelain", "--untracked-files=all").stdout.splitlines()

    def commits(self, since: str, until: str = "HEAD") -> list[str]:
        out = self.out("rev-list", "--reverse", f"{since}..{until}")
        return out.splitlines()

    def before(self, base_ref: str, limit: int = 10) -> tuple[str, list[str]]:
        """HEAD and the recent commits since ``base_ref`` (``hash subject``), in one exec."""
        out = self._sh(
            'git rev-parse HEAD && echo "$0" && git log -"$2" --format="%h %s" "$1..HEAD"',
            base_ref,
            str(limit),
        )
        head, recent = out.split(f"{MARK}\n", 1) if MARK in out else (out, "")
        return head.strip(), recent.splitlines()

    def after(
        self, iter_ref: str, since: str, base_ref: str
    ) -> tuple[str, list[str], list[str], int]:
        """Tag HEAD as ``iter_ref``; return HEAD, files changed and commits since ``since``,
        and the number of commits since ``base_ref`` — one exec instead of five."""
        out = self._sh(
            'set -e; head=$(git rev-parse HEAD); git update-ref "$1" "$head"; echo "$head"; '
            'echo "$0"; git diff --name-only "$2" "$head"; echo "$0"; '
            'git rev-list --reverse "$2..$head"; echo "$0"; git rev-list --count "$3..$head"',
            iter_ref,
            since,
            base_ref,
        )
        head, changed, commits, count = (part.strip() for part in out.split(f"{MARK}\n"))
        return head, changed.splitlines(), commits.splitlines(), int(count or 0)

    def after_if_clean(
        self, iter_ref: str, since: str, base_ref: str
    ) -> tuple[str, list[str], list[str], int] | None:
        """:meth:`after`, in the same exec as the dirty check, when the tree is clean (the
        usual end of an iteration); None, and nothing done, when it is dirty."""
        out = self._sh(
            'set -e; if [ -n "$(git status --porcelain --untracked-files=all)" ]; then '
            "echo DIRTY; exit 0; fi; "
            'head=$(git rev-parse HEAD); git update-ref "$1" "$head"; echo "$head"; '
            'echo "$0"; git diff --name-only "$2" "$head"; echo "$0"; '
            'git rev-list --reverse "$2..$head"; echo "$0"; git rev-list --count "$3..$head"',
            iter_ref,
            since,
            base_ref,
        )
        if out.strip() == "DIRTY":
            return None
        head, changed, commits, count = (part.strip() for part in out.split(f"{MARK}\n"))
        return head, changed.splitlines(), commits.splitlines(), int(count or 0)

    def _sh(self, script: str, *args: str) -> str:
        # $0 is the section marker; the arguments follow as $1, $2, …
        return self._run(["sh", "-c", script, MARK, *args]).stdout

    def commit_all(self, message: str) -> None:
        self("add", "-A")
        self("commit", "-q", "--no-verify", "-m", message)


def read_workspace_file(work: Path, rel: str, limit: int = 1 << 20) -> str | None:
    """Read a file the agent controls without following links out of the workspace."""
    return read_beneath(work, rel, limit)


def read_beneath(root: Path, rel: str, limit: int = 1 << 20) -> str | None:
    """``root/rel`` opened one component at a time with ``O_NOFOLLOW`` (no symlink
    anywhere, checked and opened in one step, so a racing agent cannot swap a link in
    between), a regular file only; None otherwise."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        os.close(fd)
        return None
    os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        return None
    with os.fdopen(leaf, "rb") as fh:
        return fh.read(limit).decode(errors="replace")
