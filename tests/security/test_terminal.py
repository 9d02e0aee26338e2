"""The agent writes to the human's terminal: every byte of it must arrive visible and inert.

A hostile agent (the ``custom`` harness) prints escape sequences — OSC 52 (clipboard), OSC 0
(window title), OSC 8 (hyperlink), SGR 8 (conceal), erase line, carriage-return overwrite,
a DEC private mode, an 8-bit CSI, a bidi override — and Rich markup, in plain lines and in
a stream-json tool call; it names a file and writes a commit subject with such sequences.
Then the real ``so`` runs on a real pseudo-terminal: ``so run`` (the live view), ``so list``
and the review TUI (``so menu``: logs, raw output, diff and its timeline, the reset picker).
Each hostile sequence sits next to its own marker, so the test can tell it from the
sequences ``so`` itself sends (its colours, Rich's cursor moves, Textual's screen modes):
none of the agent's must reach the terminal raw, each must be there in visible form, and the
control — plain agent text and so's own colours — must show.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import pty
import re
import select
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from hostile import HostileUser

from helpers import SO

pytestmark = pytest.mark.integration

CLIP = base64.b64encode(b"CLIPMARK rm -rf ~").decode()
# (what the agent prints, raw bytes that must never reach the terminal, visible form)
HOSTILE: tuple[tuple[str, bytes, str], ...] = (
    (f"\x1b]52;c;{CLIP}\x07", b"\x1b]52", f"^[]52;c;{CLIP}^G"),
    ("\x1b]0;TITLEMARK\x07", b"\x1b]0;TITLEMARK", "^[]0;TITLEMARK^G"),
    ("\x1b]8;;https://evil.example\x07OSC8MARK", b"\x1b]8;;https://evil", "^[]8;;https"),
    ("\x1b[8mCONCEALMARK\x1b[0m", b"\x1b[8m", "^[[8mCONCEALMARK"),
    ("SAFE-LOOKING\rOVERWRITEMARK", b"\rOVERWRITEMARK", "SAFE-LOOKING^MOVERWRITEMARK"),
    ("\x1b[2KERASEMARK", b"\x1b[2KERASEMARK", "^[[2KERASEMARK"),
    ("\x1b[?31337hDECMARK", b"\x1b[?31337h", "^[[?31337hDECMARK"),
    ("\x9b2JC1MARK", "\x9b".encode(), "<U+009B>2JC1MARK"),
    ("\u202eBIDIMARK", "\u202e".encode(), "<U+202E>BIDIMARK"),
)
MARKUP = "[bold red]MARKUPMARK[/] [link=https://evil.example]LINKMARK[/link]"
PLAIN = "PLAIN-CONTROL-LINE"
CAFE = "caf\u00e9.txt"


def _bash_bytes(text: str) -> str:
    """``text`` as a bash $'…' literal (every byte as \\xHH)."""
    return "$'" + "".join(f"\\x{b:02x}" for b in text.encode()) + "'"


def attack_script() -> str:
    # A pause after each line: the live view shows the last few lines, a few times a second.
    lines = [f"printf '%s\\n' {_bash_bytes(f'line {raw} end')}; sleep 0.4" for raw, _, _ in HOSTILE]
    tool = {
        "type": "assistant",
        "message": {
            "content": [
                {
                    "type": "tool_use",
                    "id": "t1",
                    "name": "Bash\x1b]0;TOOLMARK\x07",
                    "input": {"command": "ls \x1b[8mTOOLCONCEAL \x1b]52;c;VE9PTA==\x07"},
                }
            ]
        },
    }
    evil_name = "evil\x1b]52;c;RklMRQ==\x07\x9b\u202e.txt"
    body = "".join(f"{raw}\n" for raw, _, _ in HOSTILE)
    subject = "subj \x1b]0;SUBJMARK\x07 \x1b[8mSUBJHIDE \x9b2J"
    return "\n".join(
        [
            "cat > /dev/null",
            f"echo {PLAIN}; sleep 0.4",
            *lines,
            f"printf '%s\\n' {_bash_bytes(MARKUP)}",
            f"printf '%s\\n' {_bash_bytes(json.dumps(tool))}",
            f"printf '%s' {_bash_bytes(body)} > {_bash_bytes(evil_name)}",
            f"printf 'caf\\xc3\\xa9\\n' > {_bash_bytes(CAFE)}",
            "git add -A",
            f"git commit -qm {_bash_bytes(subject)}",
            "sleep 2",  # the live view redraws a few times with all of it on screen
            "exit 0",
        ]
    )


def assert_inert(out: bytes, *, visible: bool = True) -> str:
    """No hostile sequence raw in ``out``; (with ``visible``) each one shown instead."""
    for _, raw, _ in HOSTILE:
        assert raw not in out, f"{raw!r} reached the terminal"
    for raw in (b"TOOLMARK\x07", b"\x1b[8mTOOLCONCEAL", b"\x1b]0;SUBJMARK", b"\x1b[8mSUBJ"):
        assert raw not in out, f"{raw!r} reached the terminal"
    assert b"\x1b]8;" not in out  # markup never became a hyperlink
    text = out.decode(errors="replace")
    if visible:
        missing = [shown for _, _, shown in HOSTILE if shown not in text]
        assert not missing, f"not shown: {missing}\n{text[-3000:]}"
    return text


def make_user(tmp_path: Path) -> HostileUser:
    user = HostileUser.make(tmp_path)
    # The Docker SDK raises on the canary ~/.docker/config.json (its "auth" is not base64);
    # this suite is about the terminal, so that file holds a decodable canary here.
    config = user.home / ".docker" / "config.json"
    auth = base64.b64encode(b"u:" + user.canaries["~/.docker/config.json"].encode()).decode()
    config.write_text(json.dumps({"auths": {"r.example": {"auth": auth}}}))
    user.commit({"attack.sh": attack_script()}, "the agent")
    return user


def tty_env(user: HostileUser) -> dict[str, str]:
    env = {k: v for k, v in user.env.items() if k not in ("NO_COLOR", "PAGER")}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "50"}


@pytest.fixture
def attacked(tmp_path: Path, backend: str) -> tuple[HostileUser, bytes]:
    """The attack run by ``so run`` on a pty (the live view, no -q); its terminal bytes."""
    user = make_user(tmp_path)
    argv = [SO, "run", "-s", backend, "-H", "custom", "--agent-cmd", "bash /workspace/attack.sh"]
    with PtySession([*argv, "-i", "1", "--yes"], env=tty_env(user), cwd=user.project) as term:
        out = term.finish(timeout=240)
    assert term.returncode in (0, 4, 5), out[-3000:]
    return user, out


def test_live_view_shows_agent_text_inert(attacked: tuple[HostileUser, bytes]) -> None:
    _, out = attacked
    text = assert_inert(out)
    # The control: plain agent text, the markup as literal text, so's own colours.
    assert PLAIN in text
    assert "[bold red]MARKUPMARK[/]" in text and "[link=https://evil.example]LINKMARK" in text
    assert re.search(rb"\x1b\[[0-9;]*m", out), "so's own styles are gone"
    assert "^[]0;TOOLMARK^G" in text  # the tool call line, visible


def test_list_shows_nothing_raw(attacked: tuple[HostileUser, bytes]) -> None:
    user, _ = attacked
    sid = user.sandbox_id()
    events = user.so_home / "sandboxes" / sid / "iterations" / "1" / "events.jsonl"
    assert "\\u001b]52" in events.read_text()  # the attack ran and was recorded
    with PtySession([SO, "list"], env=tty_env(user), cwd=user.project) as term:
        listed = term.finish()
    assert term.returncode == 0
    assert b"\x1b" not in listed and sid.encode() in listed


def test_review_tui_shows_logs_diff_timeline_inert(
    attacked: tuple[HostileUser, bytes], tmp_path: Path
) -> None:
    user, _ = attacked
    sid = user.sandbox_id()
    with PtySession([SO, "menu"], env=tty_env(user), cwd=user.project, size=(50, 200)) as tui:
        tui.expect(sid.encode())
        tui.send(b"l")
        tui.expect(b"events")
        tui.expect(b"CONCEALMARK")
        tui.send(b"t")
        tui.expect(b"raw output")
        tui.expect(b"OVERWRITEMARK")
        tui.send(b"\x1b")
        time.sleep(0.5)
        tui.send(b"d")
        tui.expect(b"whole run")
        # The file's content in the diff, the commit subject in the timeline (either first).
        tui.expect(b"TITLEMARK", b"SUBJMARK")
        tui.send(b"\x1b")
        time.sleep(0.5)
        tui.send(b"r")
        tui.expect(b"base")
        tui.send(b"\x1b")
        time.sleep(0.5)
        tui.send(b"q")
        out = tui.finish()
    text = assert_inert(out, visible=False)
    for shown in ("^[[8mCONCEALMARK", "SAFE-LOOKING^MOVERWRITEMARK", "^[]0;SUBJMARK^G"):
        assert shown in text, shown
    assert "[bold red]MARKUPMARK[/]" in text  # markup as text, not as style


def test_step_summary_shows_file_names_visibly(tmp_path: Path, backend: str) -> None:
    user = make_user(tmp_path)
    argv = [SO, "step", "-s", backend, "-H", "custom", "--agent-cmd", "bash /workspace/attack.sh"]
    env = {**tty_env(user), "TERM": "dumb"}  # the plain reporter and the numbered menu
    with PtySession([*argv, "-i", "2"], env=env, cwd=user.project) as term:
        term.expect(b"[s]top?", timeout=120)
        term.send(b"s\n")
        term.expect(b"> ", timeout=60)  # the numbered review menu
        term.send(b"q\n")
        out = term.finish()
    text = assert_inert(out, visible=False)
    assert "evil^[]52;c;RklMRQ==^G<U+009B><U+202E>.txt  +9 -0" in text
    assert "caf<U+00E9>.txt  +1 -0" in text  # a non-ASCII name, visibly so
    assert "2 file(s) changed" in text


class PtySession:
    """A program on a fresh pseudo-terminal, driven key by key like a person would."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        size: tuple[int, int] = (40, 120),
    ) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # pragma: no cover - the child
            import fcntl
            import struct
            import termios

            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
            os.chdir(cwd)
            os.execve(argv[0], argv, dict(env))
        self.out = b""
        self.seen = 0
        self.returncode: int | None = None

    def __enter__(self) -> PtySession:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def _read(self, wait: float) -> bool:
        if not select.select([self.fd], [], [], wait)[0]:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError as exc:
            if exc.errno == errno.EIO:
                return False
            raise
        self.out += data
        return bool(data)

    def expect(self, *markers: bytes, timeout: float = 60) -> None:
        """Wait until every marker was printed (in any order) since the last expect."""
        deadline = time.monotonic() + timeout
        while missing := [m for m in markers if m not in self.out[self.seen :]]:
            left = deadline - time.monotonic()
            tail = self.out[-3000:].decode(errors="replace")
            assert left > 0, f"never saw {missing}:\n{tail}"
            assert self._read(min(left, 0.5)), f"ended before {missing}:\n{tail}"
        self.seen = max(self.out.index(m, self.seen) + len(m) for m in markers)

    def send(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def finish(self, timeout: float = 60) -> bytes:
        """Everything the program printed until it exited (killed after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = self._read(0.2)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                while alive and select.select([self.fd], [], [], 0.2)[0]:
                    alive = self._read(0)
                self.returncode = os.waitstatus_to_exitcode(status)
                break
        return self.out
