"""The scripted model server's OpenAI Responses API (``POST /v1/responses``), for codex.

Stateless like the Messages API side: each request is reduced to the scenario's inputs
(the user text, the agent's shell tool, how many tool outputs came back) and answered by
:func:`sono.testing.model_server.decide`, streamed as SSE when ``stream`` is true.

Codex 0.17x offers its tools in an ``additional_tools`` input item, not in ``tools``, and
reaches the shell only through a custom tool ``exec`` whose input is JavaScript run in a
V8 isolate (``await tools.exec_command({cmd})``). So a scripted step is answered with a
``custom_tool_call`` to ``exec`` carrying a small JS driver; agents that offer a plain
function tool (``exec_command``, ``shell``) get a ``function_call`` instead.

Codex retries a malformed or truncated stream five times with back-off, which looks like
a hang from the outside: every stream here ends with ``response.completed``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sono.testing.model_server import (
    SHELL_TOOLS,
    SIDE_REPLY,
    Reply,
    Routed,
    decide,
    estimate_tokens,
    schema_example,
    sleep_seconds,
)

REASONING_TEXT = "Following the scripted steps."
CODE_TOOL = "exec"  # codex's JavaScript "code mode" tool
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})
# exec_command yields after at most 30 s; the driver polls until the command exits so a
# long step stays one tool call (one step of the scenario), like Claude's Bash tool.
POLL_MS = 30000
# The exec cell itself also yields (default 30 s) unless its pragma says otherwise.
CELL_YIELD_MS = 3_600_000


@dataclass(frozen=True)
class Tool:
    """The shell-capable tool an agent offered: a custom (freeform) or function tool."""

    name: str
    custom: bool


# --- reading the request ------------------------------------------------------------------


def handle(body: Any) -> Routed:
    """Answer one Responses API request (see :data:`model_server.OTHER_APIS`)."""
    if not isinstance(body, dict) or not isinstance(body.get("input"), str | list):
        return Routed(status=400, json=error_json("body must be JSON with an input"))
    model = body.get("model") if isinstance(body.get("model"), str) else "so-scripted"
    tool = shell_tool(body)
    prompt = user_text(body.get("input"))
    if tool is None:
        # The scenario's <so-sleep> holds side requests too, as on the Messages API side.
        reply = Reply(side_text(body), sleep_s=sleep_seconds(prompt))
    else:
        reply = decide(prompt, tool.name, count_outputs(body.get("input")))
    items = output_items(reply, tool)
    usage = usage_json(body, items)
    response = response_json(str(model), items, usage)
    if body.get("stream") is True:
        return Routed(sse=sse_events(response), sleep_s=reply.sleep_s)
    return Routed(json=response, sleep_s=reply.sleep_s)


def shell_tool(body: dict[str, Any]) -> Tool | None:
    """The code-mode ``exec`` tool if offered (codex needs it), else a shell function."""
    tools = list(_walk_tools(body.get("tools")))
    for item in _items(body.get("input")):
        if item.get("type") == "additional_tools":
            tools += _walk_tools(item.get("tools"))
    offered = [(t.get("name"), t.get("type")) for t in tools]
    if (CODE_TOOL, "custom") in offered:
        return Tool(CODE_TOOL, custom=True)
    for name, kind in offered:
        if kind == "function" and isinstance(name, str) and name in SHELL_TOOLS:
            return Tool(name, custom=False)
    return None


def _walk_tools(tools: object) -> Iterator[dict[str, Any]]:
    """Tools, flattening ``namespace`` groups (codex nests its tools in them)."""
    for tool in _items(tools):
        if tool.get("type") == "namespace":
            yield from _walk_tools(tool.get("tools"))
        else:
            yield tool


def user_text(input_: object) -> str:
    """All user message text: codex sends its environment context as a user message
    before the prompt, so "the first user message" would miss the ``<so-script>``."""
    if isinstance(input_, str):
        return input_
    parts = [
        _content_text(item.get("content"))
        for item in _items(input_)
        if item.get("role") == "user" and item.get("type", "message") == "message"
    ]
    return "\n".join(p for p in parts if p)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    texts = [b.get("text") for b in _items(content) if b.get("type") in ("input_text", "text")]
    return "\n".join(t for t in texts if isinstance(t, str))


def count_outputs(input_: object) -> int:
    """Tool calls that got an output = steps already run (distinct call ids, because
    codex's ``notify()`` can add extra outputs for one call)."""
    ids = {str(item.get("call_id")) for item in _items(input_) if item.get("type") in OUTPUT_TYPES}
    return len(ids)


def side_text(body: dict[str, Any]) -> str:
    """Answer to a request that is not an agent turn; honours a JSON schema format."""
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return json.dumps(schema_example(fmt.get("schema")))
    return SIDE_REPLY


def _items(value: object) -> list[dict[str, Any]]:
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


# --- the answer -----------------------------------------------------------------------------


def output_items(reply: Reply, tool: Tool | None) -> list[dict[str, Any]]:
    """Agent turns open with a reasoning summary (so clients' reasoning paths run too),
    then a message with the reply text, then the tool call when the reply has one."""
    items = [_message(reply.text)] if tool is None else [_reasoning(), _message(reply.text)]
    command = (reply.tool_input or {}).get("command")
    if tool is not None and reply.tool_name is not None and isinstance(command, str):
        items.append(_tool_call(tool, command))
    return items


def _reasoning() -> dict[str, Any]:
    summary = [{"type": "summary_text", "text": REASONING_TEXT}]
    # No encrypted_content: codex replays the item as-is in the next request, which is fine.
    return {"id": _new_id("rs_"), "type": "reasoning", "summary": summary}


def _message(text: str) -> dict[str, Any]:
    return {
        "id": _new_id("msg_"),
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _tool_call(tool: Tool, command: str) -> dict[str, Any]:
    call_id = _new_id("call_")
    if tool.custom:
        return {
            "id": _new_id("ctc_"),
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": call_id,
            "name": tool.name,
            "input": exec_js(command),
        }
    return {
        "id": _new_id("fc_"),
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": tool.name,
        "arguments": json.dumps(function_args(tool.name, command)),
    }


def exec_js(command: str) -> str:
    """The JavaScript for codex's ``exec`` tool: run ``command``, wait for it to exit,
    return its output and exit code. JSON string literals are valid JS literals."""
    pragma = json.dumps({"yield_time_ms": CELL_YIELD_MS})
    return (
        f"// @exec: {pragma}\n"
        f"let r = await tools.exec_command({{cmd: {json.dumps(command)}, "
        f"yield_time_ms: {POLL_MS}}});\n"
        "let out = r.output ?? '';\n"
        "while (r.exit_code === undefined && r.session_id !== undefined) {\n"
        f"  r = await tools.write_stdin({{session_id: r.session_id, yield_time_ms: {POLL_MS}}});\n"
        "  out += r.output ?? '';\n"
        "}\n"
        "text(out);\n"
        "text(`exit code: ${r.exit_code}`);\n"
    )


EXEC_YIELD_MS = 30_000


def function_args(name: str, command: str) -> dict[str, Any]:
    """Arguments in the shape each known shell function tool takes."""
    if name == "exec_command":  # its longest wait: a step that runs longer is cut short
        return {"cmd": command, "yield_time_ms": EXEC_YIELD_MS}
    if name == "shell":  # codex's older shell tool takes an argv
        return {"command": ["bash", "-lc", command]}
    return {"command": command}


def usage_json(body: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """Plausible usage: input up to the last tool output counts as a prompt-cache read."""
    input_ = body.get("input")
    history = input_ if isinstance(input_, list) else [input_]
    prefix = {k: v for k, v in body.items() if k in ("instructions", "tools")}
    last = max(
        (i for i, x in enumerate(history) if isinstance(x, dict) and x.get("type") in OUTPUT_TYPES),
        default=-1,
    )
    if last < 0:
        cached, fresh = 0, estimate_tokens([prefix, history])
    else:
        cached, fresh = estimate_tokens([prefix, history[:last]]), estimate_tokens(history[last:])
    output = estimate_tokens(items)
    reasoning = [x for x in items if x["type"] == "reasoning"]
    return {
        "input_tokens": cached + fresh,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {
            "reasoning_tokens": estimate_tokens(reasoning) if reasoning else 0
        },
        "total_tokens": cached + fresh + output,
    }


def response_json(model: str, items: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
    """The complete response object (the non-streaming body, and response.completed's)."""
    return {
        "id": _new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": items,
        "usage": usage,
        "error": None,
        "incomplete_details": None,
    }


def error_json(message: str) -> dict[str, Any]:
    """OpenAI's error envelope."""
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }


# --- streaming --------------------------------------------------------------------------------


def sse_events(response: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    """The streamed form of ``response``: named events whose data repeats the name in
    ``type`` and carries a ``sequence_number``, in the API's order."""
    for seq, (name, data) in enumerate(_raw_events(response)):
        yield name, {"type": name, "sequence_number": seq, **data}


def _raw_events(response: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    yield "response.created", {"response": pending}
    yield "response.in_progress", {"response": pending}
    for index, item in enumerate(response["output"]):
        yield from _item_events(index, item)
    yield "response.completed", {"response": response}


def _item_events(index: int, item: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "reasoning":
        yield "response.output_item.added", {"output_index": index, "item": {**item, "summary": []}}
        yield from _summary_events(at, item["summary"][0])
    elif item["type"] == "message":
        yield "response.output_item.added", {"output_index": index, "item": {**item, "content": []}}
        yield from _text_events(at, item["content"][0])
    elif item["type"] == "custom_tool_call":
        yield "response.output_item.added", {"output_index": index, "item": {**item, "input": ""}}
        for piece in _chunks(item["input"]):
            yield "response.custom_tool_call_input.delta", {**at, "delta": piece}
        yield "response.custom_tool_call_input.done", {**at, "input": item["input"]}
    else:
        added = {**item, "arguments": "", "status": "in_progress"}
        yield "response.output_item.added", {"output_index": index, "item": added}
        for piece in _chunks(item["arguments"]):
            yield "response.function_call_arguments.delta", {**at, "delta": piece}
        yield "response.function_call_arguments.done", {**at, "arguments": item["arguments"]}
    yield "response.output_item.done", {"output_index": index, "item": item}


def _text_events(at: dict[str, Any], part: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    at = {**at, "content_index": 0}
    yield "response.content_part.added", {**at, "part": {**part, "text": ""}}
    for piece in _chunks(part["text"]):
        yield "response.output_text.delta", {**at, "delta": piece, "logprobs": []}
    yield "response.output_text.done", {**at, "text": part["text"], "logprobs": []}
    yield "response.content_part.done", {**at, "part": part}


def _summary_events(
    at: dict[str, Any], part: dict[str, Any]
) -> Iterator[tuple[str, dict[str, Any]]]:
    at = {**at, "summary_index": 0}
    yield "response.reasoning_summary_part.added", {**at, "part": {**part, "text": ""}}
    for piece in _chunks(part["text"]):
        yield "response.reasoning_summary_text.delta", {**at, "delta": piece}
    yield "response.reasoning_summary_text.done", {**at, "text": part["text"]}
    yield "response.reasoning_summary_part.done", {**at, "part": part}


def _chunks(text: str, size: int = 24) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]
