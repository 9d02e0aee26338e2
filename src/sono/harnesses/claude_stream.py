"""Parser for ``claude -p --verbose --output-format stream-json`` (Claude Code 2.x).

One JSON object per line. Shapes seen from the real CLI 2.1.197:

- ``{"type":"system","subtype":"init","session_id":…,"model":…}``
- ``{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"error_status":401,…}``
- ``{"type":"assistant","message":{"content":[ONE block]},…}``: one line per content block;
  the repeated ``message.usage`` is a per-request snapshot, so it is ignored here.
- ``{"type":"assistant",…,"error":"unknown"}`` with text "API Error: …": a synthetic message.
- ``{"type":"user","message":{"content":[{"type":"tool_result",…}]}}``
- ``{"type":"result","subtype":"success","is_error":false,"usage":…,"total_cost_usd":…}``;
  API failures still say ``subtype":"success"`` but set ``is_error`` true.
"""

from __future__ import annotations

import json
from typing import Any

from sono.events import (
    Error,
    Event,
    FileChanged,
    Raw,
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
from sono.harnesses.jsonread import as_int as _int
from sono.harnesses.jsonread import as_num as _num
from sono.harnesses.jsonread import as_str as _str
from sono.harnesses.jsonread import blocks as _blocks
from sono.harnesses.jsonread import parse_line

# Tools whose input names the file they write; NotebookEdit says notebook_path.
FILE_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit"})
_PATH_KEYS = ("file_path", "notebook_path")


class ClaudeStreamParser:
    """Turns Claude Code stream-json lines into :mod:`sono.events`; never raises."""

    def __init__(self) -> None:
        self._last_error = ""

    def feed(self, line: str) -> list[Event]:
        return self._dedupe_errors(parse_line(line, _dispatch))

    def _dedupe_errors(self, events: list[Event]) -> list[Event]:
        """Claude repeats an API error in the final result line; report it once."""
        kept: list[Event] = []
        for event in events:
            if isinstance(event, Error):
                if event.message == self._last_error:
                    continue
                self._last_error = event.message
            kept.append(event)
        return kept


def _dispatch(obj: dict[str, Any]) -> list[Event] | None:
    """Events for one decoded line; None means "not understood" (→ Raw)."""
    kind = obj.get("type")
    if kind == "system":
        return _system(obj)
    if kind == "assistant":
        return _assistant(obj)
    if kind == "user":
        return _user(obj)
    if kind == "result":
        return _result(obj)
    if kind == "error":
        return [Error(message=_error_message(obj.get("error")))]
    return None


def _system(obj: dict[str, Any]) -> list[Event] | None:
    subtype = obj.get("subtype")
    if subtype == "init":
        return [
            SessionStarted(session_id=_str(obj.get("session_id")), model=_str(obj.get("model")))
        ]
    if subtype == "api_retry":
        # Retries can run for minutes (401s are retried 10 times): surface them, a run looks hung.
        status = obj.get("error_status")
        message = (
            f"API retry {obj.get('attempt')}/{obj.get('max_retries')}: "
            f"{status if status is not None else 'no response'} {_str(obj.get('error'))}"
        )
        return [Error(message=message.strip())]
    return None


def _assistant(obj: dict[str, Any]) -> list[Event] | None:
    message = obj.get("message")
    if not isinstance(message, dict):
        return None
    blocks = _blocks(message.get("content"))
    if obj.get("error") or obj.get("isApiErrorMessage"):
        # Claude reports API failures as a synthetic assistant message.
        texts = [_str(b.get("text")) for b in blocks if b.get("type") == "text"]
        return [Error(message=" ".join(t for t in texts if t) or _str(obj.get("error")))]
    events: list[Event] = []
    for block in blocks:
        events.extend(_assistant_block(block))
    return events


def _assistant_block(block: dict[str, Any]) -> list[Event]:
    kind = block.get("type")
    if kind == "text":
        text = _str(block.get("text"))
        return [Text(text=text)] if text else []
    if kind == "thinking":
        return [Thinking(text=_str(block.get("thinking")))]
    if kind == "redacted_thinking":
        return [Thinking(text="[redacted]")]
    if kind in ("tool_use", "server_tool_use"):
        return _tool_use(block)
    return [Raw(line=json.dumps(block, ensure_ascii=False))]


def _tool_use(block: dict[str, Any]) -> list[Event]:
    name = _str(block.get("name"))
    tool_input = block.get("input")
    events: list[Event] = [
        ToolCall(name=name, summary=summarize(tool_input), call_id=_str(block.get("id")))
    ]
    if name in FILE_TOOLS and isinstance(tool_input, dict):
        paths = (tool_input.get(key) for key in _PATH_KEYS)
        events.extend(FileChanged(path=p) for p in paths if isinstance(p, str) and p)
    return events


def _user(obj: dict[str, Any]) -> list[Event] | None:
    message = obj.get("message")
    if not isinstance(message, dict):
        return None
    results = [b for b in _blocks(message.get("content")) if b.get("type") == "tool_result"]
    # Plain user text echoes (e.g. replayed prompts) carry no news for us.
    return [
        ToolResult(
            call_id=_str(b.get("tool_use_id")),
            ok=b.get("is_error") is not True,
            summary=summarize(_result_text(b.get("content"))),
        )
        for b in results
    ]


def _result(obj: dict[str, Any]) -> list[Event]:
    usage = _dict(obj.get("usage"))
    events: list[Event] = [
        Usage(
            # Cache writes are billed as fresh input; cache reads are the "cached" share.
            input_tokens=_int(usage.get("input_tokens"))
            + _int(usage.get("cache_creation_input_tokens")),
            output_tokens=_int(usage.get("output_tokens")),
            cached_tokens=_int(usage.get("cache_read_input_tokens")),
            cost_usd=_num(obj.get("total_cost_usd")),
        )
    ]
    ok = obj.get("subtype") == "success" and obj.get("is_error") is not True
    text = _str(obj.get("result"))
    if not ok:
        events.append(Error(message=text or _errors_text(obj)))
    events.append(Result(ok=ok, text=text, num_turns=_int(obj.get("num_turns"))))
    return events


def _errors_text(obj: dict[str, Any]) -> str:
    errors = obj.get("errors")
    if isinstance(errors, list) and errors:
        return "; ".join(summarize(e) for e in errors)
    return f"agent ended with {_str(obj.get('subtype')) or 'an error'}"


def _error_message(error: object) -> str:
    if isinstance(error, dict):
        return _str(error.get("message")) or summarize(error)
    return summarize(error) if error is not None else "unknown error"


def _result_text(content: object) -> str:
    """tool_result content is a string or a list of text/image blocks."""
    if isinstance(content, str):
        return content
    texts = [_str(b.get("text")) for b in _blocks(content) if b.get("type") == "text"]
    return "\n".join(texts)
