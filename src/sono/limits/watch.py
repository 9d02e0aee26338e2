"""The disk limit's watchdog (:class:`DiskWatch`, over :func:`tree_size`) and the
:class:`Guard` an agent run is polled with for any limit that was hit."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from sono.limits.model import ENTRY_MIN_BYTES

if TYPE_CHECKING:
    from sono.limits.cgroup import CgroupJail

log = logging.getLogger("sono.limits")


def tree_size(path: Path, *, entry_min: int = 0) -> int:
    """Bytes allocated under ``path`` (st_blocks * 512, so sparse files count what they
    use), each entry counted as at least ``entry_min`` bytes: symlinks not followed,
    other filesystems (mount points) neither counted nor entered, a hard-linked inode
    counted once. Entries that vanish mid-walk are skipped.

    Cost: one lstat per entry — roughly 1-3 µs each in CPython, so ~0.1-0.3 s of CPU per
    100 000 files (a big node_modules).
    """
    try:
        top = os.lstat(path)
    except OSError:
        return 0
    total = max(top.st_blocks * 512, entry_min)
    if not stat.S_ISDIR(top.st_mode):
        return total
    dev = top.st_dev
    seen: set[int] = set()
    stack = [os.fspath(path)]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != dev:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if st.st_nlink > 1 and not is_dir:
                if st.st_ino in seen:
                    continue
                seen.add(st.st_ino)
            total += max(st.st_blocks * 512, entry_min)
            if is_dir:
                stack.append(entry.path)
    return total


class DiskWatch:
    """A daemon thread that measures ``path`` (and ``also``) with :func:`tree_size` (every entry at
    least :data:`ENTRY_MIN_BYTES`, so the limit bounds inodes too) and calls
    ``on_exceed(size)`` once, the first time ``size > limit``, then stops.

    It waits at least ``interval`` seconds between walks, and at least
    ``(1 / budget - 1)`` times the last walk's duration, so on a huge tree it uses at
    most ``budget`` (20 %) of one core. The first walk starts immediately.
    """

    def __init__(
        self,
        path: Path,
        limit: int,
        on_exceed: Callable[[int], None],
        interval: float = 1.0,
        *,
        budget: float = 0.2,
        also: Sequence[Path] = (),
    ) -> None:
        if limit <= 0 or interval <= 0 or not 0 < budget <= 1:
            raise ValueError("DiskWatch needs limit > 0, interval > 0 and 0 < budget <= 1")
        self.path = path
        self.also = tuple(also)  # more writable places counted in the same budget
        self.limit = limit
        self.interval = interval
        self.budget = budget
        self._on_exceed = on_exceed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.size: int | None = None  # last measurement
        self.exceeded = False

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"so-diskwatch:{self.path}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            size = sum(tree_size(p, entry_min=ENTRY_MIN_BYTES) for p in (self.path, *self.also))
            took = time.monotonic() - began
            self.size = size
            if size > self.limit:
                self.exceeded = True
                try:
                    self._on_exceed(size)
                except Exception:
                    log.exception("DiskWatch: on_exceed failed for %s", self.path)
                return
            self._stop.wait(max(self.interval, took * (1 / self.budget - 1)))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# ---------------------------------------------------------------------------- guard


class Guard:
    """Watches one agent run for a limit being hit; :meth:`check` (polled by the caller)
    returns ``"memory"``, ``"pids"`` or ``"disk"`` once one was, so the run is killed and
    recorded as such. Counters are read relative to the start (a cgroup may be reused)."""

    def __init__(
        self,
        *,
        jail: CgroupJail | None = None,
        disk: DiskWatch | None = None,
        counters: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.jail = jail
        self.disk = disk
        self.counters = counters  # (oom kills, pids-limit hits) of a cgroup we do not own
        self._base = counters() if counters is not None else (0, 0)

    def check(self) -> str | None:
        if self.disk is not None and self.disk.exceeded:
            return "disk"
        if self.jail is not None:
            if self.jail.oom_killed():
                return "memory"
            if self.jail.pids_hit():
                return "pids"
        if self.counters is not None:
            oom, pids = self.counters()
            if oom > self._base[0]:
                return "memory"
            if pids > self._base[1]:
                return "pids"
        return None
