"""The host-side egress proxy: an asyncio HTTP proxy on a Unix socket.

The sandbox has no network; this socket (bound into it, and exposed on 127.0.0.1 there by
:mod:`sono.net.forward`) is its only way out. Two request forms are served:

- ``CONNECT host:port`` (HTTPS and any other TCP): answered ``200 Connection Established``
  and then spliced both ways;
- absolute-form plain HTTP (``GET http://host/path HTTP/1.1``): rewritten to origin-form
  with ``Connection: close``, its body forwarded by its own framing and the response
  relayed back; nothing more is read from the client (a pipelined second request is
  never forwarded unchecked).

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
bound to that host in the values of the headers each is bound to
(:func:`sono.net.secrets.substitute_headers`; bodies pass untouched;
anywhere else, header names and the request line included, a logged ``403``), checks the
TLS server name and every ``Host`` against the host (no fronting), re-frames chunked
bodies strictly (chunk extensions and bare LFs refused, trailers dropped), asks for
uncompressed whole responses and masks the values in every response head and body
(:class:`sono.net.secrets.Scrubber`; compressed responses and upgrades are a ``502``),
refuses with ``403`` (logged like a denial) a request carrying the placeholder of a
secret *not* bound to it, and forwards the rest over a TLS
connection of its own to one of the checked addresses (verified with the default
context, which honours ``SSL_CERT_FILE``), streaming each response back as it arrives.
The upstream is connected only once a request has passed. A placeholder in a plain-HTTP
request is refused too: secrets go only over HTTPS.
:class:`ProxyThread` runs it on its own event loop thread for synchronous callers. The
HTTP/1.1 framing is :mod:`sono.net.http1`, the socket and thread plumbing
:mod:`sono.net.server`, both shared with :mod:`sono.net.gateway`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlsplit

from sono.net.http1 import (
    BUFFER,
    HEAD_TIMEOUT_S,
    HOP_BY_HOP,
    MAX_HEAD,
    Head,
    HttpError,
    body_framing,
    copy_chunked,
    copy_exact,
    copy_to_eof,
    decimal,
    keeps_alive,
    parse_head,
    read_head,
    render_head,
    simple_response,
    split_authority,
    upstream_ssl_context,
)
from sono.net.policy import IPAddress, NetworkPolicy, decide, normalize_host, precheck
from sono.net.secrets import (
    BoundSecret,
    Scrubber,
    Unbound,
    bound_to,
    placeholders_in,
    substitute_headers,
)
from sono.net.server import (
    CLOSE_GRACE_S,
    ServerThread,
    UnixServer,
    close_writer,
    finish_writer,
    now_iso,
)

if TYPE_CHECKING:
    from sono.net.tls import SessionCA

CONNECT_TIMEOUT_S = 30.0
RESOLVE_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 600.0
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


# --- splicing ----------------------------------------------------------------------------


class _Activity:
    def __init__(self) -> None:
        self.last = time.monotonic()


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    activity: _Activity,
) -> None:
    """Copy until EOF, then half-close ``writer``. Idle only when *both* directions are."""
    while True:
        try:
            data = await asyncio.wait_for(reader.read(BUFFER), IDLE_TIMEOUT_S)
        except TimeoutError:
            if time.monotonic() - activity.last < IDLE_TIMEOUT_S:
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
) -> None:
    """Copy both ways until both ends are done (idle when neither moved for
    :data:`IDLE_TIMEOUT_S`). When the upstream finishes first the client gets
    :data:`~sono.net.server.CLOSE_GRACE_S` to finish too; an error on either side ends
    both."""
    activity = _Activity()
    up = asyncio.create_task(_pump(client[0], upstream[1], activity))
    down = asyncio.create_task(_pump(upstream[0], client[1], activity))
    try:
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        if up.done() and up.exception() is None and not down.done():
            await asyncio.wait({down})
        elif down.done() and down.exception() is None and not up.done():
            await asyncio.wait({up}, timeout=CLOSE_GRACE_S)
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)


@dataclass(frozen=True)
class _Request:
    """A request as it goes upstream: the head (placeholders replaced), how its body
    (streamed from the client) is framed, and whether the client keeps the connection."""

    method: str
    head: bytes
    chunked: bool
    length: int | None
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


class Proxy(UnixServer):
    """The proxy server; ``await start()`` binds ``socket_path``, ``await close()`` stops
    it, ends every open connection and removes the socket.

    ``secrets`` are the session's bound secrets (their hosts are intercepted, see the
    module doc), ``ca`` signs the certificates shown for those hosts (a fresh
    :class:`~sono.net.tls.SessionCA` when not given), ``upstream_ssl`` verifies the real
    hosts behind them (default: the system's trust store, honouring ``SSL_CERT_FILE``),
    and ``resolver`` looks host names up (:func:`system_resolver` when not given)."""

    def __init__(
        self,
        policy: NetworkPolicy,
        socket_path: Path | str,
        log_path: Path | str,
        resolver: Resolver | None = None,
        *,
        secrets: Sequence[BoundSecret] = (),
        ca: SessionCA | None = None,
        upstream_ssl: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(socket_path)
        self.policy = policy
        self.log_path = Path(log_path)
        self._resolve = resolver or system_resolver
        self.denials = DenyLog(self.log_path)
        self._flusher: asyncio.TimerHandle | None = None
        self.secrets = tuple(secrets)
        if self.secrets and ca is None:
            from sono.net.tls import SessionCA  # needs `cryptography`: only with secrets

            ca = SessionCA()
        self.ca = ca
        self._upstream_ssl = upstream_ssl

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
            await finish_writer(writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = await read_head(reader, HEAD_TIMEOUT_S)
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
            reply = CONNECT_OK
        else:
            await self._plain(reader, writer, head, raw)
            return
        upstream = await self._open(host, port)
        try:
            writer.write(reply)
            await writer.drain()
            await splice((reader, writer), upstream)
        finally:
            await close_writer(upstream[1])

    async def _plain(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: Head, raw: bytes
    ) -> None:
        """One plain-HTTP request: its head (checked), its body by its own framing, then
        the response back until the upstream closes. Nothing more is read from the
        client: a second request pipelined after the first is never forwarded unchecked."""
        host, port, first = self._absolute_form(head)
        self._screen_plain(raw, host, port)
        chunked, length = body_framing(head)
        upstream = await self._open(host, port)
        try:
            upstream[1].write(first)
            if "100-continue" in head.tokens("expect"):
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await writer.drain()
            if chunked:
                await copy_chunked(reader, upstream[1], IDLE_TIMEOUT_S)
            elif length:
                await copy_exact(reader, upstream[1], length, IDLE_TIMEOUT_S)
            await upstream[1].drain()
            await copy_to_eof(upstream[0], writer, IDLE_TIMEOUT_S)
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
        body_framing(head)  # ambiguous framing is refused before anything is sent
        drop = HOP_BY_HOP | head.tokens("connection") | {"host", "expect"}
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
        context.sni_callback = self._sni_check(name, port)
        writer.write(CONNECT_OK)
        await writer.drain()
        # Clients wait for the 200 before their ClientHello; a handshake failure (the
        # client does not trust the session CA, or does not speak TLS) just closes.
        await writer.start_tls(context, ssl_handshake_timeout=HEAD_TIMEOUT_S)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            timeout = HEAD_TIMEOUT_S
            while True:
                try:
                    raw = await read_head(reader, timeout)
                except HttpError as exc:
                    if exc.status == 408 and timeout == IDLE_TIMEOUT_S:
                        return  # an idle keep-alive connection: close quietly
                    raise
                if not raw:
                    return
                timeout = IDLE_TIMEOUT_S
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

    def _sni_check(
        self, name: str, port: int
    ) -> Callable[[ssl.SSLObject, str | None, ssl.SSLContext], int | None]:
        """The TLS server name inside a tunnel to ``name`` must be ``name`` (no fronting
        another host behind an allowed one); none at all is fine (an IP literal), the
        ``Host`` of every request is checked too."""

        def check(_obj: ssl.SSLObject, server: str | None, _ctx: ssl.SSLContext) -> int | None:
            if server is None or normalize_host(server) == name:
                return None
            self.denials.add(name, port, f"TLS server name {clip(server, MAX_HOST)!r}")
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME

        return check

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
        line = raw.partition(b"\r\n")[0]
        in_line = placeholders_in(line, self.secrets)
        if in_line:
            # A path or query is what servers echo back (resource names, error messages):
            # secrets go into header values only.
            self._deny(host, port, f"secret {in_line[0].name} may be sent in headers only")
        try:
            substituted = substitute_headers(head.headers, self.secrets, host)
        except Unbound as exc:
            self._deny(host, port, str(exc))
        chunked, length = body_framing(head)
        expect = "100-continue" in head.tokens("expect")
        # Asked for whole and uncompressed: the response is scrubbed of the values, which
        # a compressed body or a byte range of an echo would hide.
        drop = {"proxy-authorization", "proxy-connection", "accept-encoding", "range"}
        drop |= {"if-range", "te"} | ({"expect"} if expect else set())
        headers = [(k, v) for k, v in substituted if k.lower() not in drop]
        headers.append(("Accept-Encoding", "identity"))
        if not head.values("host"):
            authority = f"[{host}]" if ":" in host else host
            headers.insert(0, ("Host", authority if port == 443 else f"{authority}:{port}"))
        if expect:
            client[1].write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await client[1].drain()
        return _Request(
            method, render_head(" ".join(head.start), headers), chunked, length, keeps_alive(head)
        )

    async def _exchange(
        self,
        request: _Request,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> bool:
        """Send ``request`` (streaming its body from the client) and relay the response;
        True when both sides keep the connection for another."""
        reader, up_writer = client[0], upstream[1]
        up_writer.write(request.head)
        if request.chunked:
            await copy_chunked(reader, up_writer, IDLE_TIMEOUT_S)
        elif request.length:
            await copy_exact(reader, up_writer, request.length, IDLE_TIMEOUT_S)
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
        scrubber = Scrubber(self.secrets)  # the upstream may echo what it was sent
        while True:  # interim 1xx heads go to the client as they come
            try:
                raw = await read_head(up_reader, IDLE_TIMEOUT_S, "response")
            except HttpError as exc:
                raise HttpError(502, f"upstream: {exc.message}") from None
            if not raw:
                raise HttpError(502, "upstream closed the connection without answering")
            head = parse_head(raw, response=True)
            status = int(head.start[1])
            if status == 101:  # raw bytes from then on: nothing could be scrubbed
                raise HttpError(502, "protocol upgrades are refused on hosts with secrets")
            if head.tokens("content-encoding") - {"identity"}:
                raise HttpError(502, "a compressed response cannot be checked for secrets")
            writer.write(scrubber.scrub(raw))
            await writer.drain()
            if not 100 <= status < 200:
                break
        if request.method == "HEAD" or status in (204, 304):
            pass
        elif "chunked" in head.tokens("transfer-encoding"):
            await copy_chunked(up_reader, writer, IDLE_TIMEOUT_S, scrubber)
        elif (lengths := {v.strip() for v in head.values("content-length")}) and all(
            decimal(v) is not None for v in lengths
        ):
            if len(lengths) > 1:
                raise ConnectionError("upstream sent conflicting Content-Length headers")
            size = decimal(lengths.pop()) or 0
            await copy_exact(up_reader, writer, size, IDLE_TIMEOUT_S, scrubber)
        else:  # ends with the connection
            await copy_to_eof(up_reader, writer, IDLE_TIMEOUT_S, scrubber)
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
                    CONNECT_TIMEOUT_S,
                )
            except (OSError, TimeoutError) as exc:
                last = exc
        raise HttpError(502, f"cannot connect to {name}:{port}: {last or 'no address'}")

    def _upstream_context(self) -> ssl.SSLContext:
        if self._upstream_ssl is None:
            self._upstream_ssl = upstream_ssl_context()
        return self._upstream_ssl

    def _deny(self, host: str, port: int, reason: str) -> NoReturn:
        self.denials.add(host, port, reason)
        host, reason = clip(host, MAX_HOST), clip(reason, MAX_REASON)
        raise HttpError(403, f"{host}:{port} blocked by so network policy: {reason}")


class ProxyThread(ServerThread):
    """:class:`Proxy` on its own thread; ``start()``/``stop()`` or a ``with`` block."""

    def __init__(
        self,
        policy: NetworkPolicy,
        socket_path: Path | str,
        log_path: Path | str,
        resolver: Resolver | None = None,
        *,
        secrets: Sequence[BoundSecret] = (),
        ca: SessionCA | None = None,
        upstream_ssl: ssl.SSLContext | None = None,
    ) -> None:
        self.proxy = Proxy(
            policy,
            socket_path,
            log_path,
            resolver,
            secrets=secrets,
            ca=ca,
            upstream_ssl=upstream_ssl,
        )
        super().__init__(self.proxy, "so-net-proxy")
