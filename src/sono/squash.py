"""Apply a merged tree to the host's work tree and index from git's blobs, by so itself.

Not ``git merge --squash``: that checks files out through the host's filter drivers
(git-lfs reads an ``.lfsconfig`` the agent wrote), runs hooks, and overwrites or deletes
ignored files (``.env``, ``.venv/bin/python``, a whole ignored ``data/``). Here every blob
is copied out raw (``git unpack-file``: no filter, no attribute, no hook), every host path
the change would write or delete is checked first, and the work tree and index are either
both changed or both exactly as they were (a journal undone on any error or Ctrl-C).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from sono import proc
from sono.errors import SoError
from sono.textsafe import one_line
from sono.workspace import GIT_SAFE

FILE, EXEC, LINK, GITLINK = "100644", "100755", "120000", "160000"
_NO_OID = "0" * 40


@dataclass(frozen=True)
class Change:
    """One path between the host's HEAD tree and the merged tree (``git diff-tree --raw``)."""

    path: str
    old_mode: str  # "000000" when the path is new
    new_mode: str  # "000000" when the path goes away
    new_oid: str

    @property
    def removes(self) -> bool:
        return self.new_mode == "000000"

    @property
    def existed(self) -> bool:
        return self.old_mode != "000000"


def git(
    root: Path,
    *args: str,
    env: dict[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
) -> proc.Completed:
    """Host git with every filter driver the host configures switched off (git still
    checks "racily clean" index entries by running the clean filter that the index's new
    ``.gitattributes``, the agent's, names)."""
    full = {**os.environ, **env} if env else None
    argv = ["git", *GIT_SAFE, *no_filters(root), "-C", str(root), *args]
    return proc.run(argv, env=full, input=input, check=check)


def no_filters(root: Path) -> list[str]:
    """``-c`` settings that empty every configured ``filter.<driver>`` (an empty command is
    no filter to git) and make none required; drivers come only from config, which the
    sandbox cannot write."""
    out = proc.run(
        ["git", *GIT_SAFE, "-C", str(root), "config", "-z", "--get-regexp", r"^filter\."],
        check=False,
    ).stdout
    names = {
        key[len("filter.") : key.rfind(".")]
        for key, _, _ in (entry.partition("\n") for entry in out.split("\0"))
        if key.count(".") >= 2
    }
    return [
        arg
        for name in sorted(names)
        for var, value in (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false"))
        for arg in ("-c", f"filter.{name}.{var}={value}")
    ]


def changes(root: Path, old_tree: str, new_tree: str) -> list[Change]:
    out = git(root, "diff-tree", "-r", "-z", "--no-renames", "--raw", old_tree, new_tree).stdout
    fields = out.split("\0")
    found = []
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        if not meta.startswith(":"):
            continue
        old_mode, new_mode, _old_oid, new_oid, _status = meta[1:].split(" ")
        found.append(Change(path, old_mode, new_mode, new_oid))
    return found


def refusals(root: Path, todo: Sequence[Change]) -> list[str]:
    """Why the change cannot be written: odd names, submodules, and every host path it
    would overwrite, replace or delete that git does not track (ignored or untracked)."""
    problems = [p for c in todo if (p := _odd_entry(c))]
    problems += _untracked_in_the_way(root, todo)
    problems += _hidden_from_git(root, todo)
    return problems


def _odd_entry(change: Change) -> str | None:
    parts = change.path.split("/")
    bad = any(p in ("", ".", "..") or p.casefold() == ".git" for p in parts)
    if bad or "\ufffd" in change.path:
        return f"{one_line(change.path, 80)} (a name git would refuse or that is not UTF-8)"
    if GITLINK in (change.old_mode, change.new_mode):
        return f"{one_line(change.path, 80)} (a submodule: merge it by hand)"
    return None


def _untracked_in_the_way(root: Path, todo: Sequence[Change]) -> list[str]:
    gone = {c.path for c in todo if c.removes}
    found: dict[str, str] = {}
    for c in todo:
        for problem in _parents_in_the_way(root, c.path, gone):
            found.setdefault(problem[0], problem[1])
        leaf = _lstat(root / c.path)
        if leaf is None:
            continue
        if stat.S_ISDIR(leaf.st_mode):
            kept = _files_under(root, c.path, gone)
            if kept or c.existed:
                shown = ", ".join(one_line(k, 60) for k in kept[:3]) or "a directory"
                found.setdefault(
                    c.path,
                    f"{c.path}/ (a directory git does not track all of: "
                    f"{shown}{' …' if len(kept) > 3 else ''})",
                )
        elif not c.existed:
            kind = "symlink" if stat.S_ISLNK(leaf.st_mode) else "file"
            found.setdefault(c.path, f"{c.path} (a {kind} git does not track)")
    return [one_line(v, 160) for _, v in sorted(found.items())]


def _parents_in_the_way(root: Path, path: str, gone: set[str]) -> Iterator[tuple[str, str]]:
    parts = path.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        parent = "/".join(parts[:depth])
        info = _lstat(root / parent)
        if info is None or parent in gone:
            return
        if stat.S_ISLNK(info.st_mode):
            yield parent, f"{parent} (a symlink git does not track, where a directory goes)"
            return
        if not stat.S_ISDIR(info.st_mode):
            yield parent, f"{parent} (a file git does not track, where a directory goes)"
            return


def _files_under(root: Path, rel: str, gone: set[str]) -> list[str]:
    """Entries under a directory that the change does not itself remove (sorted)."""
    kept = []
    for dirpath, dirnames, filenames in os.walk(root / rel):
        base = Path(dirpath).relative_to(root).as_posix()
        kept += [f"{base}/{n}" for n in filenames if f"{base}/{n}" not in gone]
        kept += [f"{base}/{n}/" for n in dirnames if (Path(dirpath) / n).is_symlink()]
    return sorted(kept)


def _hidden_from_git(root: Path, todo: Sequence[Change]) -> list[str]:
    """Paths git is told not to look at (assume-unchanged, skip-worktree): their content
    on disk may differ from what git says, so the change must not touch them."""
    touched = {c.path for c in todo if c.existed}
    out = git(root, "ls-files", "-v", "-z").stdout
    return [
        f"{one_line(entry[2:], 80)} (git is told to ignore changes to it: "
        "`git update-index --no-assume-unchanged --no-skip-worktree`)"
        for entry in out.split("\0")
        if entry[2:] in touched and entry[:1] != "H"
    ]


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None


@dataclass(frozen=True)
class Target:
    root: Path
    git_dir: Path
    head: str
    tree: str


def apply(
    target: Target, todo: Sequence[Change], *, commit_message: str | None, squash_message: str
) -> None:
    """Write ``todo`` (HEAD tree → ``target.tree``) into the work tree and index, then
    commit it if ``commit_message``; on any failure, everything is as it was."""
    with _staging(target) as scratch:
        blobs = _unpack(target, todo, scratch)
        index = _new_index(target, todo, scratch)
        new_commit = _commit(target, commit_message) if commit_message is not None else None
        with _index_lock(target.git_dir), _interrupts_deferred() as check:
            journal = _Journal(scratch, check)
            try:
                journal.write(target.root, todo, blobs)
                journal.replace_index(index, target.git_dir / "index")
                if new_commit is not None:
                    git(
                        target.root,
                        "update-ref",
                        "-m",
                        "so merge: squash",
                        "HEAD",
                        new_commit,
                        target.head,
                    )
            except BaseException:
                journal.undo()
                raise
    if new_commit is None:
        with contextlib.suppress(OSError):  # `git commit` then offers so's message
            (target.git_dir / "SQUASH_MSG").write_text(squash_message)


@contextlib.contextmanager
def _staging(target: Target) -> Iterator[Path]:
    """A scratch directory on the work tree's file system (renames, not copies)."""
    same = target.git_dir.stat().st_dev == target.root.stat().st_dev
    where = target.git_dir if same else target.root
    scratch = Path(tempfile.mkdtemp(prefix=".so-merge-", dir=where))
    keep = False
    try:
        yield scratch
    except _UndoIncomplete:
        keep = True
        raise
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def _unpack(target: Target, todo: Sequence[Change], scratch: Path) -> dict[str, Path]:
    """Each new blob as a file in ``scratch`` with its mode, or the symlink it stands for."""
    blobs: dict[str, Path] = {}
    umask = _umask()
    # GIT_WORK_TREE too: a core.worktree setting must not move git (and the file) elsewhere.
    env = {"GIT_DIR": str(target.git_dir), "GIT_WORK_TREE": str(scratch)}
    for n, c in enumerate(c for c in todo if not c.removes):
        name = proc.run(
            ["git", *GIT_SAFE, "unpack-file", c.new_oid], cwd=scratch, env={**os.environ, **env}
        ).stdout.strip()
        raw = scratch / name
        staged = scratch / f"new-{n}"
        if c.new_mode == LINK:
            os.symlink(raw.read_bytes(), os.fsencode(staged))  # noqa: PTH211 - a bytes target
            raw.unlink()
        else:
            raw.rename(staged)
            staged.chmod((0o777 if c.new_mode == EXEC else 0o666) & ~umask)
        blobs[c.path] = staged
    return blobs


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _new_index(target: Target, todo: Sequence[Change], scratch: Path) -> Path:
    """The host index with the change's entries, in a copy: entries only (``update-index
    --index-info`` reads no work tree file and runs no filter, where ``read-tree -m`` runs
    the clean filter); unchanged entries keep their stat data."""
    index = scratch / "index"
    shutil.copyfile(target.git_dir / "index", index)
    env = {"GIT_INDEX_FILE": str(index)}
    gone = [f"0 {_NO_OID}\t{c.path}" for c in todo if c.removes or c.new_mode != c.old_mode]
    new = [f"{c.new_mode} {c.new_oid}\t{c.path}" for c in todo if not c.removes]
    entries = "".join(f"{e}\0" for e in gone + new)
    git(target.root, "update-index", "-z", "--replace", "--index-info", env=env, input=entries)
    if git(target.root, "write-tree", env=env).stdout.strip() != target.tree:
        raise SoError("the merged index does not hold the merged tree; nothing was changed")
    return index


def _commit(target: Target, message: str) -> str:
    """The squash commit (no hook, the host user's identity), not yet on any branch."""
    out = git(target.root, "commit-tree", target.tree, "-p", target.head, "-F", "-", input=message)
    return out.stdout.strip()


@contextlib.contextmanager
def _index_lock(git_dir: Path) -> Iterator[None]:
    lock = git_dir / "index.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError as exc:
        raise SoError(
            f"{lock} exists: another git command is running (or crashed; then "
            "remove the file); nothing was changed"
        ) from exc
    os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[Callable[[], None]]:
    """Ctrl-C while files are written takes effect between two steps (then undone), never
    inside one, nor during the undo."""
    hits: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        hits.append(signum)

    def check() -> None:
        if hits:
            hits.clear()
            raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGINT, note)
    except ValueError:  # not the main thread: nothing to defer
        yield lambda: None
        return
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, old)


class _UndoIncomplete(SoError):
    pass


class _Journal:
    """Each step on the work tree, recorded before the next one, so it can be undone."""

    def __init__(self, scratch: Path, check: Callable[[], None]) -> None:
        self.scratch = scratch
        self.check = check
        self.steps: list[tuple[str, Path, Path | int]] = []

    def write(self, root: Path, todo: Sequence[Change], blobs: dict[str, Path]) -> None:
        for n, c in enumerate(c for c in todo if c.existed):
            self.check()
            old = root / c.path
            if _lstat(old) is None:
                continue
            aside = self.scratch / f"old-{n}"
            _move(old, aside)
            self.steps.append(("moved", old, aside))
        for c in sorted((c for c in todo if c.removes), key=lambda c: c.path, reverse=True):
            self._prune(root, (root / c.path).parent)
        for c in sorted((c for c in todo if not c.removes), key=lambda c: c.path):
            self.check()
            dest = root / c.path
            self._parents(root, dest.parent)
            self._clear_empty_dirs(dest)
            _move(blobs[c.path], dest)
            self.steps.append(("placed", dest, 0))
        self.check()

    def _prune(self, root: Path, folder: Path) -> None:
        """Directories left empty by a removal go too (as git does)."""
        while folder != root:
            try:
                mode = folder.lstat().st_mode
                folder.rmdir()
            except OSError:
                return
            self.steps.append(("rmdir", folder, stat.S_IMODE(mode)))
            folder = folder.parent

    def _clear_empty_dirs(self, top: Path) -> None:
        """A directory (of empty directories only) where a file goes: git removes it too;
        anything in it makes rmdir fail, and the merge is undone."""
        info = _lstat(top)
        if info is None or not stat.S_ISDIR(info.st_mode):
            return
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            folder = Path(dirpath)
            mode = stat.S_IMODE(folder.lstat().st_mode)
            folder.rmdir()
            self.steps.append(("rmdir", folder, mode))

    def _parents(self, root: Path, folder: Path) -> None:
        missing = []
        while folder != root and _lstat(folder) is None:
            missing.append(folder)
            folder = folder.parent
        for made in reversed(missing):
            made.mkdir()
            self.steps.append(("mkdir", made, 0))

    def replace_index(self, new: Path, index: Path) -> None:
        saved = self.scratch / "index.orig"
        shutil.copy2(index, saved)
        new.replace(index)
        self.steps.append(("index", index, saved))

    def undo(self) -> None:
        failed = []
        for kind, path, other in reversed(self.steps):
            try:
                if kind in {"moved", "index"}:
                    assert isinstance(other, Path)
                    _move(other, path, replace=True)
                elif kind == "placed":
                    path.unlink()
                elif kind == "mkdir":
                    path.rmdir()
                elif kind == "rmdir":
                    assert isinstance(other, int)
                    path.mkdir(mode=other)
            except OSError:
                failed.append(str(path))
        if failed:
            raise _UndoIncomplete(
                f"the merge failed and could not be undone for {', '.join(failed[:5])}; "
                f"so's copies of the host's files are in {self.scratch}"
            )


def _move(src: Path, dest: Path, *, replace: bool = False) -> None:
    """Rename, or copy across file systems (a mount inside the work tree)."""
    if not replace and _lstat(dest) is not None:
        raise FileExistsError(errno.EEXIST, "exists", str(dest))
    try:
        src.replace(dest) if replace else src.rename(dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.move(src, dest)
