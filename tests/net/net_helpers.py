"""Helpers for the sono.net tests: short socket directories, raw HTTP over Unix sockets,
tiny local TCP servers and a fake resolver."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import shutil
import socket
import socketserver
import ssl
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sono.net.http1 import ChunkedBody
from sono.net.policy import IPAddress

TIMEOUT_S = 10.0


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under ~107 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="so-net-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class FakeResolver:
    """``await resolver(host, port)`` from a table; records every lookup."""

    def __init__(self, table: Mapping[str, list[str]]) -> None:
        self.table = {k: [ipaddress.ip_address(a) for a in v] for k, v in table.items()}
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.calls.append(host)
        if host not in self.table:
            raise OSError(f"no such host {host}")
        return self.table[host]


def unix_connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT_S)
    sock.connect(str(path))
    return sock


def read_until(sock: socket.socket, marker: bytes, buf: bytes = b"") -> tuple[bytes, bytes]:
    """Read until ``marker``: (everything up to and including it, the bytes after)."""
    while marker not in buf:
        data = sock.recv(65536)
        if not data:
            raise EOFError(f"EOF before {marker!r}; got {buf[:300]!r}")
        buf += data
    end = buf.index(marker) + len(marker)
    return buf[:end], buf[end:]


def read_all(sock: socket.socket, buf: bytes = b"") -> bytes:
    while True:
        data = sock.recv(65536)
        if not data:
            return buf
        buf += data


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes  # de-chunked
    raw: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def parse_response(raw: bytes) -> Response:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = dechunk(body)
    return Response(status, headers, body, raw)


def dechunk(data: bytes, max_size: int | None = None) -> bytes:
    """The payload of the chunked body ``data`` (which must end it), read by so's own
    :class:`~sono.net.http1.ChunkedBody`."""

    async def read() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        body = ChunkedBody(reader, TIMEOUT_S, max_size)
        parts = []
        while piece := await body.read():
            parts.append(piece)
        return b"".join(parts)

    return asyncio.run(read())


def exchange(path: Path, request: bytes) -> Response:
    """Send a raw request over the Unix socket and read the response until EOF."""
    with unix_connect(path) as sock:
        sock.sendall(request)
        return parse_response(read_all(sock))


def json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- tiny local servers ----------------------------------------------------------------


@dataclass
class _Counter:
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    request_queue_size = 256  # the default 5 drops connections under the concurrency test


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up mid-answer is part of some tests; no tracebacks."""


class EchoServer:
    """TCP echo on 127.0.0.1 (each connection echoes until EOF); counts connections."""

    def __init__(self) -> None:
        counter = _Counter()
        self.counter = counter

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with counter.lock:
                    counter.connections += 1
                sock: socket.socket = self.request
                while data := sock.recv(65536):
                    sock.sendall(data)

        self._server = _TCPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]

    @property
    def connections(self) -> int:
        with self.counter.lock:
            return self.counter.connections

    def __enter__(self) -> Self:
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes


class OriginServer:
    """A plain HTTP/1.1 origin on 127.0.0.1 that records requests and answers
    ``origin saw METHOD PATH`` (echoing any request body after it)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        seen: list[SeenRequest] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                seen.append(SeenRequest(self.command, self.path, headers, body))
                reply = f"origin saw {self.command} {self.path}\n".encode() + body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = _answer

        self._server = _HTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]

    def __enter__(self) -> Self:
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
