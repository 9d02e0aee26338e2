"""The model gateway on a real Unix socket, in front of real local model servers."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from net_helpers import (
    TIMEOUT_S,
    OriginServer,
    Response,
    exchange,
    json_lines,
    parse_response,
    read_all,
    read_until,
    short_dir,
    unix_connect,
)

from sono.net import gateway as gateway_module
from sono.net.gateway import GatewayThread, Route
from sono.net.policy import NetworkPolicy
from sono.testing.model_server import ModelServer

SECRET = "sk-real-SECRET-0123456789"
PLACEHOLDER = "sk-placeholder"
USAGE_KEYS = {
    "time",
    "route",
    "model",
    "status",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "duration_ms",
    "ttfb_ms",
    "refused",
    "client_left",
    "endpoint",
    "error",
}


@dataclass
class Setup:
    dir: Path
    sock: Path
    usage: Path

    def gateway(self, *routes: Route) -> GatewayThread:
        return GatewayThread(routes, self.sock, self.usage)

    def post(self, path: str, body: dict[str, Any], *extra: str) -> Response:
        data = json.dumps(body).encode()
        head = "\r\n".join(
            [
                f"POST {path} HTTP/1.1",
                "Host: 127.0.0.1:3129",
                "Content-Type: application/json",
                f"x-api-key: {PLACEHOLDER}",
                f"Authorization: Bearer {PLACEHOLDER}",
                f"Proxy-Authorization: Basic {PLACEHOLDER}",
                f"Content-Length: {len(data)}",
                *extra,
            ]
        )
        return exchange(self.sock, head.encode() + b"\r\n\r\n" + data)

    def assert_secret_never_logged(self) -> None:
        for path in self.dir.rglob("*"):
            if path.is_file():
                assert SECRET not in path.read_text(errors="replace"), path


@pytest.fixture
def setup() -> Iterator[Setup]:
    with short_dir() as d:
        yield Setup(d, d / "gateway.sock", d / "logs" / "usage.jsonl")


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


def sse_events(body: bytes) -> list[dict[str, Any]]:
    events = []
    for block in body.decode().split("\n\n"):
        data = [line[5:].strip() for line in block.splitlines() if line.startswith("data:")]
        if data and data != ["[DONE]"]:
            events.append(json.loads("\n".join(data)))
    return events


def assert_placeholder_replaced(headers: dict[str, str]) -> None:
    assert "proxy-authorization" not in headers
    assert all(PLACEHOLDER not in v for v in headers.values())


# --- Anthropic Messages ------------------------------------------------------------------


def test_anthropic_sse_gets_the_real_key_and_usage_is_recorded(
    setup: Setup, model_server: ModelServer
) -> None:
    route = Route("/anthropic", model_server.url, "x-api-key", SECRET, "anthropic")
    body = {
        "model": "claude-test",
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "hello there, this is a test prompt"}],
    }
    with setup.gateway(route):
        response = setup.post("/anthropic/v1/messages?beta=true", body)
    assert response.status == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert SECRET.encode() not in response.raw
    [seen] = model_server.requests
    assert seen.path == "/v1/messages"
    assert seen.body == body
    assert seen.headers["x-api-key"] == SECRET
    assert "authorization" not in seen.headers
    assert seen.headers["host"] == model_server.url.removeprefix("http://")
    assert_placeholder_replaced(seen.headers)

    events = sse_events(response.body)
    start = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
    delta = next(e for e in events if e["type"] == "message_delta")["usage"]
    [line] = json_lines(setup.usage)
    assert set(line) == USAGE_KEYS
    assert line["route"] == "/anthropic"
    assert line["model"] == "claude-test"
    assert line["status"] == 200
    assert line["input_tokens"] == start["input_tokens"] > 0
    assert line["output_tokens"] == delta["output_tokens"] > 1  # the delta's, not the start's 1
    assert line["cache_read_tokens"] == start["cache_read_input_tokens"]
    assert line["cache_write_tokens"] == 0
    assert 0 <= line["ttfb_ms"] <= line["duration_ms"]
    setup.assert_secret_never_logged()


def test_anthropic_json_usage(setup: Setup, model_server: ModelServer) -> None:
    route = Route("/anthropic", model_server.url, "x-api-key", SECRET, "anthropic")
    messages = [
        {"role": "user", "content": "first question " * 20},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "second"},
    ]
    body = {"model": "claude-json", "max_tokens": 50, "messages": messages}
    with setup.gateway(route):
        response = setup.post("/anthropic/v1/messages", body)
    assert response.status == 200
    usage = response.json()["usage"]
    [line] = json_lines(setup.usage)
    assert line["model"] == "claude-json"
    assert line["input_tokens"] == usage["input_tokens"]
    assert line["output_tokens"] == usage["output_tokens"]
    assert line["cache_read_tokens"] == usage["cache_read_input_tokens"] > 0


# --- OpenAI --------------------------------------------------------------------------------


def test_openai_responses_sse_uses_bearer_and_records_usage(
    setup: Setup, model_server: ModelServer
) -> None:
    route = Route("/openai", model_server.url + "/v1", "bearer", SECRET, "openai")
    body = {"model": "gpt-test", "input": "say something " * 10, "stream": True}
    with setup.gateway(route):
        response = setup.post("/openai/responses", body)
    assert response.status == 200
    [seen] = model_server.requests
    assert seen.path == "/v1/responses"  # the upstream's base path is kept
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    assert "x-api-key" not in seen.headers
    assert_placeholder_replaced(seen.headers)
    completed = next(e for e in sse_events(response.body) if e["type"] == "response.completed")
    usage = completed["response"]["usage"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    [line] = json_lines(setup.usage)
    assert line["route"] == "/openai"
    assert line["model"] == "gpt-test"
    assert line["input_tokens"] == usage["input_tokens"] - cached
    assert line["output_tokens"] == usage["output_tokens"] > 0
    assert line["cache_read_tokens"] == cached
    setup.assert_secret_never_logged()


@pytest.mark.parametrize("stream", [True, False])
def test_openai_chat_completions_usage(
    setup: Setup, model_server: ModelServer, stream: bool
) -> None:
    route = Route("/openai", model_server.url + "/v1", "bearer", SECRET, "openai")
    body: dict[str, Any] = {
        "model": "gpt-chat",
        "messages": [{"role": "user", "content": "tell me a story " * 10}],
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    with setup.gateway(route):
        response = setup.post("/openai/chat/completions", body)
    assert response.status == 200
    if stream:
        usage = next(e["usage"] for e in sse_events(response.body) if e.get("usage"))
    else:
        usage = response.json()["usage"]
    [line] = json_lines(setup.usage)
    assert line["model"] == "gpt-chat"
    assert line["input_tokens"] == usage["prompt_tokens"] > 0
    assert line["output_tokens"] == usage["completion_tokens"] > 0
    assert line["cache_read_tokens"] == 0
    assert model_server.requests[0].headers["authorization"] == f"Bearer {SECRET}"


# --- streaming is unbuffered ------------------------------------------------------------


class HeldStream:
    """An upstream that sends the SSE head and first event, then holds the rest until
    ``release`` is set (or 5 s pass)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.finished = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def _chunk(event: str, data: dict[str, Any]) -> bytes:
        text = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
        return b"%x\r\n%s\r\n" % (len(text), text)

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            head, rest = read_until(conn, b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(rest) < length:
                rest += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            message = {"model": "claude-held", "usage": {"input_tokens": 11, "output_tokens": 1}}
            conn.sendall(
                self._chunk("message_start", {"type": "message_start", "message": message})
            )
            self.release.wait(5)
            delta = {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 42}}
            conn.sendall(self._chunk("message_delta", delta))
            conn.sendall(self._chunk("message_stop", {"type": "message_stop"}))
            conn.sendall(b"0\r\n\r\n")
            self.finished.set()
        self.listener.close()


def test_sse_reaches_the_client_before_the_upstream_finishes(setup: Setup) -> None:
    upstream = HeldStream()
    route = Route(
        "/anthropic", f"http://127.0.0.1:{upstream.port}", "x-api-key", SECRET, "anthropic"
    )
    with setup.gateway(route):
        sock = unix_connect(setup.sock)
        data = b'{"model": "claude-held", "stream": true}'
        sock.sendall(
            b"POST /anthropic/v1/messages HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
            % (len(data), data)
        )
        first, rest = read_until(sock, b'"message_start"')
        first, rest = read_until(sock, b"\n\n", first + rest)
        # The first event is here while the upstream is still holding the rest back.
        assert not upstream.finished.is_set()
        assert b"HTTP/1.1 200 " in first
        upstream.release.set()
        response = parse_response(read_all(sock, first + rest))
        sock.close()
    upstream.thread.join(TIMEOUT_S)
    assert [e["type"] for e in sse_events(response.body)] == [
        "message_start",
        "message_delta",
        "message_stop",
    ]
    [line] = json_lines(setup.usage)
    assert (line["input_tokens"], line["output_tokens"]) == (11, 42)
    assert line["model"] == "claude-held"
    assert line["ttfb_ms"] <= line["duration_ms"]


def test_a_client_that_hangs_up_mid_answer_is_still_measured(setup: Setup) -> None:
    """The agent reads the head and closes: the upstream served (and bills) the whole
    answer, so the gateway reads it on to the end and logs its usage — a hang-up never
    makes a model call free for --max-tokens."""
    upstream = HeldStream()
    route = Route(
        "/anthropic", f"http://127.0.0.1:{upstream.port}", "x-api-key", SECRET, "anthropic"
    )
    with setup.gateway(route) as thread:
        sock = unix_connect(setup.sock)
        data = b'{"model": "claude-held", "stream": true}'
        sock.sendall(
            b"POST /anthropic/v1/messages HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
            % (len(data), data)
        )
        read_until(sock, b'"message_start"')
        sock.close()  # gone before the end of the answer
        upstream.release.set()
        upstream.thread.join(TIMEOUT_S)
        for _ in range(100):
            if json_lines(setup.usage):
                break
            time.sleep(0.05)
        thread.gateway.flush()
    [line] = json_lines(setup.usage)
    assert (line["input_tokens"], line["output_tokens"]) == (11, 42)
    assert line["client_left"] is True


def test_usage_lines_are_bounded_and_a_longer_one_marks_the_read_incomplete(
    setup: Setup,
) -> None:
    """An upstream that echoes a 5,000-character model name must not make its line longer
    than so reads (it would be skipped: tokens lost); a line that is anyway marks the
    iteration's usage incomplete."""
    from sono.net.gateway import _Exchange
    from sono.net.session import MAX_LOG_LINE, NetSession, Offsets

    record = _Exchange(request_model="m" * 5000).record()
    assert len(str(record["model"])) <= 200
    session = NetSession(setup.dir, NetworkPolicy(mode="none"), ())
    session.usage_log = setup.usage
    setup.usage.parent.mkdir(parents=True, exist_ok=True)
    long = json.dumps({"model": "x" * MAX_LOG_LINE, "input_tokens": 5, "output_tokens": 5})
    setup.usage.write_text(long + "\n")
    assert session.since(Offsets(0, 0)).incomplete


# --- request bodies ---------------------------------------------------------------------------


def test_chunked_request_body_is_forwarded(setup: Setup, model_server: ModelServer) -> None:
    route = Route("/anthropic", model_server.url, "x-api-key", SECRET, "anthropic")
    body = {
        "model": "claude-chunked",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
    }
    data = json.dumps(body).encode()
    pieces = [data[:7], data[7:30], data[30:]]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    head = b"POST /anthropic/v1/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
    with setup.gateway(route):
        with unix_connect(setup.sock) as sock:
            sock.sendall(head + b"Expect: 100-continue\r\n\r\n" + chunked)
            raw = read_all(sock)
        # Chunk extensions are refused, as by the proxy: where they end is what a smuggled
        # second request hides in.
        extended = exchange(setup.sock, head + b"\r\n" + chunked.replace(b"\r\n", b";x\r\n", 1))
    assert extended.status == 400  # the upstream got the head, never the body's end
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    response = parse_response(raw.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n"))
    assert response.status == 200
    assert model_server.requests[0].body == body
    assert json_lines(setup.usage)[0]["model"] == "claude-chunked"


def test_large_content_length_body_streams_through(setup: Setup) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB
    with OriginServer() as origin:
        route = Route("/other", f"http://127.0.0.1:{origin.port}/base", "bearer", SECRET, "openai")
        head = (
            f"POST /other/responses?x=1 HTTP/1.1\r\nContent-Length: {len(payload)}\r\n"
            f"x-api-key: {PLACEHOLDER}\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\n\r\n"
        )
        with setup.gateway(route):
            response = exchange(setup.sock, head.encode() + payload)
        [seen] = origin.seen
    assert response.status == 200
    assert response.body == b"origin saw POST /base/responses?x=1\n" + payload
    assert seen.body == payload
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    assert "x-api-key" not in seen.headers
    assert "x-hop" not in seen.headers  # named in Connection: hop-by-hop
    assert seen.headers["connection"] == "close"
    [line] = json_lines(setup.usage)
    assert line["status"] == 200
    assert line["input_tokens"] is None  # not a model response: nothing invented


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (
            "POST /a/responses HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        ("POST /a/responses HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        ("POST /a/responses HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
        ("POST /a/responses HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        # Not ASCII digits: ² (int() fails) and ٣ (int() reads 3, a peer may not).
        ("POST /a/responses HTTP/1.1\r\nContent-Length: \u00b2\r\n\r\nab", 400),
        ("POST /a/responses HTTP/1.1\r\nContent-Length: \u0663\r\n\r\nabc", 400),
        ("GET http://example.com/a/responses HTTP/1.1\r\n\r\n", 400),
        ("POST /a/responses HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort", 400),
        # The body streams: garbage in it shows only after the upstream got the head.
        ("POST /a/responses HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    ],
)
def test_bad_requests(setup: Setup, head: str, status: int) -> None:
    streamed = "short" in head or "zz" in head
    with OriginServer() as origin:
        route = Route("/a", f"http://127.0.0.1:{origin.port}", "bearer", SECRET, "openai")
        with setup.gateway(route), unix_connect(setup.sock) as sock:
            sock.sendall(head.encode("utf-8"))
            sock.shutdown(socket.SHUT_WR)
            response = parse_response(read_all(sock))
        if not streamed:
            assert origin.seen == []
    assert response.status == status
    assert response.json()["type"] == "error"
    assert json_lines(setup.usage)[0]["status"] == status


# --- errors ---------------------------------------------------------------------------------------


def test_unknown_prefix_is_404_json(setup: Setup, model_server: ModelServer) -> None:
    route = Route("/anthropic", model_server.url, "x-api-key", SECRET, "anthropic")
    with setup.gateway(route):
        response = setup.post("/anthropicx/v1/messages", {"model": "m"})
    assert response.status == 404
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["type"] == "not_found_error"
    assert model_server.requests == []
    [line] = json_lines(setup.usage)
    assert (line["route"], line["status"]) == (None, 404)


def test_unreachable_upstream_is_502_json(setup: Setup) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connection refused
        route = Route("/anthropic", f"http://127.0.0.1:{port}", "x-api-key", SECRET, "anthropic")
        with setup.gateway(route):
            response = setup.post("/anthropic/v1/messages", {"model": "m"})
    assert response.status == 502
    assert "unreachable" in response.json()["error"]["message"]
    assert SECRET.encode() not in response.raw
    [line] = json_lines(setup.usage)
    assert (line["route"], line["status"]) == ("/anthropic", 502)


def test_longest_prefix_wins(setup: Setup) -> None:
    with OriginServer() as a, OriginServer() as b:
        routes = (
            Route("/x", f"http://127.0.0.1:{a.port}", "bearer", "key-a", "openai"),
            Route("/x/y", f"http://127.0.0.1:{b.port}", "x-api-key", "key-b", "openai"),
        )
        with setup.gateway(*routes):
            assert setup.post("/x/y/responses", {}).body.startswith(b"origin saw POST /responses")
            assert setup.post("/x/responses", {}).body.startswith(b"origin saw POST /responses")
            assert setup.post("/x/models", {}).status == 404  # GET only
        assert [r.headers.get("x-api-key") for r in b.seen] == ["key-b"]
        assert [r.headers.get("authorization") for r in a.seen] == ["Bearer key-a"]


def test_route_validation_and_repr_hides_the_key() -> None:
    route = Route("/anthropic", "https://api.anthropic.com", "x-api-key", SECRET, "anthropic")
    assert SECRET not in repr(route)
    assert route.target("/anthropic/v1/messages", "beta=true") == "/v1/messages?beta=true"
    bad: list[tuple[str, str, Any, str, Any]] = [
        ("anthropic", "https://api.anthropic.com", "x-api-key", "k", "anthropic"),
        ("/anthropic/", "https://api.anthropic.com", "x-api-key", "k", "anthropic"),
        ("/a", "ftp://api.anthropic.com", "x-api-key", "k", "anthropic"),
        ("/a", "https://api.anthropic.com", "basic", "k", "anthropic"),
        ("/a", "https://api.anthropic.com", "bearer", "", "anthropic"),
        ("/a", "https://api.anthropic.com", "bearer", "k\r\nX-Injected: 1", "anthropic"),
        ("/a", "https://api.anthropic.com", "bearer", "k", "any"),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            Route(*args)


# --- HTTPS upstream ---------------------------------------------------------------------------


def test_https_upstream_verified_with_ssl_cert_file(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI to make a test certificate")
    cert, key = setup.dir / "cert.pem", setup.dir / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with OriginServer(tls) as origin:
        route = Route("/secure", f"https://localhost:{origin.port}", "bearer", SECRET, "openai")
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with setup.gateway(route):
            untrusted = setup.post("/secure/responses", {})
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        with setup.gateway(route):
            trusted = setup.post("/secure/responses", {})
        [seen] = origin.seen
    assert untrusted.status == 502  # the certificate is verified...
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.json()["error"]["message"]
    assert trusted.status == 200  # ...against SSL_CERT_FILE
    assert trusted.body == b"origin saw POST /responses\n{}"
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    assert seen.headers["host"] == f"localhost:{origin.port}"


# --- only the model API endpoints are forwarded ----------------------------------------------

REFUSED = [
    ("GET", "/anthropic/v1/messages", 404),  # a model path, the wrong method
    ("DELETE", "/anthropic/v1/files/file_1", 404),
    ("PUT", "/anthropic/v1/messages", 404),
    ("POST", "/anthropic/v1/messages/batches", 404),
    ("GET", "/anthropic/v1/organizations/api_keys", 404),
    ("POST", "/anthropic/v1/messages/../../../admin", 403),
    ("POST", "/anthropic/v1/messages/%2e%2e/%2e%2e/admin", 403),
    ("POST", "/anthropic/v1/%2E%2E/%2e%2e/admin", 403),
    ("POST", "/anthropic/v1/messages%2f..%2f..%2fadmin", 403),
    ("POST", "/anthropic/v1/messages\\..\\..\\admin", 403),
    ("POST", "/anthropic//v1/messages", 403),
    ("POST", "/anthropic/v1//messages", 403),
    ("POST", "/anthropic/./v1/messages", 403),
    ("POST", "/anthropic/v1/messages/", 403),
    ("POST", "/anthropic/v1/messages;jsessionid=1", 403),
    ("POST", "/anthropic/v1/messages/.", 403),
    ("GET", "/anthropic/v1/models/..", 403),
    ("GET", "/anthropic/v1/models/%2e%2e", 403),
    ("GET", "/anthropic/v1/models/a/b", 404),
    ("POST", "/anthropic", 403),
    ("HEAD", "/anthropic", 403),
    ("POST", "/anthropic/v1/messages?x=1#frag", 403),
    ("POST", "/anthropic/v1/messages?x=a\\b", 403),
    ("POST", "/anthropic/v1/messages?" + "a" * 3000, 403),
    ("POST", "/anthropic/V1/MESSAGES", 404),
    ("post", "/anthropic/v1/messages", 404),
    ("POST", "/anthropic/v1/m\xe9ssages", 403),
    ("POST", "/anthropic/responses", 404),
]


@pytest.mark.parametrize(("method", "target", "status"), REFUSED)
def test_only_model_endpoints_are_forwarded(
    setup: Setup, method: str, target: str, status: int
) -> None:
    """Nothing but the allow-listed (method, path) reaches the upstream: no other API of
    the provider with the real key, no path outside the configured base."""
    with OriginServer() as origin:
        route = Route(
            "/anthropic", f"http://127.0.0.1:{origin.port}/base", "x-api-key", SECRET, "anthropic"
        )
        request = (
            f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{origin.port}\r\n"
            "Content-Length: 2\r\n\r\n{}"
        )
        with setup.gateway(route):
            response = exchange(setup.sock, request.encode("latin-1"))
        assert origin.seen == []
    assert response.status == status
    assert response.json()["type"] == "error"
    assert SECRET.encode() not in response.raw
    [line] = json_lines(setup.usage)
    assert (line["route"], line["status"]) == ("/anthropic", status)
    assert line["refused"] and len(line["refused"]) <= 200
    assert "\n" not in line["refused"]
    setup.assert_secret_never_logged()


ALLOWED = [
    ("anthropic", "POST", "/v1/messages?beta=true"),
    ("anthropic", "POST", "/v1/messages/count_tokens"),
    ("anthropic", "GET", "/v1/models"),
    ("anthropic", "GET", "/v1/models/claude-sonnet-4-5@20250929"),
    ("openai", "POST", "/responses"),
    ("openai", "POST", "/responses/compact"),
    ("openai", "POST", "/chat/completions"),
    ("openai", "GET", "/models?client_version=0.171.0"),
    ("openai", "GET", "/models/gpt-5.1-codex"),
]


@pytest.mark.parametrize(("api", "method", "rest"), ALLOWED)
def test_model_endpoints_reach_the_upstream_base(
    setup: Setup, api: Any, method: str, rest: str
) -> None:
    with OriginServer() as origin:
        route = Route("/gw", f"http://127.0.0.1:{origin.port}/base", "bearer", SECRET, api)
        request = (
            f"{method} /gw{rest} HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        with setup.gateway(route):
            response = exchange(setup.sock, request.encode())
        [seen] = origin.seen
    assert response.status == 200
    assert seen.path == "/base" + rest
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    assert seen.headers["host"] == f"127.0.0.1:{origin.port}"
    assert json_lines(setup.usage)[0]["refused"] is None


def test_oversized_bodies_are_refused(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Content-Length over the limit never reaches the upstream; a chunked body that
    grows past it is cut off (the upstream never sees its end) and answered 413."""
    monkeypatch.setattr(gateway_module, "MAX_REQUEST_BODY", 4096)
    with OriginServer() as origin:
        route = Route("/a", f"http://127.0.0.1:{origin.port}", "bearer", SECRET, "openai")
        with setup.gateway(route):
            declared = exchange(
                setup.sock, b"POST /a/responses HTTP/1.1\r\nContent-Length: 4097\r\n\r\n"
            )
            piece = b"x" * 1000
            chunked = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(6))
            streamed = exchange(
                setup.sock,
                b"POST /a/responses HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
            )
            small = exchange(
                setup.sock,
                b"POST /a/responses HTTP/1.1\r\nContent-Length: 4096\r\n\r\n"
                + piece * 4
                + b"x" * 96,
            )
        # The chunked head went up before its body grew too big; no body over the limit did.
        assert [s.body for s in origin.seen if s.body] == [piece * 4 + b"x" * 96]
    assert (declared.status, streamed.status, small.status) == (413, 413, 200)
    assert [line["status"] for line in json_lines(setup.usage)] == [413, 413, 200]


def test_an_upstream_that_closes_early_does_not_hide_the_body_limit(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upstream answers right after the head and hangs up: writing the body to it
    fails, yet the client's body is still read and judged — over the limit is a 413 (it
    was, at random, no answer at all: the failure passed for the client leaving)."""
    monkeypatch.setattr(gateway_module, "MAX_REQUEST_BODY", 4096)
    listener = socket.create_server(("127.0.0.1", 0))

    def early() -> None:
        conn, _ = listener.accept()
        with conn:
            read_until(conn, b"\r\n\r\n")
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        listener.close()

    threading.Thread(target=early, daemon=True).start()
    port = listener.getsockname()[1]
    route = Route("/a", f"http://127.0.0.1:{port}", "bearer", SECRET, "openai")
    piece = b"x" * 1000
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    with setup.gateway(route), unix_connect(setup.sock) as sock:
        sock.sendall(b"POST /a/responses HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk)
        time.sleep(0.3)  # the upstream has answered and closed by now
        sock.sendall(chunk * 5)
        response = parse_response(read_all(sock))
    assert response.status == 413


def test_a_flood_of_refused_requests_is_counted_not_logged_line_by_line(setup: Setup) -> None:
    """The agent decides how many requests it sends: past MAX_QUIET_LINES the lines that
    carry no tokens are only counted (one line per read), so a flood cannot push the
    lines the budget needs past what so reads — nor grow the host's log without bound."""
    from sono.net import gateway as gw
    from sono.net.session import NetSession, Offsets

    sent = gw.MAX_QUIET_LINES + 200
    route = Route("/anthropic", "http://127.0.0.1:9", "x-api-key", SECRET, "anthropic")
    with setup.gateway(route) as thread:
        for _ in range(sent):
            with unix_connect(setup.sock) as sock:
                sock.sendall(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.shutdown(socket.SHUT_WR)
                assert parse_response(read_all(sock)).status == 404
        thread.gateway.flush()
    lines = json_lines(setup.usage)
    assert len(lines) == gw.MAX_QUIET_LINES + 1
    assert lines[-1]["suppressed"] == 200 and lines[-1]["refused_count"] == 200
    session = NetSession(setup.dir, NetworkPolicy(mode="none"), ())
    session.usage_log = setup.usage
    log = session.since(Offsets(0, 0))
    assert (log.requests, log.refused, log.incomplete) == (sent, sent, False)


# --- credentials as the agent's own config names them --------------------------------------


class _Source:
    """A credential fetched per request (an OAuth login, a key helper)."""

    def __init__(self, *values: str | Exception) -> None:
        self.values = list(values)
        self.calls = 0

    def token(self) -> str:
        self.calls += 1
        value = self.values.pop(0)
        if isinstance(value, Exception):
            raise value
        return value


def test_azure_api_key_header_and_extra_headers_replace_the_clients(
    setup: Setup, model_server: ModelServer
) -> None:
    route = Route(
        "/azure",
        model_server.url + "/v1",
        "api-key",
        SECRET,
        "openai",
        (("chatgpt-account-id", "acct-real"), ("X-Org", "org-1")),
    )
    body = {"model": "gpt-test", "input": "hi"}
    with setup.gateway(route):
        response = setup.post("/azure/responses", body, "chatgpt-account-id: acct-placeholder")
    assert response.status == 200
    [seen] = model_server.requests
    assert seen.headers["api-key"] == SECRET
    assert "x-api-key" not in seen.headers and "authorization" not in seen.headers
    assert seen.headers["chatgpt-account-id"] == "acct-real"
    assert seen.headers["x-org"] == "org-1"
    assert_placeholder_replaced(seen.headers)
    assert "acct-real" not in repr(route)


def test_a_key_helpers_key_goes_as_both_headers(setup: Setup, model_server: ModelServer) -> None:
    route = Route("/anthropic", model_server.url, "x-api-key+bearer", SECRET, "anthropic")
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    with setup.gateway(route):
        assert setup.post("/anthropic/v1/messages", body).status == 200
    [seen] = model_server.requests
    assert seen.headers["x-api-key"] == SECRET
    assert seen.headers["authorization"] == f"Bearer {SECRET}"


def test_a_route_without_credential_sends_none_of_the_clients(
    setup: Setup, model_server: ModelServer
) -> None:
    route = Route("/ollama", model_server.url + "/v1", "none", "", "openai")
    with setup.gateway(route):
        assert setup.post("/ollama/chat/completions", {"model": "m", "messages": []}).status
    [seen] = model_server.requests
    assert not {"x-api-key", "authorization", "api-key"} & set(seen.headers)


def test_a_dynamic_credential_is_asked_per_request_and_its_failure_is_a_401(
    setup: Setup, model_server: ModelServer
) -> None:
    from sono.net.upstream import CredentialError

    source = _Source(
        "tok-1-" + SECRET, CredentialError("~/.x/auth.json: the login expired; log in again")
    )
    route = Route("/anthropic", model_server.url, "bearer", source, "anthropic")
    body = {"model": "claude-test", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    with setup.gateway(route):
        first = setup.post("/anthropic/v1/messages", body)
        second = setup.post("/anthropic/v1/messages", body)
    assert first.status == 200 and source.calls == 2
    assert model_server.requests[0].headers["authorization"] == f"Bearer tok-1-{SECRET}"
    assert len(model_server.requests) == 1  # the failed credential never went upstream
    assert second.status == 401
    assert b"the login expired" not in second.body  # the reason is the user's, not the agent's
    assert b"credential of this route is not available" in second.body
    [_, refused] = json_lines(setup.usage)
    assert refused["status"] == 401 and "login expired" in refused["refused"]
    setup.assert_secret_never_logged()


def test_an_upstream_error_message_is_in_the_usage_line(setup: Setup) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answer = json.dumps({"type": "error", "error": {"message": "invalid x-api-key"}}).encode()

    class Refusing(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    origin = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{origin.server_address[1]}"
        route = Route("/anthropic", url, "x-api-key", SECRET, "anthropic")
        with setup.gateway(route):
            response = setup.post("/anthropic/v1/messages", {"model": "m", "messages": []})
    finally:
        origin.shutdown()
    assert response.status == 401
    [line] = json_lines(setup.usage)
    assert line["error"] == "invalid x-api-key"
    assert line["endpoint"] == "POST /v1/messages"
