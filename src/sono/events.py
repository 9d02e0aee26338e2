"""Normalized agent events: every harness's output is parsed into these.

Events are plain frozen dataclasses; ``to_json`` gives the stored/printed form.
Unknown output is kept as :class:`Raw`, never dropped and never a crash.
"""

from __future__ import annotations

import dataclasses
import json
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


@dataclass(frozen=True)
class Usage(Event):
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None
    kind: str = field(init=False, default="usage")


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
