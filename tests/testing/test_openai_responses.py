"""The scripted server's OpenAI Responses API: request → scenario → JSON or SSE."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
from typing import Any

import pytest

from sono.testing.model_server import DONE_TEXT, NOTHING_TEXT, SIDE_REPLY, ModelServer, Routed
from sono.testing.openai_responses import (
    REASONING_TEXT,
    Tool,
    count_outputs,
    exec_js,
    handle,
    shell_tool,
    user_text,
)

PROMPT = (
    "Do it. Iteration 2/5.\n<so-script>echo \"{i} of {n}\" > 'x.txt'</so-script>\n"
    "<so-script>git commit</so-script>"
)
ENV_CONTEXT = "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"
# The shape codex 0.171 sends: tools in an additional_tools item, grouped in namespaces.
CODEX_TOOLS = {
    "type": "additional_tools",
    "role": "developer",
    "tools": [
        {
            "type": "namespace",
            "name": "functions",
            "tools": [
                {"type": "custom", "name": "exec", "format": {"type": "grammar"}},
                {"type": "function", "name": "wait", "parameters": {"type": "object"}},
            ],
        }
    ],
}


def message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def codex_body(*history: dict[str, Any], stream: bool = True) -> dict[str, Any]:
    """A codex-shaped agent turn: environment context first, then the prompt."""
    return {
        "model": "gpt-test",
        "stream": stream,
        "input": [
            CODEX_TOOLS,
            message("developer", "You are Codex."),
            message("user", ENV_CONTEXT),
            message("user", PROMPT),
            *history,
        ],
    }


def step(call_id: str) -> list[dict[str, Any]]:
    """A previous exec call and its output, as codex replays them."""
    call = {"type": "custom_tool_call", "call_id": call_id, "name": "exec", "input": "x"}
    output = {
        "type": "custom_tool_call_output",
        "call_id": call_id,
        "output": [{"type": "input_text", "text": "Script completed"}],
    }
    return [call, output]


def streamed(routed: Routed) -> list[dict[str, Any]]:
    assert routed.sse is not None and routed.json is None
    events = []
    for name, data in routed.sse:
        assert name == data["type"]
        events.append(data)
    return events


def completed(routed: Routed) -> dict[str, Any]:
    events = streamed(routed)
    assert events[-1]["type"] == "response.completed"
    response: dict[str, Any] = events[-1]["response"]
    return response


# --- reading requests ---------------------------------------------------------------------


def test_codex_exec_tool_is_found_inside_additional_tools() -> None:
    assert shell_tool(codex_body()) == Tool("exec", custom=True)


@pytest.mark.parametrize("name", ["exec_command", "shell", "bash"])
def test_plain_function_tools_work_too(name: str) -> None:
    body = {"input": "hi", "tools": [{"type": "function", "name": name}]}
    assert shell_tool(body) == Tool(name, custom=False)


def test_other_tools_are_not_a_shell() -> None:
    body = {"input": "hi", "tools": [{"type": "function", "name": "wait"}, {"type": "web"}]}
    assert shell_tool(body) is None


def test_user_text_skips_nothing_and_joins_user_messages() -> None:
    text = user_text(codex_body()["input"])
    assert ENV_CONTEXT in text and "<so-script>" in text and "You are Codex" not in text
    assert user_text("plain prompt") == "plain prompt"


def test_outputs_count_distinct_calls() -> None:
    notify = {"type": "custom_tool_call_output", "call_id": "a", "output": "extra"}
    assert count_outputs([*step("a"), notify, *step("b")]) == 2
    assert count_outputs("text") == 0


# --- the scenario over the Responses API -------------------------------------------------------


def test_first_step_calls_exec_with_the_script_as_js() -> None:
    response = completed(handle(codex_body()))
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["reasoning", "message", "custom_tool_call"]
    assert response["output"][0]["summary"][0]["text"] == REASONING_TEXT
    assert response["output"][1]["content"][0]["text"] == "Running step 3."
    call = response["output"][2]
    assert call["name"] == "exec" and call["call_id"].startswith("call_")
    assert call["input"] == exec_js("echo \"2 of 5\" > 'x.txt'")
    assert 'cmd: "echo \\"2 of 5\\" > \'x.txt\'"' in call["input"]


def test_second_step_follows_one_output() -> None:
    call = completed(handle(codex_body(*step("a"))))["output"][2]
    assert call["input"] == exec_js("git commit")


def test_all_steps_done_ends_with_text() -> None:
    response = completed(handle(codex_body(*step("a"), *step("b"))))
    assert [i["type"] for i in response["output"]] == ["reasoning", "message"]
    assert response["output"][1]["content"][0]["text"] == DONE_TEXT


def test_no_script_means_nothing_to_do() -> None:
    body = codex_body()
    body["input"][3] = message("user", "just chat")
    assert completed(handle(body))["output"][1]["content"][0]["text"] == NOTHING_TEXT


def test_function_tool_gets_a_function_call() -> None:
    body = {"input": PROMPT, "tools": [{"type": "function", "name": "shell"}], "stream": False}
    routed = handle(body)
    assert routed.json is not None
    call = routed.json["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "shell"
    assert json.loads(call["arguments"]) == {
        "command": ["bash", "-lc", "echo \"2 of 5\" > 'x.txt'"]
    }
    body["tools"] = [{"type": "function", "name": "exec_command"}]
    routed = handle(body)
    assert routed.json is not None
    assert json.loads(routed.json["output"][-1]["arguments"]) == {
        "cmd": "echo \"2 of 5\" > 'x.txt'",
        "yield_time_ms": 30000,
    }


def test_side_requests_get_plain_text() -> None:
    routed = handle({"model": "m", "input": [message("user", PROMPT)], "stream": False})
    assert routed.json is not None and routed.sse is None
    [item] = routed.json["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == SIDE_REPLY


def test_structured_side_request_gets_schema_shaped_json() -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    body = {"input": "name it", "text": {"format": {"type": "json_schema", "schema": schema}}}
    routed = handle(body)
    assert routed.json is not None
    text = routed.json["output"][0]["content"][0]["text"]
    assert json.loads(text) == {"title": "Scripted session"}


def test_sleep_knob_reaches_the_router() -> None:
    assert handle({"input": "<so-sleep>2</so-sleep>"}).sleep_s == 2.0


def test_usage_counts_cached_input_after_a_tool_output() -> None:
    first = completed(handle(codex_body()))["usage"]
    assert first["input_tokens_details"]["cached_tokens"] == 0
    later = completed(handle(codex_body(*step("a"))))["usage"]
    cached = later["input_tokens_details"]["cached_tokens"]
    assert 0 < cached < later["input_tokens"]
    assert later["total_tokens"] == later["input_tokens"] + later["output_tokens"]
    assert later["output_tokens_details"]["reasoning_tokens"] > 0


# --- the stream --------------------------------------------------------------------------------


def test_stream_is_well_formed_and_reassembles() -> None:
    events = streamed(handle(codex_body()))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress"
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["model"] == "gpt-test"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == final["output"]
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [0, 1, 2]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Running step 3."
    js = "".join(e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta")
    assert js == final["output"][2]["input"]
    summary = [e for e in events if e["type"] == "response.reasoning_summary_text.done"]
    assert summary[0]["text"] == REASONING_TEXT


def test_function_call_arguments_stream() -> None:
    body = {"input": PROMPT, "tools": [{"type": "function", "name": "exec_command"}]}
    events = streamed(handle({**body, "stream": True}))
    args = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert json.loads(args) == {"cmd": "echo \"2 of 5\" > 'x.txt'", "yield_time_ms": 30000}


@pytest.mark.parametrize(
    "body", [None, [], "text", 3, {}, {"input": 5}, {"input": None, "stream": True}]
)
def test_bad_bodies_are_400s(body: Any) -> None:
    routed = handle(body)
    assert routed.status == 400 and routed.json is not None
    assert routed.json["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body",
    [
        {"input": [1, None, "x", {"type": "additional_tools", "tools": "no"}]},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
        {"input": "x", "tools": [{"type": "namespace", "tools": [{"name": 3}]}]},
        {"input": "x", "tools": [{"type": {}, "name": ["exec"]}]},
        {"input": "x", "text": {"format": {"type": "json_schema", "schema": []}}},
        {"input": [{"type": "custom_tool_call_output"}], "model": 7, "stream": True},
    ],
)
def test_odd_bodies_never_raise(body: Any) -> None:
    routed = handle(body)
    assert routed.status == 200
    if routed.sse is not None:
        list(routed.sse)


# --- the JavaScript codex runs -----------------------------------------------------------


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to evaluate the JS")
def test_exec_js_polls_until_the_command_exits() -> None:
    """Run the generated JS against fake codex tools: the first call yields a session, the
    poll finishes it; the output of both comes back with the exit code."""
    harness = """
const calls = [];
const tools = {
  exec_command: async (a) => { calls.push(a); return {output: 'start ', session_id: 7}; },
  write_stdin: async (a) => { calls.push(a); return {output: 'end', exit_code: 3}; },
};
const texts = [];
const text = (t) => texts.push(t);
(async () => {
%s
})().then(() => console.log(JSON.stringify({calls, texts})));
"""
    js = exec_js("echo 'a \"b\"'")
    body = "\n".join(line for line in js.splitlines() if not line.startswith("// @exec"))
    out = subprocess.run(
        ["node", "-e", harness % body], check=True, capture_output=True, text=True, timeout=30
    )
    result = json.loads(out.stdout)
    assert result["calls"][0] == {"cmd": "echo 'a \"b\"'", "yield_time_ms": 30000}
    assert result["calls"][1] == {"session_id": 7, "yield_time_ms": 30000}
    assert result["texts"] == ["start end", "exit code: 3"]


def test_exec_js_starts_with_a_pragma() -> None:
    first = exec_js("true").splitlines()[0]
    assert first.startswith("// @exec: ")
    assert json.loads(first.removeprefix("// @exec: "))["yield_time_ms"] >= 600_000


# --- real sockets ---------------------------------------------------------------------------


def post(srv: ModelServer, path: str, body: Any) -> tuple[int, str, bytes]:
    host, port = srv.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type") or "", resp.read()
    finally:
        conn.close()


def test_through_the_model_server_socket() -> None:
    with ModelServer() as srv:
        status, ctype, raw = post(srv, "/v1/responses", codex_body())
        assert (status, ctype) == (200, "text/event-stream")
        chunks = raw.decode().strip().split("\n\n")
        events = []
        for chunk in chunks:
            name, data = chunk.split("\n", 1)
            assert name.startswith("event: ") and data.startswith("data: ")
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
        assert all(name == data["type"] for name, data in events)
        assert events[-1][0] == "response.completed"

        status, ctype, raw = post(srv, "/responses", codex_body(stream=False))
        assert (status, ctype) == (200, "application/json")
        assert json.loads(raw)["output"][-1]["type"] == "custom_tool_call"

        status, _, raw = post(srv, "/v1/responses", {"no": "input"})
        assert status == 400 and "input" in json.loads(raw)["error"]["message"]
        assert [r.path for r in srv.requests] == ["/v1/responses", "/responses", "/v1/responses"]
