"""The subprocess gate: output of sandboxed commands is read in bounded memory."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sono import proc
from sono.errors import SoError
from sono.home import pid_alive
from sono.proc import LineSplitter


def test_splitter_keeps_lines_and_the_unterminated_last_one() -> None:
    splitter = LineSplitter(max_line=10)
    assert splitter.feed(b"ab\ncd") == ["ab"]
    assert splitter.feed(b"e\n\nf") == ["cde", ""]
    assert splitter.end() == ["f"]
    assert splitter.end() == []


def test_splitter_cuts_an_overlong_line_and_says_how_much_was_dropped() -> None:
    splitter = LineSplitter(max_line=4)
    lines = [*splitter.feed(b"0123456789"), *splitter.feed(b"abc\nok\n")]
    assert lines == ["0123 [so: 9 more bytes of this line dropped]", "ok"]
    assert splitter.end() == []


def test_splitter_decodes_invalid_utf8_and_a_cut_character() -> None:
    splitter = LineSplitter(max_line=2)
    [line] = splitter.feed("é€\n".encode())
    assert line.startswith("é")
    assert splitter.feed(b"\xff\n") == ["\ufffd"]


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_stream_of_a_huge_line_without_newline_stays_small() -> None:
    """300 MB without a newline: the reader holds at most one capped line."""
    before = _max_rss_mb()
    seen: list[str] = []
    code = "import sys\nfor _ in range(300): sys.stdout.buffer.write(b'x' * (1 << 20))\n"
    result = proc.stream(
        [sys.executable, "-c", code + "print(); print('after')"], on_line=seen.append
    )
    assert result.returncode == 0
    assert len(seen) == 2
    assert len(seen[0]) < proc.MAX_LINE + 100
    assert seen[0].endswith(
        f"[so: {300 * (1 << 20) - proc.MAX_LINE} more bytes of this line dropped]"
    )
    assert seen[1] == "after"
    assert _max_rss_mb() - before < 100  # unbounded, this is 600 MB and more


# --- run: capture, decoding, errors ------------------------------------------------------


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_run_captures_both_streams_and_keeps_carriage_returns() -> None:
    out = proc.run(py("import sys; sys.stdout.write('a\\r\\nb'); sys.stderr.write('warn')"))
    assert (out.returncode, out.stdout, out.stderr) == (0, "a\r\nb", "warn")
    assert out.argv[0] == sys.executable


def test_run_replaces_undecodable_bytes() -> None:
    out = proc.run(py("import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe end')"))
    assert out.stdout == "ok \ufffd\ufffd end"


def test_run_passes_input_cwd_and_env(tmp_path: Path) -> None:
    code = "import os, sys; print(sys.stdin.read().upper(), os.getcwd(), os.environ['SO_X'])"
    out = proc.run(py(code), input="hi", cwd=tmp_path, env={"SO_X": "y", "PATH": "/usr/bin"})
    assert out.stdout.split() == ["HI", str(tmp_path), "y"]


def test_a_failure_names_the_command_exit_code_and_last_stderr_lines() -> None:
    code = "import sys; sys.stderr.write('1\\n2\\n3\\n4\\n'); sys.exit(7)"
    with pytest.raises(proc.CommandError) as info:
        proc.run(py(code))
    message = str(info.value)
    assert message.startswith("command failed (exit 7): ") and "2 | 3 | 4" in message
    assert "1 |" not in message and info.value.result.returncode == 7
    assert proc.run(py(code), check=False).returncode == 7


def test_run_timeout_is_a_clear_error() -> None:
    start = time.monotonic()
    with pytest.raises(SoError, match=r"command timed out after 0.5s: .*sleep"):
        proc.run(py("import time; time.sleep(30)"), timeout=0.5)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("call", ["run", "stream", "interactive", "page"])
def test_a_missing_command_is_one_error_everywhere(call: str) -> None:
    argv = ["/nonexistent/so-no-such-tool", "x"]
    calls: dict[str, Callable[[], object]] = {
        "run": lambda: proc.run(argv),
        "stream": lambda: proc.stream(argv, on_line=print),
        "interactive": lambda: proc.interactive(argv),
        "page": lambda: proc.page(argv, "text"),
    }
    with pytest.raises(SoError, match=r"^command not found: /nonexistent/so-no-such-tool \("):
        calls[call]()


# --- stream: lines, stdin, timeouts and the process group ------------------------------


def test_stream_feeds_lines_and_stdin() -> None:
    seen: list[str] = []
    code = "import sys\nfor line in sys.stdin: print('got', line.strip())\nprint('end', end='')"
    result = proc.stream(py(code), on_line=seen.append, stdin_text="a\nb\n")
    assert seen == ["got a", "got b", "end"]
    assert (result.returncode, result.timed_out, result.killed) == (0, False, None)


def test_stream_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    """A grandchild that ignores SIGTERM and keeps the pipe open dies with the group."""
    pid_file = tmp_path / "pid"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    result = proc.stream(py(code), on_line=lambda line: None, timeout=1.0)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < 20
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(grandchild)


def test_stream_stop_reason_kills_and_is_reported() -> None:
    ticks = iter(range(1000))
    result = proc.stream(
        py("import time; time.sleep(60)"),
        on_line=lambda line: None,
        stop=lambda: "memory" if next(ticks) >= 3 else None,
    )
    assert result.killed == "memory" and not result.timed_out
    assert result.duration_s < 10


def test_stream_stderr_goes_to_stdout_unless_redirected(tmp_path: Path) -> None:
    seen: list[str] = []
    code = "import sys; print('out'); sys.stderr.write('err\\n')"
    proc.stream(py(code), on_line=seen.append)
    assert sorted(seen) == ["err", "out"]
    seen.clear()
    with (tmp_path / "err.log").open("wb") as fh:
        proc.stream(py(code), on_line=seen.append, stderr_to=fh)
    assert seen == ["out"] and (tmp_path / "err.log").read_text() == "err\n"


def test_interactive_and_page_return_the_exit_code() -> None:
    assert proc.interactive(py("import sys; sys.exit(3)")) == 3
    assert proc.page(py("import sys; sys.stdin.read(); sys.exit(4)"), "text") == 4
