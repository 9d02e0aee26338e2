"""Defensive readers for agents' JSON output: every harness parser reads untrusted,
possibly truncated or mistyped JSON, and must never raise on it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from sono.events import Event, Raw


def as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_str(value: object) -> str:
    return value if isinstance(value, str) else ""


def as_num(value: object) -> float | None:
    """A finite number, else None; json.loads happily yields NaN, Infinity and bools."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def as_int(value: object) -> int:
    return int(as_num(value) or 0)


def blocks(content: object) -> list[dict[str, Any]]:
    """Message content as a list of dict blocks (a bare string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict)]


def text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(as_str(b.get("text")) for b in blocks(content) if b.get("type") == "text")


def parse_line(
    line: object, dispatch: Callable[[dict[str, Any]], list[Event] | None]
) -> list[Event]:
    """The envelope every harness parser shares: blank → nothing; a JSON object → what
    ``dispatch`` makes of it; anything else (or a parser bug) → the line kept as Raw."""
    if not isinstance(line, str):  # callers are typed, but a crash here would lose a run
        return [Raw(line=repr(line))]
    text = line.strip()
    if not text:
        return []
    try:
        obj = json.loads(text)
        events = dispatch(obj) if isinstance(obj, dict) else None
    except Exception:  # a parser bug must degrade to Raw, never kill the run
        events = None
    return [Raw(line=line.rstrip("\n"))] if events is None else events
