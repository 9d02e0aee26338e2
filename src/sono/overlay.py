"""Copy-on-write workspaces: a frozen view of the project is the overlay's read-only lower
layer, the sandbox's changes land in an upper layer under ``SO_HOME``, and the sandbox's
own git directory is bound over ``.git``. No file content is copied.

Layout under ``$SO_HOME/sandboxes/<id>/``::

    lower/     the lower layer: the project's directories re-created, every file a hard
               link to the project's, minus ``.git`` and the hidden files (``exclude``)
    upper/     the overlay's upper layer: every file the agent created or changed,
               whiteouts (0/0 character devices) for what it deleted
    ovl-work/  overlayfs' private work directory
    git/       the sandbox repo's git dir (objects: see :mod:`sono.gitobjects`)
    stamp      its mtime is the snapshot instant: host changes after it are drift

Why a tree of links and not the project itself: overlayfs looks names up in its lower
layer live, so a file the user creates later (a ``.env``) would show up inside at once,
during a run too. The names of ``lower/`` are frozen at creation; only content edited in
place on the host (the same inode) shows through. :func:`scan_drift` finds those edits
(the inode's ctime moves past the stamp) and the caller restores tracked files from the
base commit and reports ignored ones. Only files in ``upper/`` are the sandbox's own.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import stat
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sono import proc

OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")
UNSAFE_PATH_CHARS = (",", ":", "\\", "\n")  # overlay mount options cannot escape these


@dataclass(frozen=True)
class Overlay:
    """Host paths of one copy-on-write workspace."""

    lower: Path  # the frozen view of the project (read-only to the sandbox)
    upper: Path
    workdir: Path
    gitdir: Path
    stamp: Path
    project: Path  # the host's working tree

    @classmethod
    def under(cls, sandbox_dir: Path, project: Path) -> Overlay:
        lower = sandbox_dir / "lower"
        if (sandbox_dir / "upper").is_dir() and not lower.is_dir():
            lower = project  # made before the frozen lower layer: the live project
        return cls(
            lower=lower,
            upper=sandbox_dir / "upper",
            workdir=sandbox_dir / "ovl-work",
            gitdir=sandbox_dir / "git",
            stamp=sandbox_dir / "stamp",
            project=project,
        )

    def require_lower(self, sandbox_id: str) -> None:
        """The project must still be there: merges and drift checks go to it."""
        if not self.project.is_dir() or not self.lower.is_dir():
            from sono.errors import SoError

            raise SoError(
                f"the project {self.project} under sandbox {sandbox_id} is gone (moved or "
                f"deleted); put it back to use the sandbox — its own changes are in "
                f"{self.upper}, its commits in {self.gitdir}"
            )

    def mount_options(self) -> str:
        return f"lowerdir={self.lower},upperdir={self.upper},workdir={self.workdir}"


def kernel_supports_overlay(proc_filesystems: Path = Path("/proc/filesystems")) -> bool:
    try:
        text = proc_filesystems.read_text()
    except OSError:
        return False
    return any(line.split()[-1:] == ["overlay"] for line in text.splitlines())


def filesystem_type(path: Path) -> str:
    out = proc.run(["stat", "-f", "-c", "%T", str(path)], check=False)
    return out.stdout.strip()


def static_obstacle(project: Path, home: Path, *, owner_uid: int) -> str | None:  # noqa: PLR0911
    """Why an overlay cannot work for ``project`` here, judged without mounting anything;
    ``None`` when nothing is in the way."""
    if not kernel_supports_overlay():
        return "the kernel has no overlay filesystem"
    for path in (project, home):
        if any(ch in str(path) for ch in UNSAFE_PATH_CHARS):
            return f"{path} contains a character overlay mount options cannot carry"
    git = project / ".git"
    if not git.is_dir() or git.is_symlink():
        return f"{git} is not a directory (a worktree or submodule checkout)"
    try:
        st = project.stat()
    except OSError as exc:
        return f"cannot stat {project}: {exc.strerror}"
    if st.st_uid != owner_uid:
        return (
            f"{project} is owned by uid {st.st_uid}, not by the sandbox's uid {owner_uid} "
            "(its files would be read-only inside)"
        )
    home.mkdir(parents=True, exist_ok=True)
    kind = filesystem_type(home)
    if kind in ("overlayfs", "overlay", "nfs", "fuseblk", "fuse"):
        return f"{home} is on {kind}, which cannot hold an overlay's upper layer"
    if home.stat().st_dev != st.st_dev:
        return (
            f"{home} and {project} are on different filesystems (the overlay's lower "
            "layer is made of hard links to the project's files)"
        )
    return None


def prepare(ov: Overlay, *, owner: tuple[int, int] | None = None) -> None:
    """Create the upper and work directories; the upper root mirrors the project root."""
    st = ov.project.stat()
    ov.upper.mkdir()
    ov.workdir.mkdir()
    ov.upper.chmod(stat.S_IMODE(st.st_mode))
    if owner is not None:
        for path in (ov.upper, ov.workdir):
            os.chown(path, *owner)


def mark_snapshot(ov: Overlay) -> int:
    """Write the stamp (before the host is read) and return its time in ns."""
    ov.stamp.write_text("")
    return ov.stamp.stat().st_mtime_ns


# ------------------------------------------------------------------ reading the merged view


def _upper_state(ov: Overlay, rel: str) -> str:  # noqa: PLR0911
    """``"file"``/``"dir"``/``"other"`` when ``rel`` exists in the upper layer,
    ``"hidden"`` when a whiteout or an opaque/non-directory ancestor hides the lower
    one, ``"lower"`` when the lower layer shows through."""
    parts = [p for p in rel.split("/") if p]
    current = ov.upper
    for i, part in enumerate(parts):
        current = current / part
        try:
            st = current.lstat()
        except FileNotFoundError:
            return "lower"
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            return "hidden"
        last = i == len(parts) - 1
        if last:
            if stat.S_ISDIR(st.st_mode):
                return "dir"
            return "file" if stat.S_ISREG(st.st_mode) else "other"
        if not stat.S_ISDIR(st.st_mode):
            return "hidden"
        if _opaque(current):
            return "hidden"
    return "dir"


def _opaque(path: Path) -> bool:
    for name in OPAQUE_XATTRS:
        with contextlib.suppress(OSError):
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
    return False


def shadowed(ov: Overlay, rel: str) -> bool:
    """True when the sandbox does not see the host's ``rel`` (it has its own, or hid it)."""
    return _upper_state(ov, rel) != "lower"


def read_file(ov: Overlay, rel: str, limit: int = 1 << 20) -> str | None:
    """Read ``rel`` as the sandbox sees it, never following a symlink anywhere on the way
    (each component opened with ``O_NOFOLLOW``: no check-then-open race)."""
    from sono.workspace import read_beneath

    state = _upper_state(ov, rel)
    if state == "hidden":
        return None
    if state == "lower" and rel.split("/", 1)[0] == ".git":
        return None
    return read_beneath(ov.upper if state == "file" else ov.lower, rel, limit)


# ------------------------------------------------------------------ drift


@dataclass
class Drift:
    """What changed on the host since the snapshot and is visible to the sandbox."""

    restore: list[str] = field(default_factory=list)  # tracked at base: edited or deleted
    hide: list[str] = field(default_factory=list)  # new, not ignored: hidden from the sandbox
    ignored: list[str] = field(default_factory=list)  # ignored files (dependencies): reported

    def __bool__(self) -> bool:
        return bool(self.restore or self.hide or self.ignored)

    def summary(self, limit: int = 3) -> str:
        parts = []
        for label, paths in (
            ("restored from the base commit", self.restore),
            ("hidden from the sandbox", self.hide),
            ("ignored, left visible", self.ignored),
        ):
            if paths:
                sample = ", ".join(paths[:limit]) + (
                    f" and {len(paths) - limit} more" if len(paths) > limit else ""
                )
                parts.append(f"{len(paths)} {label} ({sample})")
        return "; ".join(parts)


def changed_since(ov: Overlay) -> tuple[list[str], list[str]]:
    """Paths in the lower layer (outside ``.git``) whose inode changed after the stamp:
    (files and links, directories). ctime cannot be set back by a user, so nothing slips.
    In a frozen lower layer only files edited in place on the host (the inode shared with
    the project's) show up; in a live one (sandboxes made before it) any change."""
    root = str(ov.lower)
    out = proc.run(
        [
            "find",
            root,
            "-path",
            f"{root}/.git",
            "-prune",
            "-o",
            "-cnewer",
            str(ov.stamp),
            "-printf",
            "%y %P\\0",
        ],
        check=False,
    )
    files: list[str] = []
    dirs: list[str] = []
    for item in out.stdout.split("\0"):
        if len(item) < 2:
            continue
        kind, rel = item[0], item[2:]
        if rel in ("", ".git"):
            if kind == "d" and rel == "":
                dirs.append("")
            continue
        (dirs if kind == "d" else files).append(rel)
    return files, dirs


def scan_drift(ov: Overlay, *, base: str, known: Iterable[str] = ()) -> Drift:
    """Compare the host's changes since the snapshot with the base commit."""
    files, dirs = changed_since(ov)
    seen = set(known)
    files = [f for f in files if not shadowed(ov, f)]
    dirs = [d for d in dirs if d == "" or not shadowed(ov, d)]
    if not files and not dirs:
        return Drift()
    tracked = base_entries(ov, base)
    drift = Drift()
    drift.restore = _really_changed(ov, [f for f in files if f in tracked], tracked)
    for d in dirs:
        prefix = f"{d}/" if d else ""
        for rel in tracked:
            gone = rel.startswith(prefix) and not os.path.lexists(ov.lower / rel)
            if gone and not shadowed(ov, rel):
                drift.restore.append(rel)
    untracked = [f for f in files if f not in tracked]
    ignored = set(check_ignored(ov.project, untracked))
    for rel in untracked:
        (drift.ignored if rel in ignored else drift.hide).append(rel)
    drift.ignored = [r for r in drift.ignored if r not in seen]
    drift.restore = sorted(set(drift.restore))
    return drift


def base_entries(ov: Overlay, base: str) -> dict[str, str]:
    """``{path: blob id}`` of every file in the base commit.

    Read with the host repo (trusted config) borrowing the sandbox's object directory,
    never with the sandbox repo's own config."""
    env = {"GIT_ALTERNATE_OBJECT_DIRECTORIES": str(ov.gitdir / "objects")}
    out = _host_git(ov.project, "ls-tree", "-r", "-z", "--full-tree", base, env=env)
    result: dict[str, str] = {}
    for item in out.split("\0"):
        if "\t" in item:
            meta, path = item.split("\t", 1)
            result[path] = meta.split()[2]
    return result


def _really_changed(ov: Overlay, paths: Sequence[str], tracked: dict[str, str]) -> list[str]:
    """Of ``paths`` (tracked, inode changed), those whose content differs from the base."""
    regular = [p for p in paths if (ov.lower / p).is_file() and not (ov.lower / p).is_symlink()]
    changed = [p for p in paths if p not in regular]
    if regular:
        # The lower layer's file (the inode the sandbox sees), hashed by the host repo.
        listing = "".join(f"{ov.lower / p}\n" for p in regular)
        out = _host_git(ov.project, "hash-object", "--stdin-paths", stdin=listing)
        for rel, oid in zip(regular, out.split(), strict=False):
            if tracked[rel] != oid:
                changed.append(rel)
    return changed


def check_ignored(project: Path, paths: Sequence[str]) -> list[str]:
    if not paths:
        return []
    out = _host_git(
        project, "check-ignore", "--no-index", "-z", "--stdin", stdin="\0".join(paths) + "\0"
    )
    return [p for p in out.split("\0") if p]


def _host_git(
    root: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> str:
    from sono.workspace import GIT_SAFE

    result = proc.run(
        ["git", *GIT_SAFE, "-C", str(root), *args],
        check=False,
        env={**os.environ, **(env or {})},
        input=stdin,
    )
    return result.stdout


# ------------------------------------------------------------------ secrets and removal


@dataclass
class Frozen:
    """What :func:`freeze` left out or could not link."""

    matched: list[str] = field(default_factory=list)  # files matching ``exclude``
    removed: list[str] = field(default_factory=list)  # of those, the untracked: left out
    skipped: list[str] = field(default_factory=list)  # matching directories: left out
    copied: int = 0  # files that could not be hard-linked (another filesystem, not ours)


def freeze(
    project: Path,
    lower: Path,
    patterns: Sequence[str],
    tracked: Callable[[Sequence[str]], Collection[str]],
) -> Frozen:
    """Re-create ``project``'s directories under ``lower`` and hard-link every file into
    them, leaving out ``.git``, directories whose name matches ``patterns``, and files
    whose name matches unless ``tracked`` says they are in the base commit (their content
    is in the history anyway). One pass over the names: a file created meanwhile is
    either seen and judged here or not in ``lower`` at all."""
    result = Frozen()
    dirs: list[tuple[Path, os.stat_result]] = [(lower, project.stat())]
    lower.mkdir(mode=0o700)
    (lower / ".git").mkdir(mode=0o755)  # the mount point of the sandbox's git dir
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(project / rel if rel else project) as entries:
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                if path == ".git":
                    continue
                hidden = _matches(entry.name, patterns)
                if entry.is_dir(follow_symlinks=False):
                    if hidden:
                        result.skipped.append(path)
                        continue
                    (lower / path).mkdir(mode=0o700)
                    dirs.append((lower / path, entry.stat(follow_symlinks=False)))
                    pending.append(path)
                    continue
                if hidden:
                    result.matched.append(path)
                result.copied += _link(Path(entry.path), lower / path)
    keep = tracked(result.matched) if result.matched else ()
    result.removed = [p for p in result.matched if p not in keep]
    for rel in result.removed:
        (lower / rel).unlink()
    for target, st in reversed(dirs):  # children first: a read-only parent comes last
        _mirror_dir(target, st)
    return result


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def _link(src: Path, dest: Path) -> int:
    """Hard-link ``src`` (never following a link) at ``dest``; 1 when it had to be copied
    (another filesystem, or a file protected_hardlinks keeps us from linking)."""
    try:
        os.link(src, dest, follow_symlinks=False)
    except OSError:
        st = src.lstat()
        if stat.S_ISLNK(st.st_mode):
            dest.symlink_to(src.readlink())
        elif stat.S_ISREG(st.st_mode):
            shutil.copy2(src, dest, follow_symlinks=False)
        return 1  # sockets, fifos and devices are left out
    return 0


def _mirror_dir(target: Path, st: os.stat_result) -> None:
    if os.getuid() == 0:
        os.chown(target, st.st_uid, st.st_gid)
    target.chmod(stat.S_IMODE(st.st_mode))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


SETID = stat.S_ISUID | stat.S_ISGID


def strip_setid(roots: Iterable[Path]) -> list[Path]:
    """Clear the setuid and setgid bits of every regular file and directory below ``roots`` (what a
    sandbox wrote to the host), so no program the agent marked — as root on bwrap a
    setuid-root one — keeps them on a host path. A directory the agent left unreadable
    is opened (``u+rx``) to look inside. Called when no agent process is left (after
    every command in the sandbox, before review); never follows a symlink. Returns the
    files changed."""
    stripped: list[Path] = []
    for root in roots:
        if root.is_symlink() or not root.is_dir():
            continue
        todo = [str(root)]
        while todo:
            directory = todo.pop()
            for entry in _entries(directory):
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                    if _is_setid(entry) and _chmod_nofollow(Path(entry.path), 0, SETID, dirs=True):
                        stripped.append(Path(entry.path))  # setgid dirs pass the bit on
                elif (
                    entry.is_file(follow_symlinks=False)
                    and _is_setid(entry)
                    and _chmod_nofollow(Path(entry.path), 0, SETID, dirs=False)
                ):
                    stripped.append(Path(entry.path))
    return stripped


def _entries(directory: str) -> list[os.DirEntry[str]]:
    for attempt in (1, 2):
        try:
            with os.scandir(directory) as it:
                return list(it)
        except PermissionError:
            if attempt == 2 or not _chmod_nofollow(
                Path(directory), stat.S_IRUSR | stat.S_IXUSR, 0, dirs=True
            ):
                break
        except OSError:
            break
    return []


def _is_setid(entry: os.DirEntry[str]) -> bool:
    try:
        return bool(entry.stat(follow_symlinks=False).st_mode & SETID)
    except OSError:
        return False


def _chmod_nofollow(path: Path, add: int, remove: int, *, dirs: bool) -> bool:
    """Change ``path``'s mode through an ``O_PATH`` descriptor (no symlink followed, no
    name looked up twice); False when it is gone, not of the kind, or unchanged."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not (stat.S_ISDIR(st.st_mode) if dirs else stat.S_ISREG(st.st_mode)):
            return False
        mode = (stat.S_IMODE(st.st_mode) | add) & ~remove
        if mode == stat.S_IMODE(st.st_mode):
            return False
        os.chmod(f"/proc/self/fd/{fd}", mode)  # noqa: PTH101 - through the descriptor
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Delete ``path`` whatever a sandbox left in it: any depth, directories without
    permissions (overlayfs' work dirs, an agent's ``chmod 000``), symlinks and their loops
    (removed, never followed). No recursion and no long paths: the walk holds one open
    directory at a time and names entries relative to it. Should that walk fail (a tree
    changing under it, entries owned by someone else), ``chmod -R`` and ``rm -rf`` try."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink()
        return
    try:
        _remove_dir(path)
    except OSError:
        proc.run(["chmod", "-R", "u+rwx", str(path)], check=False)
        proc.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_dir(path: Path) -> None:
    top = os.open(path.parent, _DIR_FLAGS)
    try:
        fd = _open_dir(path.name, top)
    finally:
        os.close(top)
    names: list[str] = []  # the path from ``path`` down to the open directory
    pending = [_clear(fd)]  # per level: subdirectories still to remove
    idents = [_ident(fd)]
    try:
        while True:
            if pending[-1]:
                name = pending[-1].pop()
                try:
                    sub = _open_dir(name, fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # gone, or not a directory (any more)
                os.close(fd)
                fd = sub
                names.append(name)
                pending.append(_clear(fd))
                idents.append(_ident(fd))
                continue
            if not names:
                break
            name = names.pop()
            pending.pop()
            idents.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            if _ident(fd) != idents[-1]:
                raise OSError(f"{path}: the tree moved while it was being removed")
            os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    path.rmdir()


def _open_dir(name: str, parent_fd: int) -> int:
    """Open the directory ``name`` under ``parent_fd`` without following a link; one
    without permissions is given ``u+rwx`` first (through an ``O_PATH`` descriptor, so
    the mode of nothing else can be changed)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        where = os.open(name, os.O_PATH | _DIR_FLAGS, dir_fd=parent_fd)
        try:
            Path(f"/proc/self/fd/{where}").chmod(0o700)
        finally:
            os.close(where)
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def _clear(fd: int) -> list[str]:
    """Unlink everything but subdirectories in ``fd``; return the subdirectories."""
    if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
        os.fchmod(fd, 0o700)
    dirs: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                dirs.append(entry.name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    return dirs


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino
