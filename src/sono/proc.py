"""The one subprocess gate.

Every external command goes through here: argument lists only (never a shell), each
command logged, failures carry the command, exit code and stderr, and interrupts or
timeouts escalate terminate → kill on the whole process group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sono.errors import SoError

log = logging.getLogger("sono.proc")

KILL_GRACE_S = 3.0
# Output of sandboxed commands is hostile input: one line (a 3 GB write without a newline)
# must never cost more than this much memory; the rest of it is dropped, and said so.
MAX_LINE = 64 * 1024
READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Streamed:
    """Outcome of :func:`stream`: exit code (None when killed) and why it ended."""

    returncode: int | None
    timed_out: bool
    interrupted: bool
    duration_s: float
    killed: str | None = None  # a limit that ended the run: "memory", "pids", "disk"


class CommandError(SoError):
    def __init__(self, result: Completed) -> None:
        tail = result.stderr.strip().splitlines()[-3:]
        detail = " | ".join(tail) if tail else "no output"
        super().__init__(
            f"command failed (exit {result.returncode}): {shlex.join(result.argv)}: {detail}"
        )
        self.result = result


def run(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
    timeout: float | None = None,
    executable: str | None = None,
    pass_fds: Sequence[int] = (),
) -> Completed:
    """Run to completion, capturing output as text (undecodable bytes replaced, newlines
    untouched). ``executable``: the file to run
    when ``argv[0]`` is only the name the program sees; ``pass_fds``: fds it inherits."""
    log.debug("run: %s", shlex.join(argv))
    try:
        proc = subprocess.run(
            list(argv),
            executable=executable,
            pass_fds=tuple(pass_fds),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            input=None if input is None else input.encode(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise _not_found(argv) from exc
    except subprocess.TimeoutExpired as exc:
        raise SoError(f"command timed out after {timeout}s: {shlex.join(argv)}") from exc
    # Decoded as is: no newline translation, so a "\r" from the sandbox stays a "\r" (and
    # shows as ^M on a terminal) instead of turning into a line that was never there.
    out, err = (b.decode(errors="replace") for b in (proc.stdout, proc.stderr))
    result = Completed(tuple(argv), proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise CommandError(result)
    return result


def interactive(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    executable: str | None = None,
    pass_fds: Sequence[int] = (),
    keyboard_signals: bool = True,
) -> int:
    """Run attached to the user's terminal (shell, pager, interactive agent).
    ``keyboard_signals=False``: the command starts with SIGINT and SIGQUIT ignored (a
    wrapper such as bwrap that must outlive the Ctrl-C meant for what it runs; that
    command resets them)."""
    log.debug("interactive: %s", shlex.join(argv))
    try:
        proc = subprocess.Popen(
            list(argv),
            executable=executable,
            pass_fds=tuple(pass_fds),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            preexec_fn=None if keyboard_signals else _ignore_keyboard_signals,  # noqa: PLW1509
        )
    except FileNotFoundError as exc:
        raise _not_found(argv) from exc
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C belongs to the child here (it shares our terminal); keep waiting.
            continue


def page(argv: Sequence[str], text: str) -> int:
    """Show ``text`` through a pager on the user's terminal (the text on its stdin); its
    exit code. A pager that quits before reading everything (``q`` in less) is fine.
    SoError when it cannot start."""
    log.debug("page: %s", shlex.join(argv))
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE)
    except FileNotFoundError as exc:
        raise _not_found(argv) from exc
    except OSError as exc:
        raise SoError(f"cannot run {argv[0]}: {exc.strerror}") from exc
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(text.encode())
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue  # the pager shares the terminal: Ctrl-C is its to handle


def _not_found(argv: Sequence[str]) -> SoError:
    return SoError(f"command not found: {argv[0]} (is it installed and on PATH?)")


def _ignore_keyboard_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; sweep any stragglers still in the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def stream(
    argv: Sequence[str],
    *,
    on_line: Callable[[str], None],
    stdin_text: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    stderr_to: IO[bytes] | None = None,
    stop: Callable[[], str | None] | None = None,
    executable: str | None = None,
    pass_fds: Sequence[int] = (),
) -> Streamed:
    """Run in its own process group, feeding each stdout line to ``on_line``.

    On timeout or Ctrl-C the whole group is terminated, then killed. A Ctrl-C is
    re-raised as KeyboardInterrupt after the child is gone, so callers can record
    state before exiting. ``stop`` is polled every 50 ms: a reason it returns kills the
    group at once and is reported as ``killed``.
    """
    log.debug("stream: %s", shlex.join(argv))
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            executable=executable,
            pass_fds=tuple(pass_fds),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr_to if stderr_to is not None else subprocess.STDOUT,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise _not_found(argv) from exc
    if stdin_text is not None:
        threading.Thread(target=_feed, args=(proc, stdin_text), daemon=True).start()
    reader = threading.Thread(target=_pump, args=(proc, on_line), daemon=True)
    reader.start()
    deadline = None if timeout is None else start + timeout
    timed_out = False
    killed = None
    try:
        while proc.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                timed_out = True
                kill_group(proc)
                break
            killed = stop() if stop is not None else None
            if killed:
                kill_group(proc, grace_s=0)
                break
            reader.join(timeout=0.05)
    except BaseException:  # Ctrl-C, so being terminated: the agent's group goes too
        kill_group(proc)
        reader.join(timeout=5)
        raise
    if stop is not None and not killed and not timed_out:
        killed = stop()  # the kernel may have ended it (an OOM kill) before we looked
    if not timed_out:
        # Children that outlive the leader would keep the pipe open forever.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=5)
    return Streamed(
        returncode=None if timed_out else proc.returncode,
        timed_out=timed_out,
        interrupted=False,
        duration_s=time.monotonic() - start,
        killed=killed or None,
    )


def _feed(proc: subprocess.Popen[bytes], text: str) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, OSError):
        proc.stdin.write(text.encode())
        proc.stdin.close()


def _pump(proc: subprocess.Popen[bytes], on_line: Callable[[str], None]) -> None:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    for line in read_lines(lambda size: os.read(fd, size)):
        on_line(line)


def read_lines(read: Callable[[int], bytes], max_line: int = MAX_LINE) -> Iterator[str]:
    """The lines of a byte stream (``read(n)`` returns ``b""`` at EOF), each cut to
    ``max_line`` bytes (see :class:`LineSplitter`)."""
    splitter = LineSplitter(max_line)
    while chunk := read(READ_CHUNK):
        yield from splitter.feed(chunk)
    yield from splitter.end()


class LineSplitter:
    """Splits a byte stream into text lines in O(``max_line``) memory: bytes of a line
    beyond ``max_line`` are dropped and the line ends with a marker saying how many."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._dropped = 0

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._keep(chunk, start, len(chunk) if end < 0 else end)
            if end < 0:
                return lines
            lines.append(self._take())
            start = end + 1

    def end(self) -> list[str]:
        """The unterminated last line, if any."""
        return [self._take()] if self._buf or self._dropped else []

    def _keep(self, chunk: bytes, start: int, end: int) -> None:
        room = max(0, self.max_line - len(self._buf))
        take = min(room, end - start)
        self._buf += chunk[start : start + take]
        self._dropped += end - start - take

    def _take(self) -> str:
        text = self._buf.decode(errors="replace")
        if self._dropped:
            text += f" [so: {self._dropped} more bytes of this line dropped]"
        self._buf = bytearray()
        self._dropped = 0
        return text
