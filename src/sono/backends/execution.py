"""What every backend does the same way around one command in a sandbox: its
environment, the disk guard, and the rule that ends a run (its timeout, or a limit hit).

A backend that streams a run itself (Docker, microVM) polls :meth:`Stopper.should_stop`
and builds its result with :meth:`Stopper.result`; bwrap hands the same timeout and
guard to :func:`sono.proc.stream`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sono import proc
from sono.backends.base import SandboxSpec
from sono.layout import SANDBOX_ID_VAR, proxy_env
from sono.limits.watch import DiskWatch, Guard

PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
DISK_INTERVAL = 0.5  # seconds between the disk watch's walks (at least)


def sandbox_env(
    spec: SandboxSpec,
    env: Mapping[str, str],
    *,
    proxied: bool,
    home: str | None = None,
    user: str | None = None,
) -> dict[str, str]:
    """The environment of a command inside: the sandbox's defaults, ``spec.env``, the
    caller's ``env``, then (``proxied``) the proxy variables, which nothing overrides."""
    user = user or spec.user
    return {
        "HOME": home or spec.home,
        "USER": user,
        "LOGNAME": user,
        "PATH": PATH,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",  # noqa: S108  the sandbox's own /tmp, not the host's
        SANDBOX_ID_VAR: spec.id,
        **spec.env,
        **env,
        **(proxy_env() if proxied else {}),
    }


@contextlib.contextmanager
def disk_watch(spec: SandboxSpec, *, also: Sequence[Path] = ()) -> Iterator[DiskWatch | None]:
    """The disk limit's watchdog over the sandbox's state dir (and ``also``) while the
    block runs; ``None`` without a disk limit."""
    limits = spec.limits
    if limits is None or limits.disk is None:
        yield None
        return
    watch = DiskWatch(
        spec.writable_dir, limits.disk, lambda size: None, interval=DISK_INTERVAL, also=also
    )
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()


Check = Callable[[], str | None]


def first_of(*checks: Check | None) -> Check:
    """One check from several: the first reason any of them gives."""
    live = [c for c in checks if c is not None]

    def check() -> str | None:
        for one in live:
            why = one()
            if why is not None:
                return why
        return None

    return check


@dataclass
class Stopper:
    """When one run must end: at its ``timeout``, or once ``guard`` saw a limit hit.
    Records which, for the result."""

    timeout: float | None
    guard: Guard | None = None
    also: Check | None = None  # the caller's own stop check (see Backend.exec)
    start: float = field(default_factory=time.monotonic)
    timed_out: bool = False
    killed: str | None = None

    def should_stop(self) -> bool:
        if self.timeout is not None and time.monotonic() - self.start >= self.timeout:
            self.timed_out = True
            return True
        self.killed = first_of(self.guard.check if self.guard else None, self.also)()
        return self.killed is not None

    @property
    def stopped(self) -> bool:
        return self.timed_out or self.killed is not None

    def settle(self) -> None:
        """After a run that ended by itself: the kernel may have ended it (an OOM kill)
        before the guard was polled again."""
        if self.guard is not None and not self.stopped:
            self.killed = self.guard.check()

    def result(self, code: int | None) -> proc.Streamed:
        return proc.Streamed(
            returncode=None if self.timed_out else code,
            timed_out=self.timed_out,
            interrupted=False,
            duration_s=time.monotonic() - self.start,
            killed=self.killed,
        )
