"""The scripted model server's OpenAI Chat Completions API (``POST /v1/chat/completions``).

Used by opencode (through ``@ai-sdk/openai-compatible``) and any other agent that speaks
Chat Completions. Stateless like the other wire formats: each request is reduced to the
scenario's inputs (the first user text, the agent's shell tool among
``tools[].function``, how many ``role: "tool"`` messages came back) and answered by
:func:`sono.testing.model_server.decide`.

With ``stream: true`` the answer is unnamed SSE events: ``chat.completion.chunk`` objects
with ``choices[0].delta`` text and ``tool_calls`` deltas, a chunk carrying
``finish_reason``, a usage chunk when ``stream_options.include_usage`` asks for it, then
the raw string ``[DONE]``. Every stream ends that way: clients that see a truncated stream
retry, which looks like a hang.
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
    first_user_text,
    schema_example,
    sleep_seconds,
)

FINISH = {"tool_use": "tool_calls", "end_turn": "stop"}
# Agent turns carry a little reasoning (``reasoning_content``, as DeepSeek, vLLM and most
# gateways send it) so clients' reasoning paths run too.
REASONING_TEXT = "Following the scripted steps."


@dataclass(frozen=True)
class Tool:
    """The shell function an agent offered, with its JSON schema's property names."""

    name: str
    properties: frozenset[str]
    required: frozenset[str]


@dataclass(frozen=True)
class Answer:
    """One rendered completion: text, an optional tool call, why it finished, usage."""

    model: str
    text: str
    reasoning: str
    tool_call: dict[str, Any] | None
    finish_reason: str
    usage: dict[str, Any]


# --- reading the request ------------------------------------------------------------------


def handle(body: Any) -> Routed:
    """Answer one Chat Completions request (see :data:`model_server.OTHER_APIS`)."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return Routed(status=400, json=error_json("body must be JSON with a messages list"))
    messages = body["messages"]
    prompt = first_user_text(messages)
    tool = shell_tool(body.get("tools"))
    if tool is None:
        reply = Reply(side_text(body), sleep_s=sleep_seconds(prompt))
    else:
        reply = decide(prompt, tool.name, count_tool_messages(messages))
    answer = render(body, reply, tool)
    if body.get("stream") is True:
        return Routed(sse=sse_events(answer, include_usage(body)), sleep_s=reply.sleep_s)
    return Routed(json=completion_json(answer), sleep_s=reply.sleep_s)


def shell_tool(tools: object) -> Tool | None:
    """The first offered function that runs shell commands (makes it an agent turn)."""
    for tool in _dicts(tools):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            continue
        name = function.get("name")
        if isinstance(name, str) and name in SHELL_TOOLS:
            params = function.get("parameters")
            schema = params if isinstance(params, dict) else {}
            props = schema.get("properties")
            required = schema.get("required")
            return Tool(
                name,
                frozenset(props) if isinstance(props, dict) else frozenset(),
                frozenset(r for r in _list(required) if isinstance(r, str)),
            )
    return None


def count_tool_messages(messages: object) -> int:
    """Tool results already sent back = steps already run."""
    return sum(1 for m in _dicts(messages) if m.get("role") == "tool")


def side_text(body: dict[str, Any]) -> str:
    """Answer to a request that is not an agent turn (titles, summaries); honours a JSON
    schema ``response_format`` so structured side requests parse."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        return json.dumps(schema_example(spec.get("schema") if isinstance(spec, dict) else None))
    return SIDE_REPLY


def include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


# --- the answer -----------------------------------------------------------------------------


def render(body: dict[str, Any], reply: Reply, tool: Tool | None) -> Answer:
    model = body.get("model")
    call = None
    if tool is not None and reply.tool_name is not None:
        args = tool_arguments(tool, reply.tool_input or {})
        call = {
            "id": _new_id("call_"),
            "type": "function",
            "function": {"name": tool.name, "arguments": json.dumps(args)},
        }
    reasoning = REASONING_TEXT if tool is not None else ""
    return Answer(
        model=model if isinstance(model, str) else "so-scripted",
        text=reply.text,
        reasoning=reasoning,
        tool_call=call,
        finish_reason=FINISH.get(reply.stop_reason, "stop"),
        usage=usage_json(body["messages"], body.get("tools"), reply, reasoning),
    )


def tool_arguments(tool: Tool, tool_input: dict[str, Any]) -> dict[str, Any]:
    """The scenario's ``{command, description}`` cut to what the tool's schema declares
    (strict validators reject unknown keys), plus a filler for any other required string."""
    if not tool.properties:
        return dict(tool_input)
    args = {k: v for k, v in tool_input.items() if k in tool.properties}
    for key in sorted(tool.required - args.keys()):
        args[key] = "scripted step"
    return args


def usage_json(
    messages: list[Any], tools: object, reply: Reply, reasoning: str = ""
) -> dict[str, Any]:
    """Plausible usage: everything before the last message counts as a prompt-cache read."""
    if len(messages) > 1:
        cached, fresh = estimate_tokens([tools, messages[:-1]]), estimate_tokens(messages[-1])
    else:
        cached, fresh = 0, estimate_tokens([tools, messages])
    thought = estimate_tokens(reasoning) if reasoning else 0
    output = estimate_tokens([reply.text, reply.tool_input or ""]) + thought
    return {
        "prompt_tokens": cached + fresh,
        "completion_tokens": output,
        "total_tokens": cached + fresh + output,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": thought},
    }


def completion_json(answer: Answer) -> dict[str, Any]:
    """The non-streaming response body."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    if answer.tool_call is not None:
        message["tool_calls"] = [answer.tool_call]
    choice = {"index": 0, "message": message, "finish_reason": answer.finish_reason}
    return {
        **_envelope(answer, "chat.completion"),
        "choices": [choice],
        "usage": answer.usage,
    }


def error_json(message: str) -> dict[str, Any]:
    """OpenAI's error envelope."""
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }


# --- streaming --------------------------------------------------------------------------------


def sse_events(answer: Answer, with_usage: bool) -> Iterator[tuple[str | None, Any]]:
    """Unnamed ``data:`` events in the API's order, ending with a raw ``[DONE]``."""
    head = _envelope(answer, "chat.completion.chunk")
    for delta, finish in _deltas(answer):
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        yield None, {**head, "choices": [choice]}
    if with_usage:
        yield None, {**head, "choices": [], "usage": answer.usage}
    yield None, "[DONE]"


def _deltas(answer: Answer) -> Iterator[tuple[dict[str, Any], str | None]]:
    yield {"role": "assistant", "content": ""}, None
    for piece in _chunks(answer.reasoning):
        yield {"reasoning_content": piece}, None
    for piece in _chunks(answer.text):
        yield {"content": piece}, None
    call = answer.tool_call
    if call is not None:
        # The first tool delta names the call; the arguments follow in pieces to be joined.
        opening = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
        yield {"tool_calls": [{"index": 0, **opening}]}, None
        for piece in _chunks(call["function"]["arguments"]):
            yield {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, None
    yield {}, answer.finish_reason


def _envelope(answer: Answer, kind: str) -> dict[str, Any]:
    return {
        "id": _new_id("chatcmpl-"),
        "object": kind,
        "created": int(time.time()),
        "model": answer.model,
        "system_fingerprint": None,
    }


def _chunks(text: str, size: int = 24) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _dicts(value: object) -> list[dict[str, Any]]:
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]
