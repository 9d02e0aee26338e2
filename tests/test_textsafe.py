"""Sandbox text on the human's terminal: visible, inert."""

from __future__ import annotations

from sono.textsafe import file_name, for_terminal, one_line


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


def test_invisible_and_reordering_characters_visible() -> None:
    out = for_terminal("a\u200bb\u200ec\u061cd\u2066e\ufefff\u2060g")
    assert out == "a<U+200B>b<U+200E>c<U+061C>d<U+2066>e<U+FEFF>f<U+2060>g"
    assert for_terminal("👨\u200d👩") == "👨\u200d👩"  # the joiner: emoji, not a trick


def test_lone_surrogates_visible_not_a_crash() -> None:
    text = b"ok\xff".decode(errors="surrogateescape")
    out = for_terminal(text)
    assert out == "ok<U+DCFF>"
    out.encode()  # printable: no UnicodeEncodeError on the way to the terminal


def test_one_line_shows_carriage_return_and_c1() -> None:
    assert one_line("safe\rEVIL\x9b2J") == "safe^MEVIL<U+009B>2J"


def test_file_name_shows_every_non_ascii_character() -> None:
    assert file_name("caf\u00e9.txt") == "caf<U+00E9>.txt"
    assert file_name("p\u0430ypal.py") == "p<U+0430>ypal.py"  # Cyrillic a, a look-alike
    assert file_name("evil\x1b]52;c;eA==\x07\n.txt") == "evil^[]52;c;eA==^G^J.txt"
    assert file_name("plain name-1.txt") == "plain name-1.txt"
    assert len(file_name("x" * 300, 40)) == 40
