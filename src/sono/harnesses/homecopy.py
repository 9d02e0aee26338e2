"""Seeding an agent's config directory into the sandbox's home: an allow-list.

A harness names the files and the customisation directories its CLI needs; nothing else
of the user's config directory goes inside (backups, caches, session state, key files a
config points to stay on the host). Files that hold endpoints or credentials are not
copied by this module at all: each harness rewrites those itself, with placeholders.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Callable
from pathlib import Path

# Names inside a copied directory that look like key material: never copied.
KEY_NAMES = ("*.key", "*.pem", "*token*", "*secret*", "*credential*", ".env*")


def is_key_material(name: str) -> bool:
    lower = name.lower()
    return any(fnmatch.fnmatchcase(lower, pattern) for pattern in KEY_NAMES)


def copy_allowed(src: Path, dest: Path, files: tuple[str, ...], dirs: tuple[str, ...]) -> None:
    """Copies from ``src`` only the regular ``files`` and the ``dirs`` trees (shared by the
    harnesses that seed an agent's config directory). Inside a tree, symlinks and
    key-looking names (:data:`KEY_NAMES`) are left out, except within ``node_modules``
    (installed packages: there names like ``js-tokens`` are code, and ``.bin`` links
    point inside the tree)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in files:
        child = src / name
        if child.is_file() and not child.is_symlink():
            shutil.copy2(child, dest / name)
    for name in dirs:
        root = src / name
        if root.is_dir() and not root.is_symlink():
            shutil.copytree(
                root, dest / name, symlinks=True, dirs_exist_ok=True, ignore=_ignore(root)
            )


def _ignore(root: Path) -> Callable[[str, list[str]], set[str]]:
    real_root = root.resolve()

    def ignore(directory: str, names: list[str]) -> set[str]:
        packages = "node_modules" in Path(directory).relative_to(root).parts
        left_out = set()
        for name in names:
            path = Path(directory, name)
            if path.is_symlink():
                inside = Path(os.path.realpath(path)).is_relative_to(real_root)
                if not (packages and inside):
                    left_out.add(name)
            elif not packages and is_key_material(name):
                left_out.add(name)
        return left_out

    return ignore
