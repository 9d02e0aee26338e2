from __future__ import annotations

from sono.commands.dup import jscpd_report

OUTPUT = (
    "Clone found (python):\n"
    " - \x1b[1m\x1b[32mone.py\x1b[39m\x1b[22m [1:1 - 19:6] (18 lines, 135 tokens)\n"
    "   \x1b[1m\x1b[32mtwo.py\x1b[39m\x1b[22m [1:1 - 19:6]\n\n"
    "\x1b[90m┌────────\x1b[39m┐\n\x1b[90m│\x1b[39m Format │\n└──┘\n"
    "\x1b[90mFound 1 clones.\x1b[39m\n"
)


def test_report_keeps_clones_drops_colours_and_table() -> None:
    report = jscpd_report(OUTPUT)
    assert "one.py [1:1 - 19:6] (18 lines, 135 tokens)" in report
    assert "two.py" in report and "Found 1 clones." in report
    assert "\x1b" not in report and "│" not in report and "┌" not in report


def test_empty_output() -> None:
    assert jscpd_report("") == "(jscpd found no duplicates)"
