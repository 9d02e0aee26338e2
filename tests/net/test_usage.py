"""Usage parsing of model API bodies."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from sono.net.usage import Tokens, UsageParser, measure


def sse(*events: dict[str, Any], named: bool = True, done: bool = False) -> bytes:
    out = ""
    for event in events:
        head = f"event: {event.get('type')}\n" if named else ""
        out += f"{head}data: {json.dumps(event)}\n\n"
    if done:
        out += "data: [DONE]\n\n"
    return out.encode()


def parse(body: bytes, content_type: str, step: int | None = None, encoding: str = "") -> Tokens:
    parser = UsageParser(content_type, encoding)
    step = step or len(body) or 1
    for i in range(0, len(body), step):
        parser.feed(body[i : i + step])
    return parser.result()


ANTHROPIC_SSE = sse(
    {
        "type": "message_start",
        "message": {
            "model": "claude-x",
            "usage": {
                "input_tokens": 10,
                "cache_creation_input_tokens": 200,
                "cache_read_input_tokens": 3000,
                "output_tokens": 1,
            },
        },
    },
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "é" * 9}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 77}},
    {"type": "message_stop"},
)


@pytest.mark.parametrize("step", [None, 1, 7])
def test_anthropic_sse_any_split(step: int | None) -> None:
    # Byte-by-byte feeding splits multi-byte UTF-8 and every line: same answer.
    assert parse(ANTHROPIC_SSE, "text/event-stream; charset=utf-8", step) == Tokens(
        "claude-x", 10, 77, 3000, 200
    )


def test_anthropic_json_and_gzip() -> None:
    body = json.dumps(
        {
            "type": "message",
            "model": "claude-y",
            "usage": {"input_tokens": 5, "output_tokens": 6, "cache_read_input_tokens": 7},
        }
    ).encode()
    expected = Tokens("claude-y", 5, 6, 7, None)
    assert parse(body, "application/json") == expected
    assert parse(gzip.compress(body), "application/json", 5, "gzip") == expected


def test_openai_responses_sse_subtracts_cached_input() -> None:
    usage = {
        "input_tokens": 1000,
        "input_tokens_details": {"cached_tokens": 800},
        "output_tokens": 50,
        "output_tokens_details": {"reasoning_tokens": 20},
    }
    body = sse(
        {"type": "response.created", "response": {"model": "gpt-5", "usage": None}},
        {"type": "response.output_text.delta", "delta": "hi"},
        {"type": "response.completed", "response": {"model": "gpt-5", "usage": usage}},
    )
    assert parse(body, "text/event-stream", 3) == Tokens("gpt-5", 200, 50, 800, 0)


def test_openai_responses_json() -> None:
    body = {
        "object": "response",
        "model": "gpt-5",
        "usage": {
            "input_tokens": 9,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 4,
        },
    }
    assert parse(json.dumps(body).encode(), "application/json") == Tokens("gpt-5", 9, 4, 0, 0)


def test_openai_chat_stream_final_usage_chunk() -> None:
    chunk = {"object": "chat.completion.chunk", "model": "gpt-4o", "usage": None}
    final = {
        "object": "chat.completion.chunk",
        "model": "gpt-4o",
        "choices": [],
        "usage": {
            "prompt_tokens": 30,
            "completion_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 10},
        },
    }
    body = sse(chunk, chunk, final, named=False, done=True)
    assert parse(body, "text/event-stream", 11) == Tokens("gpt-4o", 20, 12, 10, 0)


def test_openai_chat_json() -> None:
    body = {
        "object": "chat.completion",
        "model": "m",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    assert parse(json.dumps(body).encode(), "application/json") == Tokens("m", 3, 2, 0, 0)


@pytest.mark.parametrize(
    ("body", "content_type", "encoding"),
    [
        (b"<html>not json</html>", "text/html", ""),
        (b'{"error": {"message": "rate limited"}}', "application/json", ""),
        (b"data: {broken\n\ndata: [DONE]\n\n", "text/event-stream", ""),
        (b"\x00\x01garbage", "application/json", "gzip"),
        (b"whatever", "application/json", "br"),
        (b"", "application/json", ""),
    ],
)
def test_unreadable_bodies_give_no_usage_and_never_raise(
    body: bytes, content_type: str, encoding: str
) -> None:
    assert parse(body, content_type, 3, encoding) == Tokens()


def test_one_bad_sse_event_does_not_hide_the_rest() -> None:
    body = b"data: {not json\n\n" + ANTHROPIC_SSE
    assert parse(body, "text/event-stream").output_tokens == 77


# --- what the budget trusts ------------------------------------------------------------------


def test_measure_sums_the_gateway_lines_in_the_harness_convention() -> None:
    lines: list[dict[str, Any]] = [
        {
            "model": "claude-sonnet-4-5",
            "input_tokens": 100,
            "output_tokens": 20,
            "cache_read_tokens": 1000,
            "cache_write_tokens": 10,
        },
        {
            "model": "gpt-5.1-codex",
            "input_tokens": 50,
            "output_tokens": 5,
            "cache_read_tokens": 200,
            "cache_write_tokens": 0,
        },
        {
            "model": None,
            "status": 404,
            "refused": "not a model API endpoint",
            "input_tokens": None,
            "output_tokens": None,
        },
    ]
    seen = measure(lines)
    assert (seen.requests, seen.input_tokens, seen.output_tokens) == (3, 160, 25)
    assert seen.cached_tokens == 1200 and seen.metered
    claude = (100 * 3 + 10 * 3.75 + 1000 * 0.3 + 20 * 15) / 1e6
    gpt = (50 * 1.25 + 200 * 0.125 + 5 * 10) / 1e6
    assert seen.cost_usd == pytest.approx(claude + gpt)


@pytest.mark.parametrize(
    "line",
    [
        {"input_tokens": -5, "output_tokens": "9", "cache_read_tokens": 1.5},
        {"input_tokens": True, "output_tokens": None},
        {},
    ],
)
def test_measure_counts_only_real_counts(line: dict[str, Any]) -> None:
    seen = measure([line])
    assert (seen.input_tokens, seen.output_tokens, seen.cached_tokens) == (0, 0, 0)
    assert not seen.metered and seen.requests == 1


@pytest.mark.parametrize(
    ("model", "per_million_out"),
    [
        ("claude-opus-4-1-20250805", 75.0),
        ("claude-opus-4-5", 25.0),
        ("anthropic/claude-haiku-4-5", 5.0),
        ("us.anthropic.claude-sonnet-4-5-v1:0", 15.0),
        ("gpt-5-mini", 2.0),
        ("o3", 8.0),
        ("my-local-model", 0.0),  # unknown: nothing added; the agent's figure stands
    ],
)
def test_measured_cost_at_list_price(model: str, per_million_out: float) -> None:
    seen = measure([{"model": model, "input_tokens": 0, "output_tokens": 1_000_000}])
    assert seen.cost_usd == pytest.approx(per_million_out)
