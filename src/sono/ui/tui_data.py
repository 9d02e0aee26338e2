"""What the review TUI shows, as plain data: rows, labels, timelines, log lines.

Nothing here touches Textual, so it is tested (and reused) without an app. Functions that
take a ``Sandbox`` run git inside it: call them off the UI thread.

Every string returned here that holds the sandbox's bytes (commit subjects, file names, log
lines, diff text) has been through :mod:`sono.textsafe`: the screens only wrap it in
``rich.text.Text`` (never markup).
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sono.sandbox import Sandbox
from sono.state import SandboxRecord, Store
from sono.textsafe import file_name, for_terminal, one_line

# A symbol as well as a colour: the status must read the same with NO_COLOR.
STATUS_MARK = {
    "running": ("▶", "yellow"),
    "done": ("✓", "green"),
    "blocked": ("‼", "magenta"),
    "stopped": ("■", ""),
    "failed": ("✗", "red"),
    "created": ("·", ""),
}


def status_label(status: str) -> tuple[str, str]:
    """``(text, style)`` for a status: the text alone says it all."""
    mark, style = STATUS_MARK.get(status, ("?", ""))
    return f"{mark} {status}", style


@dataclass(frozen=True)
class Group:
    title: str
    records: tuple[SandboxRecord, ...]


def groups(records: Iterable[SandboxRecord]) -> list[Group]:
    """Sandboxes by project (path), titled by name; the path only when names clash."""
    by_path: dict[str, list[SandboxRecord]] = {}
    for rec in records:
        by_path.setdefault(rec.project, []).append(rec)
    names = [recs[0].project_name for recs in by_path.values()]
    out = []
    for path, recs in sorted(by_path.items(), key=lambda kv: (kv[1][0].project_name, kv[0])):
        name = recs[0].project_name
        title = f"{name} ({path})" if names.count(name) > 1 else name
        out.append(Group(one_line(title), tuple(recs)))
    return out


_SHORTSTAT = re.compile(
    r"(\d+) files? changed(?:, (\d+) insertions?\(\+\))?(?:, (\d+) deletions?)?"
)


def parse_shortstat(text: str) -> str:
    """`` 2 files changed, 3 insertions(+), 1 deletion(-)`` → ``2f +3 -1``."""
    match = _SHORTSTAT.search(text)
    if not match:
        return "-"
    files, plus, minus = (int(g or 0) for g in match.groups())
    return f"{files}f +{plus} -{minus}"


def diff_stat(sandbox: Sandbox) -> str:
    out = sandbox.vault.diff(sandbox.record.base_commit, sandbox.tip, "--shortstat")
    return parse_shortstat(out)


def timeline(sandbox: Sandbox) -> list[tuple[int, str]]:
    """``(n, subject of the commit recorded for iteration n)``, oldest first, one git
    call on so's vault (never the sandbox's own refs)."""
    prefix = "refs/so/iter/"
    fmt = "--format=%(refname)%00%(subject)"
    out = sandbox.vault.git("for-each-ref", fmt, prefix).stdout
    entries = []
    for line in out.splitlines():
        ref, _, subject = line.partition("\0")
        tail = ref.removeprefix(prefix)
        if tail.isdigit():
            entries.append((int(tail), one_line(subject, 120)))
    return sorted(entries)


def reset_targets(sandbox: Sandbox) -> list[tuple[str, str]]:
    """``(rev, label)``: the iterations (newest first), base, then each commit since base."""
    targets = [(f"iter-{n}", f"iter-{n}  {subject}") for n, subject in reversed(timeline(sandbox))]
    targets.append(("base", "base  (where the sandbox started)"))
    rng = f"{sandbox.record.base_commit}..{sandbox.tip}"
    log = sandbox.vault.git("log", "-z", "--format=%H %s", rng).stdout
    for entry in log.split("\0"):
        commit, _, subject = entry.partition(" ")
        if commit:
            targets.append((commit, f"{commit[:12]}  {one_line(subject, 120)}"))
    return targets


def iteration_numbers(store: Store, sandbox_id: str) -> list[int]:
    """Iterations with a directory of logs, even one interrupted before its record."""
    base = store.dir(sandbox_id) / "iterations"
    if not base.is_dir():
        return []
    return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit())


def event_line(data: dict[str, Any]) -> str:
    """One stored event → ``kind  short text``."""
    kind = str(data.get("kind", "?"))
    if kind == "tool_call":
        text = f"{data.get('name', '')}: {data.get('summary', '')}"
    elif kind == "tool_result":
        text = ("ok " if data.get("ok", True) else "ERROR ") + str(data.get("summary", ""))
    elif kind == "usage":
        text = f"{data.get('input_tokens', 0)} in / {data.get('output_tokens', 0)} out"
    elif kind == "result":
        text = ("ok " if data.get("ok", True) else "error ") + str(data.get("text", ""))
    else:
        keys = ("text", "message", "path", "line", "model")
        text = next((str(data[k]) for k in keys if data.get(k)), "")
    # Runs of blanks and newlines read as one space; every other control stays visible.
    return f"{one_line(kind, 40):<12} {one_line(_BLANKS.sub(' ', text.strip()), 200)}"


_BLANKS = re.compile(r"[ \t\n]+")


TAIL_LINES = 2000  # a screen of logs, not a whole multi-megabyte run


def _tail(path: Path) -> list[str]:
    try:
        # Lines end at "\n" only: a carriage return is shown (^M), not a line break.
        with path.open(encoding="utf-8", errors="replace", newline="\n") as fh:
            return list(deque(fh, maxlen=TAIL_LINES))
    except FileNotFoundError:
        return []


def event_lines(store: Store, sandbox_id: str, n: int) -> list[str]:
    lines = []
    for raw in _tail(store.iteration_dir(sandbox_id, n) / "events.jsonl"):
        try:
            data = json.loads(raw)
        except ValueError:
            data = {"kind": "raw", "line": raw}
        lines.append(event_line(data if isinstance(data, dict) else {"kind": "raw", "line": raw}))
    return lines or ["(no events recorded)"]


RAW_LINE = 2000  # characters of one raw output line shown (the log keeps all of it)


def raw_lines(store: Store, sandbox_id: str, n: int) -> list[str]:
    path = store.iteration_dir(sandbox_id, n) / "output.log"
    lines = [one_line(line.removesuffix("\n"), RAW_LINE) for line in _tail(path)]
    return lines or ["(no output recorded)"]


# Lines of a diff's file header (between ``diff --git`` and the first hunk) that name files.
_NAME_LINES = ("diff --git ", "--- ", "+++ ", "rename ", "copy ", "Binary files ")
DIFF_LINE = 10_000


def diff_lines(text: str, limit: int) -> list[str]:
    """A diff (from git inside the sandbox) as at most ``limit`` safe display lines:
    controls visible everywhere; in file headers every non-ASCII character too
    (look-alike file names)."""
    # Split at newlines only: a carriage return inside a line is shown, not obeyed.
    lines = text.removesuffix("\n").split("\n") if text else []
    out: list[str] = []
    header = False
    for line in lines[:limit]:
        header = line.startswith("diff --git ") or (header and not line.startswith("@@"))
        if header and line.startswith(_NAME_LINES):
            out.append(file_name(line, DIFF_LINE))
        else:
            out.append(for_terminal(line)[:DIFF_LINE])
    if len(lines) > limit:
        out.append(f"… {len(lines) - limit} more lines: `so diff` shows them all")
    return out
