"""Text from the sandbox, made safe for the human's terminal.

Everything an agent writes — its output, file names, commit messages, diff lines — is
hostile until checked: a raw escape sequence can set the clipboard (OSC 52), retitle the
window (OSC 0), hide a line of code (SGR 8 "conceal"), move the cursor over what was
printed, or reprogram the terminal. Before such text reaches a terminal (directly, through
a pager, or in the review app) it goes through :func:`for_terminal`: every control
character except newline and tab becomes visible (``ESC`` → ``^[``, C1 and DEL as
``<U+009B>``-style escapes) so the human sees that something was there, and nothing acts.

``sgr=True`` keeps SGR colour sequences that so itself asked git for (``--color``), and only
those parameters that set colours and plain attributes: never conceal, blink or anything
that is not SGR.
"""

from __future__ import annotations

import re

# A CSI SGR sequence: ESC [ params m. Anything else starting with ESC is neutralised.
_SGR = re.compile(r"\x1b\[([0-9;:]*)m")
# C0 (but newline and tab), DEL, C1; the bidi controls (embeddings, overrides, isolates,
# marks) that reorder what is shown; zero-width characters that hide a difference (the
# zero-width joiner stays: emoji need it); line/paragraph separators; lone surrogates
# (undecodable bytes: printing them would raise).
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200c\u200e\u200f\u2028-\u202e"
    "\u2060-\u2064\u2066-\u2069\ufeff\ud800-\udfff]"
)
# For file names, also every other non-ASCII character: a look-alike letter must not pass
# for the name the reviewer expects (as git's core.quotePath does).
_NAME = re.compile(r"[^\x20-\x7e]")
# SGR parameters kept: reset, bold, faint, italic, underline, reverse, their resets, and
# colours (30-37, 39, 40-47, 49, 90-97, 100-107; 38/48 with 5;n or 2;r;g;b).
_PLAIN = {0, 1, 2, 3, 4, 7, 21, 22, 23, 24, 27, 39, 49}
_COLOURS = set(range(30, 38)) | set(range(40, 48)) | set(range(90, 98)) | set(range(100, 108))


def _visible(match: re.Match[str]) -> str:
    char = match.group(0)
    code = ord(char)
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    return f"<U+{code:04X}>"


def _safe_sgr(params: str) -> bool:
    if not params:
        return True
    values = params.replace(":", ";").split(";")
    try:
        numbers = [int(v) if v else 0 for v in values]
    except ValueError:
        return False
    i = 0
    while i < len(numbers):
        n = numbers[i]
        if n in (38, 48):
            if len(numbers) > i + 2 and numbers[i + 1] == 5:
                i += 3
                continue
            if len(numbers) > i + 4 and numbers[i + 1] == 2:
                i += 5
                continue
            return False
        if n not in _PLAIN and n not in _COLOURS:
            return False
        i += 1
    return True


def for_terminal(text: str, *, sgr: bool = False) -> str:
    """``text`` with every control character made visible and inert (newline and tab
    kept); with ``sgr``, plain colour sequences survive."""
    if not sgr:
        return _CONTROL.sub(_visible, text)
    out: list[str] = []
    pos = 0
    for match in _SGR.finditer(text):
        out.append(_CONTROL.sub(_visible, text[pos : match.start()]))
        seq = match.group(0)
        out.append(seq if _safe_sgr(match.group(1)) else _CONTROL.sub(_visible, seq))
        pos = match.end()
    out.append(_CONTROL.sub(_visible, text[pos:]))
    return "".join(out)


def one_line(text: str, limit: int = 200) -> str:
    """A single safe line (names, messages, errors): controls visible, newlines too,
    cut at ``limit`` characters."""
    flat = for_terminal(text.replace("\n", "\\n").replace("\t", " "))
    return _cut(flat, limit)


def file_name(name: str, limit: int = 200) -> str:
    """A file name as one safe line where every character that is not printable ASCII
    is visible (``<U+00E9>``, ``^[``): two names that look alike never read alike."""
    return _cut(_NAME.sub(_visible, name), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
