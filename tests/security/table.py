"""Print the markdown table of escape attempts x backends for docs/security.md.

    SO_SECURITY_REPORT=/tmp/escape.jsonl .venv/bin/python -m pytest tests/security -q
    .venv/bin/python tests/security/table.py /tmp/escape.jsonl

Rows come from ``attempts.py`` (so an attempt the run skipped still shows, as "not run");
cells from the JSON lines the suite wrote (the last line per attempt and backend wins).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from attempts import ALL, BACKENDS, GROUPS, Attempt

CELLS = {"blocked": "blocked", "ESCAPED": "**ESCAPED**", "n/a": "n/a"}


def load(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    results: dict[tuple[str, str], dict[str, str]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            results[(record["id"], record["backend"])] = record
    return results


def cell(record: dict[str, str] | None) -> str:
    if record is None:
        return "not run"
    text = CELLS.get(record["result"], record["result"])
    detail = record.get("detail")
    return f"{text} ({detail})" if detail else text


def escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def table(attempts: list[Attempt], results: dict[tuple[str, str], dict[str, str]]) -> str:
    head = ["Group", "Attempt", "What the agent tries", *BACKENDS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in GROUPS:
        for a in (a for a in attempts if a.group == group):
            what = a.title + (
                " (open policy)" if a.policy == "open" and "open" not in a.title else ""
            )
            cells = [cell(results.get((a.id, b))) for b in BACKENDS]
            lines.append(f"| {group} | `{a.id}` | {escape(what)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(attempts: list[Attempt], results: dict[tuple[str, str], dict[str, str]]) -> str:
    counts = Counter(a.group for a in attempts)
    parts = [f"{group}: {counts[group]}" for group in GROUPS]
    escaped = sorted(f"`{i}` on {b}" for (i, b), r in results.items() if r["result"] == "ESCAPED")
    text = f"{len(attempts)} attempts ({', '.join(parts)})."
    if escaped:
        text += " Got through: " + ", ".join(escaped) + "."
    return text


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    results = load(Path(argv[0]))
    print(summary(ALL, results))
    print()
    print(table(ALL, results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
