"""The subprocess gate: output of sandboxed commands is read in bounded memory."""

from __future__ import annotations

import resource
import sys

from sono import proc
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
