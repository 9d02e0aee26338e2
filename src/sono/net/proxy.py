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
import re
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Protocol, Self
from urllib.parse import urlsplit

from sono.net.policy import IPAddress, NetworkPolicy, decide, normalize_host, precheck

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
RESOLVE_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 600.0
CLOSE_GRACE_S = 5.0
BUFFER = 64 * 1024

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]

_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VERSION_RE = re.compile(r"HTTP/1\.[01]")
_BAD_VALUE_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
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


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


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


class Proxy:
    """The proxy server; ``await start()`` binds ``socket_path``, ``await close()`` stops
    it, ends every open connection and removes the socket."""

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
    ) -> None:
        self.policy = policy
        self.socket_path = Path(socket_path)
        self.log_path = Path(log_path)
        self._resolve = resolver or system_resolver
        self._idle = idle_timeout
        self._connect_timeout = connect_timeout
        self._head_timeout = head_timeout
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.is_socket():
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(
            self._handle, path=str(self.socket_path), limit=MAX_HEAD, backlog=1024
        )

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None
        self.socket_path.unlink(missing_ok=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except HttpError as exc:
            with contextlib.suppress(OSError):
                writer.write(simple_response(exc.status, f"so proxy: {exc.message}\n"))
                await writer.drain()
        except asyncio.CancelledError:
            pass  # close(): end quietly (a cancelled handler task makes asyncio log noise)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # a side went away or idled out: routine for a proxy
        finally:
            self._tasks.discard(task)
            await close_writer(writer)

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
            reply, first = b"HTTP/1.1 200 Connection Established\r\n\r\n", b""
        else:
            host, port, first = self._absolute_form(head)
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

    @staticmethod
    def _check_host_header(head: Head, host: str, port: int) -> None:
        values = head.values("host")
        if len(values) > 1:
            raise HttpError(400, "more than one Host header")
        if values and not same_host(values[0], host, port):
            raise HttpError(400, f"Host header {values[0]!r} does not match {host}:{port}")

    async def _open(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Check, resolve once, check every address, connect to one of those addresses."""
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
        last: Exception | None = None
        for address in dict.fromkeys(addresses):
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(str(address), port, limit=MAX_HEAD),
                    self._connect_timeout,
                )
            except (OSError, TimeoutError) as exc:
                last = exc
        raise HttpError(502, f"cannot connect to {name}:{port}: {last or 'no address'}")

    def _deny(self, host: str, port: int, reason: str) -> NoReturn:
        record: dict[str, object] = {"time": now_iso(), "host": host, "port": port}
        record["reason"] = reason
        append_json_line(self.log_path, record)
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
    ) -> None:
        self.proxy = Proxy(
            policy,
            socket_path,
            log_path,
            resolver,
            idle_timeout=idle_timeout,
            connect_timeout=connect_timeout,
        )
        super().__init__(self.proxy, "so-net-proxy")
