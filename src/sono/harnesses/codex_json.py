"""Parser for ``codex exec --json`` (Codex CLI 0.171).

One JSON object per line; stderr (warnings, tracing) is interleaved as plain text. Shapes
seen from the real CLI:

- ``{"type":"thread.started","thread_id":…}``, ``{"type":"turn.started"}``
- ``{"type":"item.started"|"item.updated"|"item.completed","item":{"id":"item_3","type":…}}``
  with item types ``agent_message`` (text), ``reasoning`` (text), ``command_execution``
  (command, aggregated_output, exit_code, status), ``file_change`` (changes[{path,kind}],
  status), ``mcp_tool_call`` (server, tool, arguments, result, error, status),
  ``web_search`` (query), ``todo_list`` (items), ``error`` (message). Messages and
  reasoning arrive only as ``item.completed``.
- ``{"type":"turn.completed","usage":{"input_tokens","cached_input_tokens",
  "cache_write_input_tokens","output_tokens","reasoning_output_tokens"}}``: the end of a
  successful run; ``input_tokens`` includes the cached share.
- ``{"type":"error","message":"Reconnecting... 2/5 (…)"}`` and
  ``{"type":"turn.failed","error":{"message":…}}``, which repeats the last error.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from typing import Any

from sono.events import (
    Error,
    Event,
    FileChanged,
    Result,
    SessionStarted,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Usage,
    summarize,
)
from sono.harnesses.jsonread import as_dict as _dict
from sono.harnesses.jsonread import as_str as _str
from sono.harnesses.jsonread import parse_line

SHELL_NAME = "shell"  # ToolCall name for command executions
_SHELLS = frozenset({"bash", "sh", "zsh", "dash"})


class CodexJsonParser:
    """Turns ``codex exec --json`` lines into :mod:`sono.events`; never raises."""

    def __init__(self) -> None:
        self._started: set[str] = set()  # tool item ids already reported as ToolCall
        self._calls = 0
        self._last_text = ""
        self._last_error = ""

    def feed(self, line: str) -> list[Event]:
        return parse_line(line, self._dispatch)

    def _dispatch(self, obj: dict[str, Any]) -> list[Event] | None:
        """Events for one decoded line; None means "not understood" (→ Raw)."""
        kind = _str(obj.get("type"))
        if kind in ("item.started", "item.updated", "item.completed"):
            item = obj.get("item")
            return self._item(kind, item) if isinstance(item, dict) else None
        handlers: dict[str, Callable[[dict[str, Any]], list[Event]]] = {
            "thread.started": self._thread_started,
            "turn.started": lambda _: [],
            "turn.completed": self._turn_completed,
            "turn.failed": self._turn_failed,
            "error": self._error_line,
        }
        handler = handlers.get(kind)
        return handler(obj) if handler is not None else None

    def _thread_started(self, obj: dict[str, Any]) -> list[Event]:
        # The model is not in the JSON stream (codex prints it only in its human output).
        return [SessionStarted(session_id=_str(obj.get("thread_id")))]

    def _error_line(self, obj: dict[str, Any]) -> list[Event]:
        # "Reconnecting... n/5" lines too: retries with back-off otherwise look like a hang.
        return self._error(_str(obj.get("message")) or summarize(obj))

    def _turn_failed(self, obj: dict[str, Any]) -> list[Event]:
        message = _error_message(obj.get("error"))
        return [*self._error(message), Result(ok=False, text=message, num_turns=self._turns)]

    @property
    def _turns(self) -> int:
        # codex disables parallel tool calls: one model request per tool call, plus the last.
        return self._calls + 1

    def _error(self, message: str) -> list[Event]:
        """turn.failed repeats the error just reported; say it once."""
        if message == self._last_error:
            return []
        self._last_error = message
        return [Error(message=message)]

    def _turn_completed(self, obj: dict[str, Any]) -> list[Event]:
        usage = _dict(obj.get("usage"))
        total, cached = _int(usage.get("input_tokens")), _int(usage.get("cached_input_tokens"))
        return [
            # Like Claude's parser: input_tokens is the uncached share, cached the reads.
            Usage(
                input_tokens=max(total - cached, 0),
                output_tokens=_int(usage.get("output_tokens")),
                cached_tokens=cached,
            ),
            Result(ok=True, text=self._last_text, num_turns=self._turns),
        ]

    def _item(self, kind: str, item: dict[str, Any]) -> list[Event] | None:
        item_type = item.get("type")
        if item_type == "agent_message":
            return self._message(kind, _str(item.get("text")))
        if item_type == "reasoning":
            text = _str(item.get("text"))
            return [Thinking(text=text)] if kind == "item.completed" and text else []
        if item_type == "error":
            return self._error(_str(item.get("message")))
        if item_type in _TOOLS:
            return self._tool(kind, item)
        return None

    def _message(self, kind: str, text: str) -> list[Event]:
        if kind != "item.completed" or not text:
            return []
        self._last_text = text
        return [Text(text=text)]

    def _tool(self, kind: str, item: dict[str, Any]) -> list[Event]:
        """ToolCall when a tool item first shows up, ToolResult when it completes."""
        item_id = _str(item.get("id"))
        name, summary = _TOOLS[_str(item.get("type"))](item)
        events: list[Event] = []
        if item_id not in self._started:
            self._started.add(item_id)
            self._calls += 1
            events.append(ToolCall(name=name, summary=summary, call_id=item_id))
        if kind == "item.completed":
            if item.get("type") == "file_change":
                events.extend(FileChanged(path=p) for p in _change_paths(item))
            ok, result = _outcome(item)
            events.append(ToolResult(call_id=item_id, ok=ok, summary=summarize(result)))
        return events


def _shell_call(item: dict[str, Any]) -> tuple[str, str]:
    return SHELL_NAME, summarize(unwrap_shell(_str(item.get("command"))))


def _patch_call(item: dict[str, Any]) -> tuple[str, str]:
    return "apply_patch", summarize(", ".join(_change_paths(item)))


def _mcp_call(item: dict[str, Any]) -> tuple[str, str]:
    name = ".".join(x for x in (_str(item.get("server")), _str(item.get("tool"))) if x)
    args = item.get("arguments")
    return name or "mcp", summarize(args) if args is not None else ""


def _search_call(item: dict[str, Any]) -> tuple[str, str]:
    return "web_search", summarize(_str(item.get("query")))


def _todo_call(item: dict[str, Any]) -> tuple[str, str]:
    todos = [t for t in item.get("items") or [] if isinstance(t, dict)]
    return "todo_list", summarize("; ".join(_str(t.get("text")) for t in todos))


_TOOLS = {
    "command_execution": _shell_call,
    "file_change": _patch_call,
    "mcp_tool_call": _mcp_call,
    "web_search": _search_call,
    "todo_list": _todo_call,
}


def unwrap_shell(command: str) -> str:
    """``/bin/bash -lc 'git status'`` → ``git status``: the wrapper is noise in a summary."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if len(words) == 3 and words[0].rsplit("/", 1)[-1] in _SHELLS and words[1] in ("-c", "-lc"):
        return words[2]
    return command


def _outcome(item: dict[str, Any]) -> tuple[bool, object]:
    """(ok, what to summarize) for a completed tool item."""
    status = item.get("status")
    failed = status in ("failed", "declined")
    if item.get("type") == "command_execution":
        code = item.get("exit_code")
        ok = code == 0 if isinstance(code, int) and not isinstance(code, bool) else not failed
        return ok, _str(item.get("aggregated_output"))
    if item.get("type") == "mcp_tool_call":
        error = item.get("error")
        return error is None and not failed, _error_message(error) if error else item.get("result")
    return not failed, status or ""


def _change_paths(item: dict[str, Any]) -> list[str]:
    changes = item.get("changes")
    paths = (
        (c.get("path") for c in changes if isinstance(c, dict)) if isinstance(changes, list) else ()
    )
    return [p for p in paths if isinstance(p, str) and p]


def _error_message(error: object) -> str:
    if isinstance(error, dict):
        return _str(error.get("message")) or summarize(error)
    return _str(error) or "unknown error"


def _int(value: object) -> int:
    """A finite, non-bool number as int, else 0; json.loads yields NaN and Infinity."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value) if math.isfinite(value) else 0
