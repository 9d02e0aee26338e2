"""ClaudeStreamParser on real Claude Code 2.1.197 output, hand-made shapes and garbage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
)
from sono.harnesses.claude_stream import ClaudeStreamParser

FIXTURE = Path(__file__).parent.parent / "fixtures" / "claude" / "stream_commit.jsonl"

# Real lines from claude 2.1.197 (trimmed) against a server answering HTTP 400 and 401.
API_ERROR_ASSISTANT = (
    '{"type":"assistant","message":{"id":"5d655484-0206-42e2-a945-3faccadc428b",'
    '"model":"<synthetic>","role":"assistant","stop_reason":"stop_sequence","type":"message",'
    '"usage":{"input_tokens":0,"output_tokens":0},'
    '"content":[{"type":"text","text":"API Error: 400 scripted failure 400"}]},'
    '"parent_tool_use_id":null,"session_id":"78e6f019","error":"unknown"}'
)
API_ERROR_RESULT = (
    '{"type":"result","subtype":"success","is_error":true,"api_error_status":400,'
    '"duration_ms":194,"num_turns":1,"result":"API Error: 400 scripted failure 400",'
    '"session_id":"78e6f019","total_cost_usd":0,"usage":{"input_tokens":0,'
    '"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}'
)
API_RETRY = (
    '{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,'
    '"retry_delay_ms":516.1,"error_status":401,"error":"authentication_failed",'
    '"session_id":"5e115ac8"}'
)


def parse(lines: list[str]) -> list[Event]:
    parser = ClaudeStreamParser()
    return [event for line in lines for event in parser.feed(line)]


def line(obj: dict[str, Any]) -> str:
    return json.dumps(obj)


def assistant(*blocks: dict[str, Any]) -> str:
    return line({"type": "assistant", "message": {"role": "assistant", "content": list(blocks)}})


# --- the real recording -------------------------------------------------------------------


def test_real_fixture_parses_to_the_expected_story() -> None:
    events = parse(FIXTURE.read_text().splitlines())
    assert not [e for e in events if isinstance(e, Raw | Error)]
    kinds = [e.kind for e in events]
    assert kinds == [
        "session_started",
        "text", "tool_call", "tool_result",
        "text", "tool_call", "tool_result",
        "text", "usage", "result",
    ]  # fmt: skip
    start = events[0]
    assert isinstance(start, SessionStarted)
    assert start.session_id == "84fe847f-974b-4536-bd8d-b118685bdf3e"
    assert start.model.startswith("claude-")


def test_real_fixture_tool_calls_pair_with_results() -> None:
    events = parse(FIXTURE.read_text().splitlines())
    calls = [e for e in events if isinstance(e, ToolCall)]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [c.name for c in calls] == ["Bash", "Bash"]
    assert [c.call_id for c in calls] == [r.call_id for r in results]
    assert all(c.call_id.startswith("toolu_") for c in calls)
    assert "git commit" in calls[1].summary
    assert all(r.ok for r in results)
    assert "Update README (iteration 1)" in results[1].summary


def test_real_fixture_usage_and_result() -> None:
    events = parse(FIXTURE.read_text().splitlines())
    usage, result = events[-2], events[-1]
    assert isinstance(usage, Usage) and isinstance(result, Result)
    assert usage.input_tokens > 0 and usage.output_tokens > 0 and usage.cached_tokens > 0
    assert usage.cost_usd is not None and usage.cost_usd > 0
    assert result == Result(ok=True, text="Iteration done.", num_turns=3)


def test_real_api_error_is_reported_once() -> None:
    events = parse([API_ERROR_ASSISTANT, API_ERROR_RESULT])
    assert [e.kind for e in events] == ["error", "usage", "result"]
    assert events[0] == Error(message="API Error: 400 scripted failure 400")
    assert events[2] == Result(ok=False, text="API Error: 400 scripted failure 400", num_turns=1)


def test_real_api_retry_is_an_error_event() -> None:
    [event] = parse([API_RETRY])
    assert isinstance(event, Error)
    assert "1/10" in event.message and "401" in event.message


# --- shapes not in the recording ---------------------------------------------------------


def test_thinking_and_file_edits() -> None:
    events = parse([
        assistant({"type": "thinking", "thinking": "hmm", "signature": "x"}),
        assistant({"type": "redacted_thinking", "data": "zzz"}),
        assistant({"type": "tool_use", "id": "t1", "name": "Write",
                   "input": {"file_path": "/w/a.py", "content": "x"}}),
        assistant({"type": "tool_use", "id": "t2", "name": "Edit",
                   "input": {"file_path": "/w/b.py", "old_string": "a", "new_string": "b"}}),
        assistant({"type": "tool_use", "id": "t3", "name": "NotebookEdit",
                   "input": {"notebook_path": "/w/n.ipynb"}}),
        assistant({"type": "tool_use", "id": "t4", "name": "Read", "input": {"file_path": "/w/c"}}),
    ])  # fmt: skip
    assert events[:2] == [Thinking(text="hmm"), Thinking(text="[redacted]")]
    assert [e.path for e in events if isinstance(e, FileChanged)] == [
        "/w/a.py", "/w/b.py", "/w/n.ipynb"]  # fmt: skip
    write = events[2]
    assert write == ToolCall(name="Write", summary="/w/a.py", call_id="t1")
    assert events[3] == FileChanged(path="/w/a.py")


def test_tool_result_list_content_and_errors() -> None:
    events = parse([line({"type": "user", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
         "content": [{"type": "text", "text": "Exit code 1"}, {"type": "image"}]},
        {"type": "tool_result", "tool_use_id": "t2", "content": "fine"},
    ]}})])  # fmt: skip
    assert events == [
        ToolResult(call_id="t1", ok=False, summary="Exit code 1"),
        ToolResult(call_id="t2", ok=True, summary="fine"),
    ]


def test_error_results_and_error_lines() -> None:
    events = parse([
        line({"type": "result", "subtype": "error_max_turns", "is_error": False, "num_turns": 50,
              "usage": {"input_tokens": 10, "cache_creation_input_tokens": 5,
                        "cache_read_input_tokens": 7, "output_tokens": 3},
              "total_cost_usd": 0.5}),
        line({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ])  # fmt: skip
    assert events[0] == Usage(input_tokens=15, output_tokens=3, cached_tokens=7, cost_usd=0.5)
    assert isinstance(events[1], Error) and "error_max_turns" in events[1].message
    assert events[2] == Result(ok=False, text="", num_turns=50)
    assert events[3] == Error(message="Overloaded")


def test_unknown_but_valid_lines_are_raw() -> None:
    lines = [
        line({"type": "system", "subtype": "status", "status": "compacting"}),
        line({"type": "stream_event", "event": {}}),
        "[1, 2, 3]",
        '"just a string"',
    ]
    assert parse(lines) == [Raw(line=text) for text in lines]


def test_blank_lines_are_ignored_and_text_blocks_may_be_empty() -> None:
    assert parse(["", "   \n", assistant({"type": "text", "text": ""})]) == []
    assert parse([assistant({"type": "text", "text": "hi"})]) == [Text(text="hi")]


# --- never raise -----------------------------------------------------------------------


GARBAGE = [
    "not json", "{", "}", "{\"type\":", "null", "true", "1e999", "NaN", "\x00\xff",
    "{" * 5000 + "}", "[" * 100_000 + "]" * 100_000,
    '{"type": null}', '{"type": 5}', '{"type": "assistant"}', '{"type": "assistant", "message": 3}',
    '{"type": "assistant", "message": {"content": "plain string"}}',
    '{"type": "assistant", "message": {"content": [1, null, "x", {"type": 7}]}}',
    '{"type": "assistant", "message": {"content": [{"type": "tool_use", "name": 5, "input": []}]}}',
    '{"type": "assistant", "message": {"content": [{"type": "tool_use", "name": "Write",'
    ' "input": {"file_path": 9}}]}}',
    '{"type": "user", "message": {"content": [{"type": "tool_result", "content": {"a": 1}}]}}',
    '{"type": "user", "message": []}',
    '{"type": "result", "usage": [], "num_turns": "x", "total_cost_usd": "1.0"}',
    '{"type": "result", "usage": {"input_tokens": NaN, "output_tokens": Infinity},'
    ' "total_cost_usd": -Infinity, "num_turns": 1e400}',
    '{"type": "result", "usage": {"input_tokens": true}, "errors": [1, {"x": 2}]}',
    '{"type": "system", "subtype": "init", "session_id": 5, "model": ["x"]}',
    '{"type": "system", "subtype": "api_retry"}',
    '{"type": "error", "error": "boom"}', '{"type": "error"}',
]  # fmt: skip


@pytest.mark.parametrize("text", GARBAGE)
def test_garbage_never_raises(text: str) -> None:
    events = ClaudeStreamParser().feed(text)
    assert all(isinstance(e, Event) for e in events)
    assert all(isinstance(e.to_json(), dict) for e in events)


def test_non_string_input_never_raises() -> None:
    parser = ClaudeStreamParser()
    for bad in (None, 5, b'{"type":"result"}', ["x"]):
        assert [type(e) for e in parser.feed(bad)] == [Raw]  # type: ignore[arg-type]


def test_every_truncation_of_the_fixture_is_safe() -> None:
    parser = ClaudeStreamParser()
    for text in FIXTURE.read_text().splitlines():
        for cut in range(0, len(text), 7):
            assert all(isinstance(e, Event) for e in parser.feed(text[:cut]))


def _mutations(node: Any) -> Iterator[Any]:
    """Copies of ``node`` with exactly one value swapped for a value of another type."""
    yield from (None, 1, -1.5, "x", [], {}, True, [None], {"type": 1})
    if isinstance(node, dict):
        for key, value in node.items():
            for mutated in _mutations(value):
                yield {**node, key: mutated}
    elif isinstance(node, list):
        for index, value in enumerate(node):
            for mutated in _mutations(value):
                yield [*node[:index], mutated, *node[index + 1 :]]


def test_type_swapped_fixture_values_never_raise() -> None:
    parser = ClaudeStreamParser()
    lines = [*FIXTURE.read_text().splitlines(), API_ERROR_ASSISTANT, API_ERROR_RESULT, API_RETRY]
    for text in lines:
        for mutated in _mutations(json.loads(text)):
            assert all(isinstance(e, Event) for e in parser.feed(json.dumps(mutated)))
