"""Sandbox text on the human's terminal: visible, inert."""

from __future__ import annotations

from sono.textsafe import for_terminal, one_line


def test_escape_sequences_become_visible() -> None:
    osc52 = "\x1b]52;c;ZXZpbA==\x07"
    out = for_terminal(f"a{osc52}b\x1b[8mhidden\x1b[0m\r\x9b2J\x00")
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\x9b" not in out
    assert out.startswith("a^[]52;c;ZXZpbA==^Gb^[[8mhidden")
    assert "<U+009B>" in out and out.endswith("^@")


def test_newline_and_tab_kept() -> None:
    assert for_terminal("a\tb\nc") == "a\tb\nc"


def test_sgr_colours_kept_conceal_and_others_not() -> None:
    text = "\x1b[32m+ok\x1b[m \x1b[1;31mx\x1b[0m \x1b[38;5;208my\x1b[38;2;1;2;3mz"
    assert for_terminal(text, sgr=True) == text
    bad = for_terminal("\x1b[8mhidden\x1b[0m \x1b[5mblink \x1b[2J \x1b[38;5m", sgr=True)
    assert "\x1b[8m" not in bad and "\x1b[5m" not in bad and "\x1b[2J" not in bad
    assert "^[[8mhidden\x1b[0m" in bad and "^[[38;5m" in bad


def test_bidi_overrides_visible() -> None:
    assert for_terminal("a\u202eb") == "a<U+202E>b"


def test_one_line() -> None:
    assert one_line("a\nb\x1b]0;t\x07") == "a\\nb^[]0;t^G"
    assert len(one_line("x" * 500, 50)) == 50
