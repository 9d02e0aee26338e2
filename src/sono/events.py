"""Normalized agent events: every harness's output is parsed into these.

Events are plain frozen dataclasses; ``to_json`` gives the stored/printed form.
Unknown output is kept as :class:`Raw`, never dropped and never a crash.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    """Base class; ``kind`` names the event in JSON."""

    kind: str = field(init=False, default="event")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["kind"] = self.kind
        return data


@dataclass(frozen=True)
class SessionStarted(Event):
    session_id: str = ""
    model: str = ""
    kind: str = field(init=False, default="session_started")


@dataclass(frozen=True)
class Text(Event):
    text: str = ""
    kind: str = field(init=False, default="text")


@dataclass(frozen=True)
class Thinking(Event):
    text: str = ""
    kind: str = field(init=False, default="thinking")


@dataclass(frozen=True)
class ToolCall(Event):
    name: str = ""
    summary: str = ""
    call_id: str = ""
    kind: str = field(init=False, default="tool_call")


@dataclass(frozen=True)
class ToolResult(Event):
    call_id: str = ""
    ok: bool = True
    summary: str = ""
    kind: str = field(init=False, default="tool_result")


@dataclass(frozen=True)
class FileChanged(Event):
    path: str = ""
    kind: str = field(init=False, default="file_changed")


# Bounds on what one Usage event may claim: far above any real model request, low
# enough that sums stay exact. The agent prints these figures; nothing trusts them more.
MAX_USAGE_TOKENS = 10**9
MAX_USAGE_COST = 10_000.0


@dataclass(frozen=True)
class Usage(Event):
    """Usage as the agent reported it (``input_tokens``: uncached input plus cache
    writes; ``cached_tokens``: cache reads)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None
    kind: str = field(init=False, default="usage")

    def bounded(self) -> Usage:
        """The same report with every figure a finite, non-negative, bounded number."""
        return Usage(
            input_tokens=_count(self.input_tokens),
            output_tokens=_count(self.output_tokens),
            cached_tokens=_count(self.cached_tokens),
            cost_usd=None if self.cost_usd is None else _dollars(self.cost_usd),
        )


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return min(max(int(value), 0), MAX_USAGE_TOKENS)


def _dollars(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return min(max(float(value), 0.0), MAX_USAGE_COST)


@dataclass(frozen=True)
class Result(Event):
    ok: bool = True
    text: str = ""
    num_turns: int = 0
    kind: str = field(init=False, default="result")


@dataclass(frozen=True)
class Error(Event):
    message: str = ""
    kind: str = field(init=False, default="error")


@dataclass(frozen=True)
class Raw(Event):
    line: str = ""
    kind: str = field(init=False, default="raw")


def dumps(event: Event) -> str:
    return json.dumps(event.to_json(), ensure_ascii=False)


def summarize(value: object, limit: int = 120) -> str:
    """A one-line, length-capped rendering of a tool input or result."""
    if isinstance(value, dict):
        for key in ("command", "cmd", "file_path", "path", "pattern", "url", "description"):
            if key in value and isinstance(value[key], str):
                value = value[key]
                break
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
