"""The host-side egress proxy: an asyncio HTTP proxy on a Unix socket.

The sandbox has no network; this socket (bound into it, and exposed on 127.0.0.1 there by
:mod:`sono.net.forward`) is its only way out. Two request forms are served:

- ``CONNECT host:port`` (HTTPS and any other TCP): answered ``200 Connection Established``
  and then spliced both ways;
- absolute-form plain HTTP (``GET http://host/path HTTP/1.1``): rewritten to origin-form
  with ``Connection: close`` (one request per connection) and spliced.

Every target is checked with :func:`sono.net.policy.precheck` before any DNS lookup, then
resolved once here and checked with :func:`sono.net.policy.decide`; the connection goes to
one of exactly the addresses that were checked, never to a fresh lookup (no DNS rebinding
between check and use). A denial is answered ``403`` and appended to ``log_path`` as one
JSON line ``{"time", "host", "port", "reason"}``. Origin-form requests (the proxy used as
a web server) and a ``Host`` header naming another host than the target are ``400``.

Hosts that a secret is bound to (:mod:`sono.net.secrets`) are the exception to opaque
tunnels: after the same checks, the proxy answers the ``CONNECT`` and ends the client's
TLS itself with a certificate for the host from the session's
:class:`sono.net.tls.SessionCA` (ALPN ``http/1.1`` only). It then reads the HTTP/1.1
requests of the connection one by one (keep-alive), replaces the placeholders of secrets
bound to that host in header values (bodies only with ``substitute_body=True``; never in
the request line, which servers echo back: a placeholder there is a logged ``403``),
refuses with ``403`` (logged like a denial) a request carrying the placeholder of a
secret *not* bound to it, and forwards the rest over a TLS
connection of its own to one of the checked addresses (verified with the default
context, which honours ``SSL_CERT_FILE``), streaming each response back as it arrives.
The upstream is connected only once a request has passed. A placeholder in a plain-HTTP
request is refused too: secrets go only over HTTPS.

:class:`ProxyThread` runs it on its own event loop thread for synchronous callers;
:class:`ServerThread` and the small HTTP/1.1 head helpers are shared with
:mod:`sono.net.gateway`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, Self
from urllib.parse import urlsplit

from sono.net.policy import IPAddress, NetworkPolicy, decide, normalize_host, precheck
from sono.net.secrets import BoundSecret, Unbound, bound_to, placeholders_in, substitute

if TYPE_CHECKING:
    from sono.net.tls import SessionCA

log = logging.getLogger("sono.net")

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
RESOLVE_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 600.0
CLOSE_GRACE_S = 5.0
BUFFER = 64 * 1024
MAX_SUBSTITUTED_BODY = 8 * 1024 * 1024
# Everything the sandbox sends is hostile input, and these servers run in the host's `so`:
# at most this many connections are served at once per server (more wait in the kernel's
# backlog, and beyond it are refused), so a flood cannot use up the process's descriptors.
MAX_CONNECTIONS = 128
BACKLOG = 256
ACCEPT_PAUSE_S = 0.2  # after a failed accept (EMFILE, ENFILE, ENOBUFS): rest, then go on
# The denial log: fields are cut, a repeated denial is counted rather than written again,
# at most MAX_DENY_KEYS distinct ones are logged one by one, and once MAX_DENY_LOG_BYTES
# have been written only one summary line per flush is.
MAX_DENY_KEYS = 256
MAX_DENY_LOG_BYTES = 4 * 1024 * 1024
MAX_REASON = 300
MAX_HOST = 253
DENY_FLUSH_S = 30.0
CONNECT_OK = b"HTTP/1.1 200 Connection Established\r\n\r\n"

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]

_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VERSION_RE = re.compile(r"HTTP/1\.[01]")
_BAD_VALUE_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_CHUNK_SIZE_RE = re.compile(rb"[0-9A-Fa-f]{1,16}")
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    }
)


# --- HTTP/1.1 heads (shared with the gateway) ------------------------------------------


class HttpError(Exception):
    """Answer the client ``status`` with ``message`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Head:
    """A request head (``start`` = method, target, version) or a response head
    (``start`` = version, status, reason); header names keep their case."""

    start: tuple[str, str, str]
    headers: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        lower = name.lower()
        return [v for k, v in self.headers if k.lower() == lower]

    def get(self, name: str) -> str | None:
        found = self.values(name)
        return found[0] if found else None

    def tokens(self, name: str) -> set[str]:
        """Comma-separated tokens of every ``name`` header, lower-cased."""
        return {t.strip().lower() for v in self.values(name) for t in v.split(",") if t.strip()}


async def read_head(reader: asyncio.StreamReader, timeout: float, what: str = "request") -> bytes:
    """Bytes up to and including the blank line; ``b""`` on EOF before the first byte.
    The reader's ``limit`` caps the size (431 beyond it)."""
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return b""
        raise HttpError(400, f"incomplete {what} head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"{what} head larger than {MAX_HEAD} bytes") from None
    except TimeoutError:
        raise HttpError(408, f"no complete {what} head within {timeout:g}s") from None


def parse_head(data: bytes, *, response: bool = False) -> Head:
    """Strict parse: CRLF line ends, token header names, no folding, no control bytes."""
    lines = data.decode("latin-1").removesuffix("\r\n\r\n").split("\r\n")
    if any("\n" in line or "\r" in line for line in lines):
        raise HttpError(400, "bare CR or LF in head")
    parts = lines[0].split(" ", 2)
    if response:
        if len(parts) < 2 or not _VERSION_RE.fullmatch(parts[0]) or not parts[1].isdigit():
            raise HttpError(502, "malformed response status line")
        start = (parts[0], parts[1], parts[2] if len(parts) > 2 else "")
    else:
        if len(parts) != 3 or not _TOKEN_RE.fullmatch(parts[0]) or " " in parts[2]:
            raise HttpError(400, "malformed request line")
        if not _VERSION_RE.fullmatch(parts[2]) or not parts[1]:
            raise HttpError(400, "malformed request line (HTTP/1.0 or 1.1 only)")
        start = (parts[0], parts[1], parts[2])
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN_RE.fullmatch(name):
            raise HttpError(400, f"malformed header line {line[:80]!r}")
        value = value.strip(" \t")
        if _BAD_VALUE_RE.search(value):
            raise HttpError(400, f"control character in header {name}")
        headers.append((name, value))
    return Head(start, tuple(headers))


def render_head(start: str, headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [start, *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def simple_response(status: int, body: str, content_type: str = "text/plain") -> bytes:
    """A complete ``Connection: close`` response."""
    data = body.encode()
    head = render_head(
        f"HTTP/1.1 {status} {_phrase(status)}",
        [
            ("Content-Type", f"{content_type}; charset=utf-8"),
            ("Content-Length", str(len(data))),
            ("Connection", "close"),
        ],
    )
    return head + data


def split_authority(text: str) -> tuple[str, int | None] | None:
    """``host``, ``host:port``, ``[v6]:port`` → (host, port or None); None if malformed."""
    if not text or any(c in text for c in "/@?#\\ \t"):
        return None
    try:
        parts = urlsplit("//" + text)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    return (host, port) if host else None


def same_host(header: str, host: str, port: int) -> bool:
    """Does a ``Host`` header name ``host:port``? A header without a port matches any."""
    parsed = split_authority(header)
    if parsed is None:
        return False
    name, header_port = parsed
    target = normalize_host(host)
    if target is None or normalize_host(name) != target:
        return False
    return header_port is None or header_port == port


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def append_json_line(path: Path, record: dict[str, object]) -> None:
    """One line, written and flushed at once (readers may tail the file)."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, marked when cut."""
    return text if len(text) <= limit else f"{text[:limit]}…[{len(text) - limit} more]"


DenyKey = tuple[str, int, str]
OVERFLOW: DenyKey = ("*", 0, "more distinct denials than so logs one by one")


class DenyLog:
    """The proxy's denial log, bounded whatever the sandbox sends.

    A denial is one JSON line ``{"time", "host", "port", "reason", "count"}``, written at
    once the first time its (host, port, reason) is seen; repeats are counted and written
    as one line per key (``count`` = repeats since the last one) by :meth:`flush`. Past
    :data:`MAX_DENY_KEYS` distinct denials, new ones are counted under :data:`OVERFLOW`;
    past :data:`MAX_DENY_LOG_BYTES` written, a flush writes one summary line only.
    Thread-safe: the proxy adds from its loop, the session flushes between iterations."""

    def __init__(
        self, path: Path, *, max_keys: int = MAX_DENY_KEYS, max_bytes: int = MAX_DENY_LOG_BYTES
    ) -> None:
        self.path = path
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self.written = 0
        self._seen: set[DenyKey] = set()
        self._pending: dict[DenyKey, int] = {}
        self._lock = threading.Lock()

    def add(self, host: str, port: int, reason: str) -> None:
        key = (clip(host, MAX_HOST), port, clip(reason, MAX_REASON))
        with self._lock:
            if key in self._seen:
                self._pending[key] = self._pending.get(key, 0) + 1
            elif len(self._seen) < self.max_keys and self.written < self.max_bytes:
                self._seen.add(key)
                self._write(key, 1)
            else:
                self._pending[OVERFLOW] = self._pending.get(OVERFLOW, 0) + 1

    def flush(self) -> None:
        """Write the counts of repeats seen since the last flush."""
        with self._lock:
            pending, self._pending = self._pending, {}
            if self.written >= self.max_bytes and pending:
                pending = {OVERFLOW: sum(pending.values())}
            for key, count in pending.items():
                self._write(key, count)

    def _write(self, key: DenyKey, count: int) -> None:
        host, port, reason = key
        record: dict[str, object] = {"time": now_iso(), "host": host, "port": port}
        record.update(reason=reason, count=count)
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
        self.written += len(line)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def finish_writer(writer: asyncio.StreamWriter) -> None:
    """Close ``writer`` within :data:`CLOSE_GRACE_S` (TLS waits for the peer's
    close_notify), else abort it; abort at once when the current task is being
    cancelled (the server is closing)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        writer.transport.abort()
        return
    try:
        await asyncio.wait_for(close_writer(writer), CLOSE_GRACE_S)
    except TimeoutError:
        writer.transport.abort()


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


# --- splicing ----------------------------------------------------------------------------


class _Activity:
    def __init__(self) -> None:
        self.last = time.monotonic()


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    activity: _Activity,
    idle: float,
) -> None:
    """Copy until EOF, then half-close ``writer``. Idle only when *both* directions are."""
    while True:
        try:
            data = await asyncio.wait_for(reader.read(BUFFER), idle)
        except TimeoutError:
            if time.monotonic() - activity.last < idle:
                continue
            raise
        if not data:
            break
        activity.last = time.monotonic()
        writer.write(data)
        await writer.drain()
    with contextlib.suppress(OSError):
        if writer.can_write_eof():
            writer.write_eof()


async def splice(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    *,
    idle: float = IDLE_TIMEOUT_S,
    grace: float = CLOSE_GRACE_S,
) -> None:
    """Copy both ways until both ends are done. When the upstream finishes first the
    client gets ``grace`` seconds to finish too; an error on either side ends both."""
    activity = _Activity()
    up = asyncio.create_task(_pump(client[0], upstream[1], activity, idle))
    down = asyncio.create_task(_pump(upstream[0], client[1], activity, idle))
    try:
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        if up.done() and up.exception() is None and not down.done():
            await asyncio.wait({down})
        elif down.done() and down.exception() is None and not up.done():
            await asyncio.wait({up}, timeout=grace)
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)


# --- relaying HTTP/1.1 messages (interception) -------------------------------------------


async def _line(reader: asyncio.StreamReader, idle: float) -> bytes:
    """One CRLF-terminated line (chunk size or trailer)."""
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n"), idle)
    except asyncio.LimitOverrunError:
        raise ConnectionError("chunked framing line too long") from None


def _chunk_size(line: bytes) -> int:
    size = line[:-2].split(b";", 1)[0].strip(b" \t")
    if not _CHUNK_SIZE_RE.fullmatch(size):
        raise ConnectionError(f"bad chunk size {size[:20]!r}")
    return int(size, 16)


async def _copy_exact(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int, idle: float
) -> None:
    """Copy ``size`` bytes, each piece written as soon as it arrives."""
    while size > 0:
        data = await asyncio.wait_for(reader.read(min(BUFFER, size)), idle)
        if not data:
            raise ConnectionError("connection closed in the middle of a body")
        size -= len(data)
        writer.write(data)
        await writer.drain()


async def _copy_chunked(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idle: float
) -> None:
    """Copy a chunked body verbatim (sizes, data, trailers) up to its end."""
    while True:
        line = await _line(reader, idle)
        writer.write(line)
        size = _chunk_size(line)
        if size == 0:
            break
        await _copy_exact(reader, writer, size, idle)
        crlf = await asyncio.wait_for(reader.readexactly(2), idle)
        if crlf != b"\r\n":
            raise ConnectionError("chunk not followed by CRLF")
        writer.write(crlf)
    while True:
        line = await _line(reader, idle)
        writer.write(line)
        if line == b"\r\n":
            break
    await writer.drain()


async def _copy_to_eof(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idle: float
) -> None:
    while data := await asyncio.wait_for(reader.read(BUFFER), idle):
        writer.write(data)
        await writer.drain()


async def _read_body(
    reader: asyncio.StreamReader, chunked: bool, length: int | None, idle: float
) -> bytes:
    """A whole request body (de-chunked, trailers dropped), at most
    :data:`MAX_SUBSTITUTED_BODY` bytes (``413`` beyond)."""
    too_big = HttpError(
        413, f"request bodies over {MAX_SUBSTITUTED_BODY} bytes cannot have secrets substituted"
    )
    if not chunked:
        if (length or 0) > MAX_SUBSTITUTED_BODY:
            raise too_big
        return await asyncio.wait_for(reader.readexactly(length or 0), idle)
    parts: list[bytes] = []
    total = 0
    while size := _chunk_size(await _line(reader, idle)):
        total += size
        if total > MAX_SUBSTITUTED_BODY:
            raise too_big
        parts.append(await asyncio.wait_for(reader.readexactly(size + 2), idle))
        if not parts[-1].endswith(b"\r\n"):
            raise HttpError(400, "chunk not followed by CRLF")
        parts[-1] = parts[-1][:-2]
    while await _line(reader, idle) != b"\r\n":
        pass
    return b"".join(parts)


def body_framing(head: Head) -> tuple[bool, int | None]:
    """(chunked?, content length) of a request body; ambiguous framing is a 400."""
    codings = head.tokens("transfer-encoding")
    lengths = {v.strip() for v in head.values("content-length")}
    if codings and lengths:
        raise HttpError(400, "both Transfer-Encoding and Content-Length")
    if codings:
        if codings != {"chunked"}:
            raise HttpError(501, f"unsupported Transfer-Encoding {', '.join(sorted(codings))}")
        return True, None
    if not lengths:
        return False, None
    if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
        raise HttpError(400, "malformed Content-Length")
    return False, int(lengths.pop())


def keeps_alive(head: Head) -> bool:
    """Does the sender of ``head`` (request or response) keep the connection open?"""
    tokens = head.tokens("connection")
    if "close" in tokens:
        return False
    version = head.start[0] if head.start[0].startswith("HTTP/") else head.start[2]
    return version == "HTTP/1.1" or "keep-alive" in tokens


@dataclass(frozen=True)
class _Request:
    """A request as it goes upstream: the head (placeholders replaced) and its body."""

    method: str
    head: bytes
    chunked: bool
    length: int | None
    body: bytes | None  # the whole (substituted) body, or None to stream it as it comes
    keep_alive: bool


# --- the proxy -----------------------------------------------------------------------------


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every TCP address of ``host`` (the loop's getaddrinfo), in order, without repeats."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            address = ipaddress.ip_address(str(sockaddr[0]))
            if address not in found:
                found.append(address)
    return found


class UnixServer:
    """An asyncio server on a Unix socket (a stale socket file is replaced) serving at
    most :data:`MAX_CONNECTIONS` connections at once (the next ones wait in the backlog);
    a failed accept (out of descriptors) pauses accepting instead of ending the server.
    On :meth:`close` open connections are cancelled and the socket is removed."""

    socket_path: Path
    _tasks: set[asyncio.Task[Any]]
    max_connections: int = MAX_CONNECTIONS
    _listener: socket.socket | None = None
    _acceptor: asyncio.Task[None] | None = None

    async def _listen(
        self, handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
    ) -> None:
        if self.socket_path.is_socket():
            self.socket_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.socket_path))
            listener.listen(BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._acceptor = asyncio.create_task(self._accept(listener, handle))

    async def _accept(
        self,
        listener: socket.socket,
        handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    ) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.max_connections)
        while True:
            await slots.acquire()
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED
                slots.release()
                log.warning("%s: accept failed (%s); pausing", self.socket_path.name, exc)
                await asyncio.sleep(ACCEPT_PAUSE_S)
                continue
            task = asyncio.create_task(self._connection(conn, handle))
            self._tasks.add(task)

            def done(task: asyncio.Task[None]) -> None:
                self._tasks.discard(task)
                slots.release()

            task.add_done_callback(done)

    @staticmethod
    async def _connection(
        conn: socket.socket,
        handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    ) -> None:
        # As asyncio.start_server does it: a protocol with a connected callback is the
        # server side (which StreamWriter.start_tls relies on).
        loop = asyncio.get_running_loop()
        connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        connected = loop.create_future()
        protocol = asyncio.StreamReaderProtocol(
            asyncio.StreamReader(limit=MAX_HEAD, loop=loop),
            lambda reader, writer: connected.set_result((reader, writer)),
            loop=loop,
        )
        try:
            await loop.connect_accepted_socket(lambda: protocol, conn)
        except OSError:
            conn.close()
            return
        await handle(*await connected)

    async def close(self) -> None:
        listener, acceptor = self._listener, self._acceptor
        if listener is None or acceptor is None:
            return
        acceptor.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(acceptor, *self._tasks, return_exceptions=True)
        listener.close()
        self._listener = self._acceptor = None
        self.socket_path.unlink(missing_ok=True)


class Proxy(UnixServer):
    """The proxy server; ``await start()`` binds ``socket_path``, ``await close()`` stops
    it, ends every open connection and removes the socket.

    ``secrets`` are the session's bound secrets (their hosts are intercepted, see the
    module doc), ``ca`` signs the certificates shown for those hosts (a fresh
    :class:`~sono.net.tls.SessionCA` when not given), ``upstream_ssl`` verifies the real
    hosts behind them (default: the system's trust store, honouring ``SSL_CERT_FILE``),
    and ``substitute_body`` also replaces placeholders in request bodies (buffered, at
    most :data:`MAX_SUBSTITUTED_BODY` bytes)."""

    def __init__(
        self,
        policy: NetworkPolicy,
        socket_path: Path | str,
        log_path: Path | str,
        resolver: Resolver | None = None,
        *,
        idle_timeout: float = IDLE_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        head_timeout: float = HEAD_TIMEOUT_S,
        secrets: Sequence[BoundSecret] = (),
        ca: SessionCA | None = None,
        upstream_ssl: ssl.SSLContext | None = None,
        substitute_body: bool = False,
    ) -> None:
        self.policy = policy
        self.socket_path = Path(socket_path)
        self.log_path = Path(log_path)
        self._resolve = resolver or system_resolver
        self._idle = idle_timeout
        self._connect_timeout = connect_timeout
        self._head_timeout = head_timeout
        self.denials = DenyLog(self.log_path)
        self._flusher: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.secrets = tuple(secrets)
        if self.secrets and ca is None:
            from sono.net.tls import SessionCA  # needs `cryptography`: only with secrets

            ca = SessionCA()
        self.ca = ca
        self._upstream_ssl = upstream_ssl
        self._substitute_body = substitute_body

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        await self._listen(self._handle)
        self._flush_later()

    def _flush_later(self) -> None:
        """Repeated denials reach the log at least every :data:`DENY_FLUSH_S` (also when
        another ``so`` process reads it)."""
        self.denials.flush()
        loop = asyncio.get_running_loop()
        self._flusher = loop.call_later(DENY_FLUSH_S, self._flush_later)

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        await super().close()
        self.denials.flush()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except HttpError as exc:
            with contextlib.suppress(OSError):
                message = clip(exc.message, 2 * MAX_REASON)  # may quote what was sent
                writer.write(simple_response(exc.status, f"so proxy: {message}\n"))
                await writer.drain()
        except asyncio.CancelledError:
            pass  # close(): end quietly (a cancelled handler task makes asyncio log noise)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # a side went away or idled out: routine for a proxy
        finally:
            self._tasks.discard(task)
            await finish_writer(writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = await read_head(reader, self._head_timeout)
        if not raw:
            return
        head = parse_head(raw)
        method, target, _version = head.start
        if method == "CONNECT":
            authority = split_authority(target)
            if authority is None or authority[1] is None:
                raise HttpError(400, f"CONNECT needs host:port, not {target!r}")
            host, port = authority[0], authority[1]
            self._check_host_header(head, host, port)
            if bound_to(self.secrets, host):
                await self._intercept(reader, writer, host, port)
                return
            reply, first = CONNECT_OK, b""
        else:
            host, port, first = self._absolute_form(head)
            self._screen_plain(raw, host, port)
            reply = b""
        upstream = await self._open(host, port)
        try:
            writer.write(reply)
            upstream[1].write(first)
            await asyncio.gather(writer.drain(), upstream[1].drain())
            await splice((reader, writer), upstream, idle=self._idle)
        finally:
            await close_writer(upstream[1])

    def _absolute_form(self, head: Head) -> tuple[str, int, bytes]:
        """(host, port, the request head rewritten for the origin server)."""
        method, target, _version = head.start
        if not target.lower().startswith(("http://", "https://")):
            raise HttpError(
                400, "this is a forward proxy: send absolute-form requests (http://...) or CONNECT"
            )
        try:
            url = urlsplit(target)
            host, port = url.hostname, url.port or 80
        except ValueError:
            raise HttpError(400, f"malformed URL {target[:200]!r}") from None
        if url.scheme.lower() != "http":
            raise HttpError(400, "use CONNECT for https:// URLs")
        if not host or "@" in url.netloc:
            raise HttpError(400, "URL must have a host and no credentials")
        self._check_host_header(head, host, port)
        drop = HOP_BY_HOP | head.tokens("connection") | {"host"}
        headers = [(k, v) for k, v in head.headers if k.lower() not in drop]
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        request = render_head(
            f"{method} {path} HTTP/1.1",
            [("Host", url.netloc), *headers, ("Connection", "close")],
        )
        return host, port, request

    def _screen_plain(self, raw: bytes, host: str, port: int) -> None:
        """Secrets are substituted only over TLS: a plain-HTTP request head carrying a
        placeholder is refused, whatever the host."""
        name = normalize_host(host) or host
        for secret in placeholders_in(raw, self.secrets):
            if secret.bound_to(name):
                self._deny(name, port, f"secret {secret.name} is sent only over HTTPS")
            self._deny(name, port, str(Unbound(secret.name, name)))

    @staticmethod
    def _check_host_header(head: Head, host: str, port: int) -> None:
        values = head.values("host")
        if len(values) > 1:
            raise HttpError(400, "more than one Host header")
        if values and not same_host(values[0], host, port):
            raise HttpError(400, f"Host header {values[0]!r} does not match {host}:{port}")

    # --- interception (hosts with bound secrets) ---

    async def _intercept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
    ) -> None:
        """Answer the CONNECT, be ``host`` to the client over TLS, and pass its requests
        on with placeholders replaced. The upstream connection is opened for the first
        request that passes, and again when the upstream closed it between requests."""
        name, addresses = await self._check(host, port)
        assert self.ca is not None, "secrets without a CA"
        context = self.ca.server_context(name)
        writer.write(CONNECT_OK)
        await writer.drain()
        # Clients wait for the 200 before their ClientHello; a handshake failure (the
        # client does not trust the session CA, or does not speak TLS) just closes.
        await writer.start_tls(context, ssl_handshake_timeout=self._head_timeout)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            timeout = self._head_timeout
            while True:
                try:
                    raw = await read_head(reader, timeout)
                except HttpError as exc:
                    if exc.status == 408 and timeout == self._idle:
                        return  # an idle keep-alive connection: close quietly
                    raise
                if not raw:
                    return
                timeout = self._idle
                request = await self._inner_request((reader, writer), raw, name, port)
                if upstream is not None and upstream[0].at_eof():
                    await finish_writer(upstream[1])
                    upstream = None
                if upstream is None:
                    upstream = await self._connect(name, port, addresses, tls=True)
                if not await self._exchange(request, (reader, writer), upstream):
                    return
        finally:
            if upstream is not None:
                await finish_writer(upstream[1])

    async def _inner_request(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        raw: bytes,
        host: str,
        port: int,
    ) -> _Request:
        """Check a request read inside an intercepted tunnel and make it the upstream's:
        placeholders replaced (a placeholder of a secret not bound to ``host`` is a
        logged 403), proxy headers dropped, ``Expect: 100-continue`` answered here."""
        head = parse_head(raw)
        method, target, _version = head.start
        if method == "CONNECT" or not (target.startswith("/") or target == "*"):
            raise HttpError(400, "inside a tunnel send origin-form requests (/path)")
        self._check_host_header(head, host, port)
        line, sep, headers_raw = raw.partition(b"\r\n")
        in_line = placeholders_in(line, self.secrets)
        if in_line:
            # A path or query is what servers echo back (resource names, error messages):
            # secrets go into header values only.
            self._deny(host, port, f"secret {in_line[0].name} may be sent in headers only")
        try:
            head = parse_head(line + sep + substitute(headers_raw, self.secrets, host))
        except Unbound as exc:
            self._deny(host, port, str(exc))
        chunked, length = body_framing(head)
        expect = "100-continue" in head.tokens("expect")
        drop = {"proxy-authorization", "proxy-connection"} | ({"expect"} if expect else set())
        headers = [(k, v) for k, v in head.headers if k.lower() not in drop]
        if not head.values("host"):
            authority = f"[{host}]" if ":" in host else host
            headers.insert(0, ("Host", authority if port == 443 else f"{authority}:{port}"))
        if expect:
            client[1].write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await client[1].drain()
        body: bytes | None = None
        if self._substitute_body and (chunked or length):
            data = await _read_body(client[0], chunked, length, self._idle)
            try:
                body = substitute(data, self.secrets, host)
            except Unbound as exc:
                self._deny(host, port, f"{exc} (in the request body)")
            framing = {"content-length", "transfer-encoding"}
            headers = [(k, v) for k, v in headers if k.lower() not in framing]
            headers.append(("Content-Length", str(len(body))))
        return _Request(
            method,
            render_head(" ".join(head.start), headers),
            chunked,
            length,
            body,
            keeps_alive(head),
        )

    async def _exchange(
        self,
        request: _Request,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> bool:
        """Send ``request`` (streaming its body from the client unless already read) and
        relay the response; True when both sides keep the connection for another."""
        reader, up_writer = client[0], upstream[1]
        up_writer.write(request.head)
        if request.body is not None:
            up_writer.write(request.body)
            await up_writer.drain()
        elif request.chunked:
            await _copy_chunked(reader, up_writer, self._idle)
        elif request.length:
            await _copy_exact(reader, up_writer, request.length, self._idle)
        else:
            await up_writer.drain()
        return await self._relay_response(request, client, upstream)

    async def _relay_response(
        self,
        request: _Request,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> bool:
        """The response, head and body verbatim, each piece as it arrives."""
        writer, up_reader = client[1], upstream[0]
        while True:  # interim 1xx heads go to the client as they come
            try:
                raw = await read_head(up_reader, self._idle, "response")
            except HttpError as exc:
                raise HttpError(502, f"upstream: {exc.message}") from None
            if not raw:
                raise HttpError(502, "upstream closed the connection without answering")
            head = parse_head(raw, response=True)
            status = int(head.start[1])
            writer.write(raw)
            await writer.drain()
            if status == 101:  # an accepted Upgrade (WebSocket): raw bytes from now on
                await splice(client, upstream, idle=self._idle)
                return False
            if not 100 <= status < 200:
                break
        if request.method == "HEAD" or status in (204, 304):
            pass
        elif "chunked" in head.tokens("transfer-encoding"):
            await _copy_chunked(up_reader, writer, self._idle)
        elif (lengths := {v.strip() for v in head.values("content-length")}) and all(
            v.isdigit() for v in lengths
        ):
            if len(lengths) > 1:
                raise ConnectionError("upstream sent conflicting Content-Length headers")
            await _copy_exact(up_reader, writer, int(lengths.pop()), self._idle)
        else:
            await _copy_to_eof(up_reader, writer, self._idle)  # ends with the connection
            return False
        return request.keep_alive and keeps_alive(head)

    # --- connecting ---

    async def _open(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        name, addresses = await self._check(host, port)
        return await self._connect(name, port, addresses)

    async def _check(self, host: str, port: int) -> tuple[str, list[IPAddress]]:
        """Check, resolve once, check every address: (normalised host, the addresses)."""
        if normalize_host(host) is None:  # not a host name: a client error, not a denial
            raise HttpError(400, f"invalid host name {clip(host, MAX_HOST)!r}")
        early = precheck(self.policy, host, port)
        if early is not None:
            self._deny(host, port, early.reason)
        name = normalize_host(host) or host
        try:
            literal: IPAddress | None = ipaddress.ip_address(name)
        except ValueError:
            literal = None
        if literal is not None:
            addresses: Sequence[IPAddress] = [literal]
        else:
            try:
                addresses = await asyncio.wait_for(self._resolve(name, port), RESOLVE_TIMEOUT_S)
            except (OSError, TimeoutError):
                raise HttpError(502, f"cannot resolve {name}") from None
        decision = decide(self.policy, name, port, addresses)
        if not decision.allowed:
            self._deny(name, port, decision.reason)
        return name, list(dict.fromkeys(addresses))

    async def _connect(
        self, name: str, port: int, addresses: Sequence[IPAddress], *, tls: bool = False
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to one of the checked ``addresses`` (over TLS for ``name`` if asked)."""
        context = self._upstream_context() if tls else None
        last: Exception | None = None
        for address in addresses:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(
                        str(address),
                        port,
                        limit=MAX_HEAD,
                        ssl=context,
                        server_hostname=name if tls else None,
                    ),
                    self._connect_timeout,
                )
            except (OSError, TimeoutError) as exc:
                last = exc
        raise HttpError(502, f"cannot connect to {name}:{port}: {last or 'no address'}")

    def _upstream_context(self) -> ssl.SSLContext:
        if self._upstream_ssl is None:
            context = ssl.create_default_context()  # system roots; honours SSL_CERT_FILE
            context.set_alpn_protocols(["http/1.1"])
            self._upstream_ssl = context
        return self._upstream_ssl

    def _deny(self, host: str, port: int, reason: str) -> NoReturn:
        self.denials.add(host, port, reason)
        host, reason = clip(host, MAX_HOST), clip(reason, MAX_REASON)
        raise HttpError(403, f"{host}:{port} blocked by so network policy: {reason}")


# --- running on a thread ---------------------------------------------------------------------


class AsyncServer(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


class ServerThread:
    """Runs an :class:`AsyncServer` on a private event loop in a daemon thread, for the
    synchronous orchestrator: ``with ProxyThread(...) as proxy: ...``."""

    def __init__(self, server: AsyncServer, name: str) -> None:
        self.server = server
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> Self:
        """Returns once the server listens; raises what its ``start()`` raised."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        self._error = None
        thread = threading.Thread(target=self._run, args=(ready,), name=self._name, daemon=True)
        thread.start()
        ready.wait()
        if self._error is not None:
            thread.join()
            raise self._error
        self._thread = thread
        return self

    def stop(self, timeout: float = 10.0) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(self.server.close(), loop)
        with contextlib.suppress(Exception):
            future.result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:
                self._error = exc
                return
            finally:
                ready.set()
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            asyncio.set_event_loop(None)
            loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ProxyThread(ServerThread):
    """:class:`Proxy` on its own thread; ``start()``/``stop()`` or a ``with`` block."""

    def __init__(
        self,
        policy: NetworkPolicy,
        socket_path: Path | str,
        log_path: Path | str,
        resolver: Resolver | None = None,
        *,
        idle_timeout: float = IDLE_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        secrets: Sequence[BoundSecret] = (),
        ca: SessionCA | None = None,
        upstream_ssl: ssl.SSLContext | None = None,
        substitute_body: bool = False,
    ) -> None:
        self.proxy = Proxy(
            policy,
            socket_path,
            log_path,
            resolver,
            idle_timeout=idle_timeout,
            connect_timeout=connect_timeout,
            secrets=secrets,
            ca=ca,
            upstream_ssl=upstream_ssl,
            substitute_body=substitute_body,
        )
        super().__init__(self.proxy, "so-net-proxy")
