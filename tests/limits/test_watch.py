"""limits.watch: tree sizes and the disk watchdog."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from cgroup_fakes import (
    MiB,
)
from sono.limits.watch import DiskWatch, tree_size


def test_tree_size(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub/data").write_bytes(os.urandom(MiB))
    base = tree_size(root)
    assert MiB <= base < MiB + 256 * 1024
    with (root / "sparse").open("wb") as f:  # 1 GiB apparent, nothing allocated
        f.truncate(1024 * MiB)
    os.link(root / "sub/data", root / "hardlink")  # the same blocks again
    outside = tmp_path / "outside"
    outside.write_bytes(os.urandom(2 * MiB))
    (root / "link").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    assert tree_size(root) - base < 64 * 1024
    assert tree_size(tmp_path / "missing") == 0
    assert tree_size(outside) >= 2 * MiB


def test_disk_watch_fires_once(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    calls: list[int] = []
    fired = threading.Event()

    def on_exceed(size: int) -> None:
        calls.append(size)
        fired.set()

    with DiskWatch(ws, MiB, on_exceed, interval=0.05) as watch:
        time.sleep(0.15)
        assert not calls and watch.size is not None and watch.size < MiB
        (ws / "blob").write_bytes(os.urandom(3 * MiB))
        assert fired.wait(2.0)
        (ws / "blob2").write_bytes(os.urandom(MiB))
        time.sleep(0.2)
    assert len(calls) == 1 and calls[0] > MiB
    assert watch.exceeded


def test_disk_watch_stop_and_errors(tmp_path: Path) -> None:
    def boom(size: int) -> None:
        raise RuntimeError("callback failed")

    (tmp_path / "f").write_bytes(os.urandom(MiB))
    watch = DiskWatch(tmp_path, 1024, boom, interval=0.05).start()
    deadline = time.monotonic() + 2
    while not watch.exceeded and time.monotonic() < deadline:
        time.sleep(0.01)
    watch.stop()
    assert watch.exceeded  # the exception was logged, the thread ended cleanly
    idle = DiskWatch(tmp_path, 10 * 1024 * MiB, boom, interval=10).start()
    started = time.monotonic()
    idle.stop()
    assert time.monotonic() - started < 1  # stop() does not wait out the interval
    with pytest.raises(ValueError):
        DiskWatch(tmp_path, 0, boom)


def test_tree_size_counts_each_entry_at_least_entry_min(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    for i in range(100):
        (root / f"e{i}").touch()
    assert tree_size(root, entry_min=4096) >= 101 * 4096
    assert tree_size(root) < 100 * 4096  # empty files allocate nothing
