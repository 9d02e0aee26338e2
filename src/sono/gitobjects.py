"""The git objects a sandbox may read: exactly those reachable from its base commit.

The host's object store holds more than the history: dangling blobs (a ``git add``ed
then removed ``.env``), stashes, reflogs, other branches, whatever a fetch or a gc left
in a pack. A sandbox borrowing it whole (``alternates``) could ``git cat-file`` them
all. Instead, so keeps a store per project under ``$SO_HOME/objects/<key>/``: one
object directory per *layer*, each a single pack written by ``git pack-objects --revs``
run on the host repo (trusted config). A layer for ``tip`` holds the objects reachable
from ``tip`` and not from its parent layer's tip, which is an ancestor of ``tip``; so a
chain of layers holds exactly the objects reachable from the last tip. Sandboxes of the
same project share layers; a new base that descends from an earlier one costs only its
new objects.

Layout::

    objects/<key>/<tip>/pack/pack-*.{pack,idx}   one layer
    objects/<key>/<tip>/parent                   the parent layer's tip (absent: a root)
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from pathlib import Path

from sono import proc

MAX_CHAIN = 16  # a longer chain starts again from a full layer (fewer mounts and packs)
CANDIDATES = 8  # the most recent layers looked at as parents of a new one
PARENT = "parent"


def project_store(store_root: Path, project: Path) -> Path:
    """The layer directory of ``project`` (by its resolved path)."""
    digest = hashlib.sha256(str(project.resolve()).encode()).hexdigest()[:16]
    return store_root / f"{project.name[:24]}-{digest}"


def reachable_objects(store_root: Path, host_root: Path, base: str) -> list[Path]:
    """Object directories that together hold exactly the objects reachable from ``base``
    (a host commit), built (incrementally) when missing; newest layer first."""
    where = project_store(store_root, host_root)
    layer = where / base
    if not layer.is_dir():
        where.mkdir(parents=True, exist_ok=True)
        parent = _parent_for(where, host_root, base)
        _build(where, host_root, base, parent)
    return chain(layer)


def chain(layer: Path) -> list[Path]:
    """``layer`` and its ancestors, newest first."""
    found = [layer]
    while (layer / PARENT).is_file():
        layer = layer.parent / (layer / PARENT).read_text().strip()
        found.append(layer)
    return found


def _parent_for(where: Path, host_root: Path, base: str) -> str | None:
    """The most recent layer whose tip is an ancestor of ``base`` and whose chain can
    grow; None for a full layer."""
    layers = [p for p in where.iterdir() if p.is_dir() and not p.name.startswith(".")]
    layers.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for layer in layers[:CANDIDATES]:
        if len(chain(layer)) >= MAX_CHAIN:
            continue
        check = proc.run(
            [*_host_git(host_root), "merge-base", "--is-ancestor", layer.name, base],
            check=False,
        )
        if check.returncode == 0:
            return layer.name
    return None


def _build(where: Path, host_root: Path, base: str, parent: str | None) -> None:
    """Write the layer for ``base`` into a temporary directory, then rename it into place
    (a concurrent creation of the same layer wins or loses the rename, never mixes)."""
    tmp = where / f".tmp-{secrets.token_hex(4)}"
    (tmp / "pack").mkdir(parents=True)
    try:
        revs = f"{base}\n" + (f"^{parent}\n" if parent else "")
        proc.run(
            [
                *_host_git(host_root),
                "pack-objects",
                "--revs",
                "--delta-base-offset",
                "--window=0",  # a local cache: delta search costs creation time, not worth it
                "--quiet",
                str(tmp / "pack" / "pack"),
            ],
            input=revs,
        )
        if parent:
            (tmp / PARENT).write_text(f"{parent}\n")
        for path in (tmp, tmp / "pack"):
            path.chmod(0o755)  # read by the sandbox's user (Docker: not so's uid)
        with contextlib.suppress(OSError):  # a concurrent creation built it first
            tmp.rename(where / base)
    finally:
        if tmp.exists():
            proc.run(["rm", "-rf", str(tmp)], check=False)


def _host_git(host_root: Path) -> list[str]:
    from sono.workspace import GIT_SAFE

    return ["git", *GIT_SAFE, "-C", str(host_root)]
