"""What a planning agent wrote to ``specs/`` in its sandbox, taken back to the host project.

Only regular files under ``specs/`` come back: read host-side from the sandbox's workspace
(its copy, or its overlay's upper layer: exactly what it wrote) one component at a time
with ``O_NOFOLLOW``, never through a symlink; names checked (no hidden or option-like
names, a few safe characters, bounded depth), sizes and counts bounded, UTF-8 text only.
They are written into the host's ``specs/`` through directory descriptors opened without
following links, each to a temporary name and renamed over the target (a rename replaces
a symlink or a hard link instead of writing through it). Nothing else ever comes back:
not other files, not deletions.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sono.errors import SoError
from sono.textsafe import one_line

FOLDER = "specs"
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
MAX_DEPTH = 4  # specs/a/b/c/file.md
MAX_FILES = 200
MAX_FILE_BYTES = 1 << 20
MAX_TOTAL_BYTES = 8 << 20
MAX_ENTRIES = 5000  # directory entries looked at, whatever they are
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Bounds:
    depth: int = MAX_DEPTH
    files: int = MAX_FILES
    file_bytes: int = MAX_FILE_BYTES
    total_bytes: int = MAX_TOTAL_BYTES
    entries: int = MAX_ENTRIES


@dataclass
class Harvest:
    """Files to take back (``specs/...`` → content) and what was refused, and why."""

    files: dict[str, bytes] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    _total: int = 0
    _seen: int = 0

    def refuse(self, rel: str, why: str) -> None:
        if len(self.refused) < 20:
            self.refused.append(one_line(f"{rel}: {why}", 200))


def good_name(name: str) -> bool:
    return NAME.fullmatch(name) is not None


def collect(workspace: Path, bounds: Bounds = Bounds()) -> Harvest:
    """The regular files under ``workspace/specs`` that may come back."""
    found = Harvest()
    try:
        root = os.open(workspace, _DIR)
    except OSError:
        return found
    try:
        try:
            top = os.open(FOLDER, _DIR, dir_fd=root)
        except OSError:
            if os.path.lexists(workspace / FOLDER):
                found.refuse(FOLDER, "not a directory (a symlink?)")
            return found
        with _closing(top):
            _walk(top, FOLDER, 1, found, bounds)
    finally:
        os.close(root)
    return found


def _walk(fd: int, rel: str, depth: int, found: Harvest, bounds: Bounds) -> None:
    with os.scandir(fd) as entries:
        names = []
        for entry in entries:
            found._seen += 1
            if found._seen > bounds.entries:
                found.refuse(rel, f"more than {bounds.entries} entries; the rest is ignored")
                return
            names.append(entry.name)
    for name in sorted(names):
        _visit(fd, f"{rel}/{name}", depth, found, bounds)


def _visit(fd: int, rel: str, depth: int, found: Harvest, bounds: Bounds) -> None:
    name = rel.rsplit("/", 1)[-1]
    if not good_name(name):
        found.refuse(rel, "name not allowed (letters, digits, . _ - only; no leading dot)")
        return
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        if depth >= bounds.depth:
            found.refuse(rel, f"deeper than {bounds.depth} levels")
            return
        with contextlib.suppress(OSError), _closing(os.open(name, _DIR, dir_fd=fd)) as sub:
            _walk(sub, rel, depth + 1, found, bounds)
        return
    if not stat.S_ISREG(st.st_mode):
        if not (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0):  # an overlay whiteout: deleted
            found.refuse(rel, "not a regular file (a symlink, device or fifo)")
        return
    _take(fd, rel, name, found, bounds)


def _take(fd: int, rel: str, name: str, found: Harvest, bounds: Bounds) -> None:
    if len(found.files) >= bounds.files:
        found.refuse(rel, f"more than {bounds.files} files")
        return
    try:
        leaf = os.open(name, _FILE, dir_fd=fd)
    except OSError:
        found.refuse(rel, "cannot be opened as a regular file")
        return
    with os.fdopen(leaf, "rb") as fh:
        if not stat.S_ISREG(os.fstat(leaf).st_mode):
            found.refuse(rel, "not a regular file")
            return
        data = fh.read(bounds.file_bytes + 1)
    if len(data) > bounds.file_bytes:
        found.refuse(rel, f"larger than {bounds.file_bytes} bytes")
        return
    if found._total + len(data) > bounds.total_bytes:
        found.refuse(rel, f"specs/ passed {bounds.total_bytes} bytes in all")
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        found.refuse(rel, "not UTF-8 text")
        return
    found._total += len(data)
    found.files[rel] = data


def write_back(project: Path, files: dict[str, bytes]) -> list[str]:
    """Write ``files`` (``specs/...``) into the host project; returns those that changed.
    Never follows a symlink in the project: a ``specs`` or sub-folder that is one is an
    error, a file that is one is replaced."""
    written = []
    with _closing(os.open(project, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) as root:
        for rel, data in sorted(files.items()):
            parts = rel.split("/")
            if parts[0] != FOLDER or not all(good_name(p) for p in parts[1:]) or len(parts) < 2:
                raise SoError(f"refusing to write {rel!r} outside specs/")
            with _folder(root, parts[:-1]) as fd:
                if _same(fd, parts[-1], data):
                    continue
                _replace(fd, parts[-1], data)
            written.append(rel)
    return written


@contextlib.contextmanager
def _folder(root: int, parts: list[str]) -> Iterator[int]:
    """The host folder ``parts`` under the project, created as needed, no symlinks."""
    fd = os.dup(root)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                raise SoError(
                    f"{'/'.join(parts)} in the project is not a plain folder (a symlink?): "
                    "not writing the agent's specs through it"
                ) from exc
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _same(fd: int, name: str, data: bytes) -> bool:
    try:
        leaf = os.open(name, _FILE, dir_fd=fd)
    except OSError:
        return False
    with os.fdopen(leaf, "rb") as fh:
        return stat.S_ISREG(os.fstat(leaf).st_mode) and fh.read(len(data) + 1) == data


def _replace(fd: int, name: str, data: bytes) -> None:
    tmp = f".so-{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    out = os.open(tmp, flags, 0o644, dir_fd=fd)
    try:
        with os.fdopen(out, "wb") as fh:
            fh.write(data)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
        raise


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)
