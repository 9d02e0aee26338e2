"""The normalized events: their JSON form round-trips, usage figures are bounded, and
summaries are one capped line."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from sono.events import (
    MAX_USAGE_COST,
    MAX_USAGE_TOKENS,
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
    dumps,
    summarize,
)

SAMPLES: tuple[Event, ...] = (
    SessionStarted(session_id="s1", model="m"),
    Text(text="héllo\nworld ✓"),
    Thinking(text="hmm"),
    ToolCall(name="Bash", summary="ls -la", call_id="c1"),
    ToolResult(call_id="c1", ok=False, summary="exit 2"),
    FileChanged(path="a/b.py"),
    Usage(input_tokens=10, output_tokens=2, cached_tokens=5, cost_usd=0.25),
    Result(ok=True, text="done", num_turns=3),
    Error(message="boom"),
    Raw(line="{not json"),
)
KINDS = {cls().kind: cls for cls in (type(e) for e in SAMPLES)}


def test_every_kind_is_distinct_and_named() -> None:
    assert len(KINDS) == len(SAMPLES)
    assert Event().kind == "event" and "event" not in KINDS


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_json_round_trip(event: Event) -> None:
    data = json.loads(dumps(event))
    assert data == event.to_json() and data["kind"] == event.kind
    fields = {k: v for k, v in data.items() if k != "kind"}
    assert KINDS[data["kind"]](**fields) == event


def test_dumps_keeps_text_readable_on_one_line() -> None:
    line = dumps(Text(text="héllo\nworld ✓"))
    assert "\n" not in line and "héllo" in line and "✓" in line


def test_events_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Text(text="a").text = "b"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("claimed", "expected"),
    [
        (Usage(input_tokens=5, output_tokens=6, cached_tokens=7, cost_usd=0.5), (5, 6, 7, 0.5)),
        (Usage(input_tokens=-1, output_tokens=-5, cost_usd=-2.0), (0, 0, 0, 0.0)),
        (Usage(input_tokens=10**15, cost_usd=1e9), (MAX_USAGE_TOKENS, 0, 0, MAX_USAGE_COST)),
        (Usage(input_tokens=math.inf, cost_usd=math.nan), (0, 0, 0, 0.0)),  # type: ignore[arg-type]
        (Usage(input_tokens=True, cost_usd=True), (0, 0, 0, 0.0)),
        (Usage(input_tokens="9", cost_usd="1"), (0, 0, 0, 0.0)),  # type: ignore[arg-type]
        (Usage(output_tokens=2.9), (0, 2, 0, None)),  # type: ignore[arg-type]
    ],
)
def test_usage_bounded(claimed: Usage, expected: tuple[object, ...]) -> None:
    got = claimed.bounded()
    assert (got.input_tokens, got.output_tokens, got.cached_tokens, got.cost_usd) == expected
    assert got.kind == "usage"


def test_summarize_picks_the_telling_field_and_caps() -> None:
    assert summarize({"description": "d", "command": "ls  -la\n x"}) == "ls -la x"
    assert summarize({"file_path": "/a.py", "content": "..."}) == "/a.py"
    assert summarize({"other": [1, 2]}) == '{"other": [1, 2]}'
    assert summarize({"command": 3}) == '{"command": 3}'  # not a string: the whole input
    long = summarize("x" * 500, limit=10)
    assert long == "x" * 9 + "…" and len(long) == 10
    assert summarize("é" * 10, limit=10) == "é" * 10
