"""The scripted server's Chat Completions side: the pure handler, then a real socket."""

from __future__ import annotations

import http.client
import json
from typing import Any

from sono.testing.model_server import DONE_TEXT, NOTHING_TEXT, SIDE_REPLY, ModelServer, Routed
from sono.testing.openai_chat import REASONING_TEXT, handle

# opencode 1.18.33's bash tool, as it sends it (description trimmed).
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Executes a given bash command…",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "integer"},
                "workdir": {"type": "string"},
            },
            "required": ["command"],
        },
    },
}
READ = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
PROMPT = (
    "Do it. Iteration 2/5.\n<so-script>echo {i} of {n}</so-script>\n"
    "<so-script>git commit</so-script>"
)


def body(*messages: dict[str, Any], stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": "scripted",
        "messages": [{"role": "system", "content": "You are opencode."}, *messages],
        "tools": [READ, BASH],
        "tool_choice": "auto",
        "stream": stream,
        **extra,
    }


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def tool_turn(call_id: str) -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "ok"},
    ]


def message(routed: Routed) -> dict[str, Any]:
    assert routed.status == 200 and routed.json is not None and routed.sse is None
    choice = routed.json["choices"][0]
    assert isinstance(choice, dict)
    return choice


def collect(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    """Join a stream's deltas the way a client does."""
    assert all(name is None for name, _ in events)
    assert events[-1][1] == "[DONE]"
    chunks = [data for _, data in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}, "finish": None}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            out["content"] += delta.get("content") or ""
            out["reasoning"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                slot = out["calls"].setdefault(call["index"], {"arguments": ""})
                slot.update({k: v for k, v in call.items() if k in ("id", "type")})
                function = call.get("function", {})
                slot["name"] = function.get("name", slot.get("name"))
                slot["arguments"] += function.get("arguments", "")
            out["finish"] = choice["finish_reason"] or out["finish"]
        out["usage"] = chunk.get("usage") or out.get("usage")
    return out


def test_streamed_first_step_calls_bash_with_its_schema() -> None:
    routed = handle(body(user(PROMPT), stream=True, stream_options={"include_usage": True}))
    assert routed.sse is not None
    out = collect(list(routed.sse))
    assert out["content"] == "Running step 3."
    assert out["reasoning"] == REASONING_TEXT
    [call] = out["calls"].values()
    assert call["name"] == "bash" and call["id"].startswith("call_") and call["type"] == "function"
    # Only keys the tool declares: opencode's bash has no "description" parameter.
    assert json.loads(call["arguments"]) == {"command": "echo 2 of 5"}
    assert out["finish"] == "tool_calls"
    usage = out["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_no_usage_chunk_unless_asked() -> None:
    routed = handle(body(user(PROMPT), stream=True))
    assert routed.sse is not None
    events = list(routed.sse)
    assert all("usage" not in data for _, data in events[:-1])


def test_step_index_is_the_number_of_tool_messages() -> None:
    choice = message(handle(body(user(PROMPT), *tool_turn("a"))))
    [call] = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"command": "git commit"}
    assert choice["finish_reason"] == "tool_calls"


def test_all_scripts_done_ends_the_turn() -> None:
    choice = message(handle(body(user(PROMPT), *tool_turn("a"), *tool_turn("b"))))
    assert choice["message"]["content"] == DONE_TEXT and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"


def test_user_text_parts_and_no_script() -> None:
    parts = user([{"type": "text", "text": "Just chat."}])
    assert message(handle(body(parts)))["message"]["content"] == NOTHING_TEXT


def test_required_parameters_are_filled() -> None:
    tool = json.loads(json.dumps(BASH))
    tool["function"]["parameters"]["properties"]["description"] = {"type": "string"}
    tool["function"]["parameters"]["required"] = ["command", "description", "reason"]
    choice = message(handle({**body(user(PROMPT)), "tools": [tool]}))
    args = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
    assert args == {
        "command": "echo 2 of 5",
        "description": "scripted step",
        "reason": "scripted step",
    }


def test_side_request_gets_short_text() -> None:
    title = {**body(user(PROMPT), stream=True), "tools": []}
    routed = handle(title)
    assert routed.sse is not None
    out = collect(list(routed.sse))
    assert out["content"] == SIDE_REPLY and out["reasoning"] == "" and out["finish"] == "stop"
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    structured = {**body(user("x")), "tools": None, "response_format": fmt}
    assert json.loads(message(handle(structured))["message"]["content"]) == {
        "title": "Scripted session"
    }


def test_sleep_is_passed_on() -> None:
    routed = handle(body(user("<so-sleep>2</so-sleep>")))
    assert routed.sleep_s == 2.0


def test_bad_bodies_are_400_not_crashes() -> None:
    bad_bodies: list[object] = [None, [], "x", {"messages": "nope"}, {}]
    for bad in bad_bodies:
        routed = handle(bad)
        assert routed.status == 400 and routed.json is not None
        assert routed.json["error"]["type"] == "invalid_request_error"
    odd = handle({"messages": [5, None, {"role": "tool"}], "tools": [None, {"function": 3}]})
    assert odd.status == 200


def test_real_socket_stream() -> None:
    with ModelServer() as server:
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        payload = body(user(PROMPT), stream=True, stream_options={"include_usage": True})
        for path in ("/v1/chat/completions", "/chat/completions"):
            conn.request("POST", path, json.dumps(payload), {"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200
            assert response.getheader("Content-Type") == "text/event-stream"
            text = response.read().decode()
            lines = [x for x in text.split("\n") if x]
            assert all(x.startswith("data: ") for x in lines)
            assert lines[-1] == "data: [DONE]"
            chunks = [json.loads(x.removeprefix("data: ")) for x in lines[:-1]]
            assert chunks[-1]["usage"]["prompt_tokens"] > 0
        conn.close()
        assert [r.path for r in server.requests] == ["/v1/chat/completions", "/chat/completions"]
