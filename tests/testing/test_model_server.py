"""The scripted model server: the pure scenario function, then real sockets."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sono.testing.model_server import (
    DONE_TEXT,
    MAX_SLEEP_S,
    NOTHING_TEXT,
    SIDE_REPLY,
    ModelServer,
    Reply,
    plan_reply,
)

BASH = [{"name": "Bash", "input_schema": {"type": "object"}}]
PROMPT = (
    "Do it. Iteration 2/5.\n<so-script>echo {i} of {n}</so-script>\n"
    "<so-script>git commit</so-script>"
)


def agent_body(*messages: dict[str, Any], tools: list[Any] | None = None) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 100,
        "tools": BASH if tools is None else tools,
        "messages": list(messages),
    }


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def tool_turn(call_id: str) -> list[dict[str, Any]]:
    """An assistant tool_use and the user's tool_result for it."""
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": "x"}}
            ],
        },
        user([{"type": "tool_result", "tool_use_id": call_id, "content": "ok"}]),
    ]


# --- plan_reply: the scenario protocol --------------------------------------------------


def test_first_step_runs_first_script_with_placeholders() -> None:
    reply = plan_reply(agent_body(user(PROMPT)))
    assert reply == Reply(
        text="Running step 3.",
        stop_reason="tool_use",
        tool_name="Bash",
        tool_input={"command": "echo 2 of 5", "description": "scripted step"},
    )


def test_step_index_is_the_number_of_tool_results() -> None:
    reply = plan_reply(agent_body(user(PROMPT), *tool_turn("a")))
    assert reply.text == "Running step 4."
    assert reply.tool_input == {"command": "git commit", "description": "scripted step"}


def test_all_scripts_done_ends_the_turn() -> None:
    reply = plan_reply(agent_body(user(PROMPT), *tool_turn("a"), *tool_turn("b")))
    assert (reply.text, reply.stop_reason, reply.tool_name) == (DONE_TEXT, "end_turn", None)


def test_no_script_means_nothing_to_do() -> None:
    reply = plan_reply(agent_body(user("just chat")))
    assert (reply.text, reply.stop_reason) == (NOTHING_TEXT, "end_turn")


def test_without_iteration_marker_placeholders_stay() -> None:
    reply = plan_reply(agent_body(user("<so-script>echo {i}/{n} ${HOME}</so-script>")))
    assert reply.tool_input == {"command": "echo {i}/{n} ${HOME}", "description": "scripted step"}


def test_claude_code_shaped_first_message() -> None:
    """Claude sends text blocks (a system-reminder first) and a role=system message."""
    first = user(
        [
            {"type": "text", "text": "<system-reminder>\ncontext\n</system-reminder>"},
            {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}},
        ]
    )
    system_msg = {"role": "system", "content": "Available agent types: <so-script>no</so-script>"}
    reply = plan_reply(agent_body(first, system_msg))
    assert reply.tool_input is not None
    assert reply.tool_input["command"] == "echo 2 of 5"


def test_scripts_only_come_from_the_first_user_message() -> None:
    later = user([{"type": "text", "text": "<so-script>rm -rf /</so-script>"}])
    reply = plan_reply(agent_body(user("hello"), {"role": "assistant", "content": "hi"}, later))
    assert reply.text == NOTHING_TEXT


@pytest.mark.parametrize("name", ["Bash", "bash", "shell", "exec_command"])
def test_any_shell_tool_name_makes_an_agent_turn(name: str) -> None:
    tools = [{"name": "Read"}, {"name": name}]
    reply = plan_reply(agent_body(user(PROMPT), tools=tools))
    assert reply.tool_name == name


@pytest.mark.parametrize("tools", [[], [{"name": "Read"}], None, "Bash", [{"nome": "Bash"}, 3]])
def test_side_requests_get_plain_text(tools: Any) -> None:
    body = {"model": "m", "messages": [user(PROMPT)], "tools": tools}
    assert plan_reply(body) == Reply(SIDE_REPLY)


def test_structured_side_request_gets_schema_shaped_json() -> None:
    """Claude's title request asks for {"title": string} via output_config."""
    schema = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "x": {"type": "integer"}},
        "required": ["title"],
    }
    body = {
        "messages": [user("hi")],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    assert json.loads(plan_reply(body).text) == {"title": "Scripted session"}


def test_sleep_knob_is_parsed_and_capped() -> None:
    assert plan_reply(agent_body(user("<so-sleep>2.5</so-sleep>"))).sleep_s == 2.5
    assert plan_reply(agent_body(user("<so-sleep> 99999 </so-sleep>"))).sleep_s == MAX_SLEEP_S
    assert plan_reply(agent_body(user(PROMPT))).sleep_s == 0.0


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "x",
        3,
        {},
        {"messages": "x"},
        {"messages": [None, 3]},
        {"tools": BASH, "messages": [{"role": "user", "content": 5}]},
    ],
)
def test_garbage_bodies_never_raise(body: Any) -> None:
    assert isinstance(plan_reply(body), Reply)


# --- over real sockets -------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv


def post(srv: ModelServer, path: str, body: Any) -> tuple[int, str, bytes]:
    host, port = srv.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, payload, {"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type") or "", resp.read()
    finally:
        conn.close()


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_non_streaming_message(server: ModelServer) -> None:
    status, ctype, raw = post(
        server, "/v1/messages", {**agent_body(user(PROMPT)), "model": "opus-x"}
    )
    assert (status, ctype) == (200, "application/json")
    msg = json.loads(raw)
    assert msg["id"].startswith("msg_") and msg["model"] == "opus-x"
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["stop_reason"] == "tool_use"
    text, tool = msg["content"]
    assert text == {"type": "text", "text": "Running step 3."}
    assert tool["type"] == "tool_use" and tool["id"].startswith("toolu_")
    assert tool["input"] == {"command": "echo 2 of 5", "description": "scripted step"}
    usage = msg["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert "cache_read_input_tokens" in usage


def test_streaming_message_reassembles(server: ModelServer) -> None:
    body = {**agent_body(user(PROMPT), *tool_turn("a")), "stream": True}
    status, ctype, raw = post(server, "/v1/messages?beta=true", body)
    assert (status, ctype) == (200, "text/event-stream")
    events = parse_sse(raw)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    start = events[0][1]["message"]
    assert start["model"] == "m" and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["cache_read_input_tokens"] > 0  # earlier turns count as cached
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = {**data["content_block"], "json": ""}
        elif name == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                block["json"] += delta["partial_json"]
    assert blocks[0]["text"] == "Running step 4."
    assert blocks[1]["name"] == "Bash"
    assert json.loads(blocks[1]["json"])["command"] == "git commit"
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "tool_use" and final["usage"]["output_tokens"] > 0


def test_streaming_end_turn(server: ModelServer) -> None:
    body = {"model": "m", "stream": True, "messages": [user("title please")]}
    events = parse_sse(post(server, "/v1/messages", body)[2])
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == SIDE_REPLY
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_count_tokens(server: ModelServer) -> None:
    status, _, raw = post(server, "/v1/messages/count_tokens", agent_body(user(PROMPT)))
    assert status == 200
    assert json.loads(raw)["input_tokens"] > 0


def test_unknown_paths_are_json_404s(server: ModelServer) -> None:
    status, _, raw = post(server, "/v1/complete", {})
    assert status == 404
    assert json.loads(raw)["error"]["type"] == "not_found_error"
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/v1/models")
    resp = conn.getresponse()
    assert resp.status == 404 and json.loads(resp.read())["type"] == "error"
    conn.close()


def test_bad_body_is_a_400(server: ModelServer) -> None:
    status, _, raw = post(server, "/v1/messages", b"{not json")
    assert status == 400
    assert json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_requests_are_recorded(server: ModelServer) -> None:
    post(server, "/v1/messages?beta=true", agent_body(user("hi")))
    post(server, "/v1/messages/count_tokens", {"messages": []})
    recorded = server.requests
    assert [(r.method, r.path) for r in recorded] == [
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
    ]
    assert recorded[0].body["messages"][0]["content"] == "hi"


def test_keep_alive_connection_serves_several_requests(server: ModelServer) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    for stream in (True, False, True):
        body = json.dumps({**agent_body(user(PROMPT)), "stream": stream})
        conn.request("POST", "/v1/messages", body)
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read()
    conn.close()


def test_sleep_is_honoured_and_stop_cuts_it_short() -> None:
    srv = ModelServer().start()
    body = agent_body(user("<so-sleep>0.3</so-sleep><so-script>true</so-script>"))
    began = time.monotonic()
    assert post(srv, "/v1/messages", body)[0] == 200
    assert time.monotonic() - began >= 0.3

    hung = agent_body(user("<so-sleep>60</so-sleep>"))
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(post(srv, "/v1/messages", hung)[0])
        except (OSError, http.client.HTTPException) as err:
            outcome.append(err)

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.2)
    began = time.monotonic()
    srv.stop()
    worker.join(timeout=10)
    assert not worker.is_alive() and time.monotonic() - began < 5
    assert outcome and not isinstance(outcome[0], int)  # dropped, not answered


def test_url_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        _ = ModelServer().url


def test_module_entry_point_prints_url_first() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sono.testing.model_server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", "/v1/messages/count_tokens", json.dumps({"messages": []}))
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_steps_count_on_across_iterations() -> None:
    """A loop's fresh conversation per iteration: steps go 1, 2, 3 … not 1, 1, 1."""
    one = "Iteration {}/3.\n<so-script>bash steps.sh {{i}}</so-script>"
    texts = [plan_reply(agent_body(user(one.format(i)))).text for i in (1, 2, 3)]
    assert texts == ["Running step 1.", "Running step 2.", "Running step 3."]
    assert plan_reply(agent_body(user("<so-script>x</so-script>"))).text == "Running step 1."
