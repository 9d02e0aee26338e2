"""SO_HOME and its sandboxes: closed to other users."""

from __future__ import annotations

import stat
from pathlib import Path

from sono.home import private_dir
from sono.state import Store


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_dir_creates_and_tightens(tmp_path: Path) -> None:
    made = tmp_path / "a" / "b"
    private_dir(str(made))
    assert _mode(made) == 0o700
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "open").chmod(0o755)
    private_dir(str(tmp_path / "open"))
    assert _mode(tmp_path / "open") == 0o700


def test_new_sandbox_dirs_are_not_traversable_by_others(tmp_path: Path) -> None:
    store = Store(tmp_path / "so-home")
    made = store.make_dir("p-1")
    assert [_mode(p) for p in (store.home, store.root, made)] == [0o700] * 3
