"""A scripted, stateless Anthropic Messages API server for demos and tests.

Agents (the real ``claude`` CLI or :mod:`sono.testing.mini_agent`) are pointed at it with
``ANTHROPIC_BASE_URL``. Each reply is decided from the request alone (see :func:`plan_reply`):
the prompt carries ``<so-script>`` blocks, and the number of tool results already in the
conversation says which one to run next. No state means any number of agents, retries and
side requests can share one server without confusing it.

Run standalone with ``python -m sono.testing.model_server [--port N]``: the first stdout
line is the base URL.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

SHELL_TOOLS = frozenset({"Bash", "bash", "shell", "exec_command"})
MAX_SLEEP_S = 3600.0
SIDE_REPLY = "OK."
STEP_TEXT = "Running step {step}."
DONE_TEXT = "Iteration done."
NOTHING_TEXT = "Nothing to do."

_SCRIPT_RE = re.compile(r"<so-script>(.*?)</so-script>", re.DOTALL)
_SLEEP_RE = re.compile(r"<so-sleep>\s*([0-9]+(?:\.[0-9]*)?)\s*</so-sleep>")
_ITERATION_RE = re.compile(r"Iteration (\d+)/(\d+)\.")


# --- the scenario: a pure function of the request body -------------------------------


@dataclass(frozen=True)
class Reply:
    """What to answer; rendering (ids, usage, JSON or SSE) happens separately."""

    text: str
    stop_reason: str = "end_turn"
    tool_name: str | None = None
    tool_input: dict[str, Any] | None = None
    sleep_s: float = 0.0


def plan_reply(body: object) -> Reply:
    """Decide the answer to one Messages API request body (the scenario protocol)."""
    if not isinstance(body, dict):
        return Reply(SIDE_REPLY)
    prompt = first_user_text(body.get("messages"))
    tool = shell_tool_name(body.get("tools"))
    if tool is None:
        return Reply(side_reply_text(body), sleep_s=sleep_seconds(prompt))
    return decide(prompt, tool, count_tool_results(body.get("messages")))


def decide(prompt: str, tool: str, done: int) -> Reply:
    """The scenario, API-neutral: ``prompt`` is the conversation's first user text, ``tool``
    the agent's shell tool, ``done`` how many tool results the conversation already has.
    Every wire format (Messages, Responses, Chat Completions) extracts these and calls this."""
    sleep_s = sleep_seconds(prompt)
    scripts = scripts_in(prompt)
    if not scripts:
        return Reply(NOTHING_TEXT, sleep_s=sleep_s)
    if done >= len(scripts):
        return Reply(DONE_TEXT, sleep_s=sleep_s)
    return Reply(
        STEP_TEXT.format(step=steps_before(prompt, len(scripts)) + done + 1),
        stop_reason="tool_use",
        tool_name=tool,
        tool_input={"command": scripts[done], "description": "scripted step"},
        sleep_s=sleep_s,
    )


def steps_before(prompt: str, per_iteration: int) -> int:
    """Steps that earlier iterations ran (from ``Iteration i/N.``), so a loop's steps count
    on (1, 2, 3, ... across iterations) instead of each fresh conversation's starting at 1."""
    match = _ITERATION_RE.search(prompt)
    return 0 if match is None else max(int(match.group(1)) - 1, 0) * per_iteration


def side_reply_text(body: dict[str, Any]) -> str:
    """Answer to a side request; honours structured output so e.g. titles parse."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return json.dumps(schema_example(fmt.get("schema")))
    return SIDE_REPLY


def schema_example(schema: object, depth: int = 0) -> object:
    """A small value satisfying a simple JSON schema (required properties only)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    kind = schema.get("type")
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if kind == "object":
        props = schema.get("properties")
        required = schema.get("required")
        if not isinstance(props, dict) or not isinstance(required, list):
            return {}
        return {k: schema_example(props.get(k), depth + 1) for k in required if isinstance(k, str)}
    defaults: dict[object, object] = {
        "string": "Scripted session",
        "integer": 0,
        "number": 0,
        "boolean": False,
        "array": [],
    }
    return defaults.get(kind) if isinstance(kind, str) else None


def shell_tool_name(tools: object) -> str | None:
    """The first offered tool that runs shell commands, if any (makes it an agent turn)."""
    if not isinstance(tools, list):
        return None
    for tool in tools:
        name = tool.get("name") if isinstance(tool, dict) else None
        if isinstance(name, str) and name in SHELL_TOOLS:
            return name
    return None


def first_user_text(messages: object) -> str:
    """All text of the conversation's first user message (string or text blocks)."""
    if not isinstance(messages, list):
        return ""
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    ]
    return "\n".join(parts)


def scripts_in(prompt: str) -> list[str]:
    """The ``<so-script>`` blocks, with ``{i}``/``{n}`` from the first ``Iteration i/N.``."""
    scripts = [s.strip() for s in _SCRIPT_RE.findall(prompt)]
    match = _ITERATION_RE.search(prompt)
    if match is None:
        return scripts
    # str.replace, not str.format: scripts are shell code full of other braces.
    i, n = match.group(1), match.group(2)
    return [s.replace("{i}", i).replace("{n}", n) for s in scripts]


def count_tool_results(messages: object) -> int:
    """How many tool_result blocks the user side already sent = steps already run."""
    if not isinstance(messages, list):
        return 0
    count = 0
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            count += sum(
                1 for b in content if isinstance(b, dict) and b.get("type") == "tool_result"
            )
    return count


def sleep_seconds(prompt: str) -> float:
    match = _SLEEP_RE.search(prompt)
    return min(float(match.group(1)), MAX_SLEEP_S) if match else 0.0


# --- rendering: JSON message or SSE events ---------------------------------------------


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int

    def to_json(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": self.output_tokens,
            "service_tier": "standard",
        }


def estimate_tokens(value: object) -> int:
    """~4 characters per token, like real tokenizers on English and code."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return max(1, len(text) // 4)


def usage_for(body: dict[str, Any], reply: Reply) -> Usage:
    """Plausible usage: everything before the last message counts as a prompt-cache read."""
    raw = body.get("messages")
    messages: list[Any] = raw if isinstance(raw, list) else []
    prefix = {k: v for k, v in body.items() if k in ("system", "tools")}
    if len(messages) > 1:
        cached, fresh = estimate_tokens([prefix, messages[:-1]]), estimate_tokens(messages[-1])
    else:
        cached, fresh = 0, estimate_tokens([prefix, messages])
    return Usage(fresh, estimate_tokens([reply.text, reply.tool_input or ""]), cached)


def content_blocks(reply: Reply, tool_id: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}]
    if reply.tool_name is not None:
        blocks.append(
            {"type": "tool_use", "id": tool_id, "name": reply.tool_name, "input": reply.tool_input}
        )
    return blocks


def message_json(reply: Reply, model: str, usage: Usage) -> dict[str, Any]:
    """The non-streaming response body."""
    return {
        "id": _new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(reply, _new_id("toolu_")),
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": usage.to_json(),
    }


SseEvent = tuple[str, dict[str, Any]]


def _event(name: str, **data: Any) -> SseEvent:
    return name, {"type": name, **data}


def sse_events(reply: Reply, model: str, usage: Usage) -> Iterator[SseEvent]:
    """The streamed response as (event name, data) pairs, in the API's order."""
    start = message_json(reply, model, usage)
    blocks = start.pop("content")
    start.update(content=[], stop_reason=None, usage={**usage.to_json(), "output_tokens": 1})
    yield _event("message_start", message=start)
    yield _event("ping")
    for index, block in enumerate(blocks):
        yield from _block_events(index, block)
    delta = {"stop_reason": reply.stop_reason, "stop_sequence": None}
    yield _event("message_delta", delta=delta, usage={"output_tokens": usage.output_tokens})
    yield _event("message_stop")


def _block_events(index: int, block: dict[str, Any]) -> Iterator[SseEvent]:
    if block["type"] == "text":
        empty: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": c} for c in _chunks(block["text"])]
    else:
        empty = {**block, "input": {}}
        payload = json.dumps(block["input"], ensure_ascii=False)
        # The real API opens with an empty partial_json; clients must concatenate.
        pieces = ["", *_chunks(payload)]
        deltas = [{"type": "input_json_delta", "partial_json": c} for c in pieces]
    yield _event("content_block_start", index=index, content_block=empty)
    for delta in deltas:
        yield _event("content_block_delta", index=index, delta=delta)
    yield _event("content_block_stop", index=index)


def _chunks(text: str, size: int = 24) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def error_json(kind: str, message: str) -> dict[str, Any]:
    """Anthropic's error envelope."""
    return {"type": "error", "error": {"type": kind, "message": message}}


# --- HTTP ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Routed:
    """The answer of a wire-format module (:data:`OTHER_APIS`): JSON or an SSE stream of
    ``(event name or None, data dict or raw string)``."""

    status: int = 200
    json: dict[str, Any] | None = None
    sse: Iterable[tuple[str | None, Any]] | None = None
    sleep_s: float = 0.0


# Path → module with ``handle(body: Any) -> Routed`` (imported on first use).
OTHER_APIS: dict[str, str] = {
    "/v1/responses": "sono.testing.openai_responses",
    "/responses": "sono.testing.openai_responses",
    "/v1/chat/completions": "sono.testing.openai_chat",
    "/chat/completions": "sono.testing.openai_chat",
}


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    body: Any  # parsed JSON, or None when absent/invalid
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, as Node's fetch expects
    timeout = 120  # idle keep-alive connections must not pin a thread forever

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log; tests read ``requests`` instead."""

    def do_POST(self) -> None:
        body = self._read_json()
        path = self._record(body)
        if path == "/v1/messages":
            self._messages(body)
        elif path == "/v1/messages/count_tokens":
            self._send_json(HTTPStatus.OK, {"input_tokens": estimate_tokens(body)})
        elif path in OTHER_APIS:
            self._routed(importlib.import_module(OTHER_APIS[path]).handle(body))
        else:
            self._not_found()

    def _routed(self, routed: Routed) -> None:
        if routed.sleep_s and self.server.owner.stopping.wait(routed.sleep_s):
            self.close_connection = True
            return
        if routed.sse is not None:
            self._send_sse(routed.sse)
        else:
            self._send_json(HTTPStatus(routed.status), routed.json or {})

    def do_GET(self) -> None:
        self._record(None)
        self._not_found()

    do_PUT = do_DELETE = do_PATCH = do_GET

    def do_HEAD(self) -> None:
        # Claude Code probes ``HEAD /`` for connectivity; any answer will do.
        self._record(None)
        self.send_response(HTTPStatus.NOT_FOUND)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _record(self, body: Any) -> str:
        """Record the request; returns its path without the query (Claude adds ?beta=true)."""
        path = self.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in self.headers.items()}  # HTTP names ignore case
        self.server.owner.record(RecordedRequest(self.command, path, body, headers))
        return path

    def _messages(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._send_json(
                HTTPStatus.BAD_REQUEST,
                error_json("invalid_request_error", "body must be JSON with a messages list"),
            )
            return
        reply = plan_reply(body)
        if reply.sleep_s and self.server.owner.stopping.wait(reply.sleep_s):
            # Shutting down: drop the request and the connection rather than answer late.
            self.close_connection = True
            return
        model = body.get("model") if isinstance(body.get("model"), str) else "so-scripted"
        usage = usage_for(body, reply)
        if body.get("stream") is True:
            self._send_sse(sse_events(reply, str(model), usage))
        else:
            self._send_json(HTTPStatus.OK, message_json(reply, str(model), usage))

    def _read_json(self) -> Any:
        raw = self._read_body()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0  # a garbled header reads as an empty body, answered with a 400
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self) -> bytes:
        data = b""
        while True:
            size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return data
            data += self.rfile.read(size)
            self.rfile.readline()

    def _not_found(self) -> None:
        self._send_json(
            HTTPStatus.NOT_FOUND, error_json("not_found_error", f"no route for {self.path}")
        )

    def _send_json(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", _new_id("req_"))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _send_sse(self, events: Iterable[tuple[str | None, Any]]) -> None:
        # Chunked encoding keeps the connection reusable; one chunk per event, flushed.
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", _new_id("req_"))
        self.end_headers()
        try:
            for name, data in events:
                # OpenAI Chat Completions streams unnamed events and a raw "[DONE]".
                head = f"event: {name}\n" if name is not None else ""
                text = data if isinstance(data, str) else json.dumps(data)
                chunk = f"{head}data: {text}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up mid-stream; nothing to do


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a sleeping scripted reply must never block shutdown

    def __init__(self, address: tuple[str, int], owner: ModelServer) -> None:
        super().__init__(address, _Handler)
        self.owner = owner

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Client disconnects are routine for a test server; don't spray tracebacks."""


class ModelServer:
    """The scripted server on 127.0.0.1; ``with ModelServer() as srv: srv.url``."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self._address = (host, port)
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("ModelServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def start(self) -> Self:
        if self._httpd is None:
            self.stopping.clear()
            self._httpd = _Server(self._address, self)
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.05},  # stop() returns in ~50 ms, not 500
                name="so-model-server",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self.stopping.set()  # wakes scripted sleeps
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Scripted Anthropic Messages API server.")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default: any free one)")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    server = ModelServer(port=args.port, host=args.host).start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
