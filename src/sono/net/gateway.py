"""The model gateway: the only holder of the real API keys.

An asyncio HTTP server on a Unix socket (bound into the sandbox, separate from the egress
proxy). The agent inside is pointed at it (``ANTHROPIC_BASE_URL=http://127.0.0.1:3129/
anthropic``) with a placeholder key. For each request the gateway

1. picks the :class:`Route` with the longest matching path prefix (none: ``404`` JSON)
   and forwards only the model API endpoints of its :data:`API_ENDPOINTS` kind: the
   method and the path under the prefix must be one of them, spelled canonically (no dot
   segments, percent escapes, backslashes, empty segments or ``;`` parameters; anything
   else is refused with ``403``/``404`` before any upstream connection, so the real key
   only ever goes to ``<upstream base>/<an allowed endpoint>``); a body over
   :data:`MAX_REQUEST_BODY` is refused (``413``);
2. strips every incoming credential header (``x-api-key``, ``authorization``,
   ``proxy-authorization``, ``api-key``) and hop-by-hop headers, injects the route's real
   key (``x-api-key: KEY`` or ``authorization: Bearer KEY``, per ``Route.auth``), sets
   ``Host`` to the upstream's, and asks for an uncompressed response;
3. forwards the body (``Content-Length`` or chunked, streamed; chunked framing is
   :class:`sono.net.http1.ChunkedBody`'s, strict and bounded) to the upstream over HTTPS
   (the default SSL context, honouring ``SSL_CERT_FILE``) or plain HTTP; unreachable:
   ``502`` JSON;
4. streams the response back unbuffered, each piece written as soon as it arrives (SSE
   reaches the client event by event), while :class:`sono.net.usage.UsageParser` reads a
   copy for token usage;
5. appends one JSON line per request to the usage log: ``{"time", "route", "model",
   "status", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
   "duration_ms", "ttfb_ms"}``: ``time`` is when the request head arrived, ``ttfb_ms`` from
   then to the upstream's response head, ``duration_ms`` to the end of the response; token
   fields as in :mod:`sono.net.usage` (``null`` when not reported); ``route`` is the prefix
   (``null`` for a 404) and ``status`` the upstream's, or the gateway's own 4xx/502;
   ``refused`` is the gateway's one-line reason for a request it did not forward
   (``null`` otherwise); ``endpoint`` the call under the route (``"POST /v1/messages"``);
   ``error`` the upstream's own message of an error answer (status >= 400), one line.
   Keys are never logged (``Route`` hides ``key`` from its repr).

One request per connection: both the client and the upstream connection get
``Connection: close`` (no keep-alive, so no pooling: each request opens its own upstream
connection). Upgrades (WebSocket) are not supported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from sono.net.http1 import (
    HEAD_TIMEOUT_S,
    HOP_BY_HOP,
    MAX_HEAD,
    BodyError,
    ClientSink,
    Head,
    HttpError,
    body_framing,
    copy_chunked,
    copy_exact,
    copy_to_eof,
    decimal,
    parse_head,
    read_head,
    render_head,
    simple_response,
    upstream_ssl_context,
)
from sono.net.server import ServerThread, UnixServer, append_json_line, close_writer, now_iso
from sono.net.upstream import ApiKind, CredentialError, TokenSource
from sono.net.usage import UsageParser
from sono.textsafe import one_line

# "none": the upstream takes no credential (a local server): the client's are dropped.
# "passthrough": the client's own auth headers are forwarded (a route the host holds no
# key for and the sandbox holds its own: only for callers that want exactly that).
AuthStyle = Literal["x-api-key", "bearer", "api-key", "x-api-key+bearer", "none", "passthrough"]
AUTH_STYLES: tuple[AuthStyle, ...] = (
    "x-api-key",
    "bearer",
    "api-key",
    "x-api-key+bearer",
    "none",
    "passthrough",
)
CREDENTIAL_HEADERS = frozenset({"x-api-key", "authorization", "proxy-authorization", "api-key"})
PASSTHROUGH_AUTH = frozenset({"x-api-key", "authorization"})
CONNECT_TIMEOUT_S = 30.0
UPSTREAM_IDLE_S = 900.0  # a non-streaming answer may take minutes before its first byte
CLIENT_IDLE_S = 300.0
MODEL_SNIFF = 64 * 1024
# Anthropic's own limit for a Messages request; OpenAI's is lower.
MAX_REQUEST_BODY = 32 * 1024 * 1024
MAX_QUERY = 2048
REASON_LIMIT = 200
ERROR_KEPT = 4096  # of an error answer's body, for its message in the usage log

# What the agents' model clients call (claude, pi: Anthropic Messages; codex: Responses
# and its remote compaction; opencode, pi: Chat Completions or Responses), as
# (method, path under the route's upstream base); ``*`` stands for one id segment.
API_ENDPOINTS: dict[ApiKind, frozenset[tuple[str, str]]] = {
    "anthropic": frozenset(
        {
            ("POST", "/v1/messages"),
            ("POST", "/v1/messages/count_tokens"),
            ("GET", "/v1/models"),
            ("GET", "/v1/models/*"),
        }
    ),
    "openai": frozenset(
        {
            ("POST", "/responses"),
            ("POST", "/responses/compact"),
            ("POST", "/chat/completions"),
            ("GET", "/models"),
            ("GET", "/models/*"),
        }
    ),
}

_MODEL_RE = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
_SEGMENT_RE = re.compile(r"[A-Za-z0-9_-]+(?:[.:@][A-Za-z0-9_-]+)*")  # no dot segments
_TOKEN_RE = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}")  # an HTTP header name
_QUERY_RE = re.compile(r"[A-Za-z0-9._~%&=+,:@/!$'()*-]*")


@dataclass(frozen=True)
class Route:
    """``/anthropic/v1/messages`` with prefix ``/anthropic`` and upstream
    ``https://api.anthropic.com`` goes to ``https://api.anthropic.com/v1/messages``; an
    upstream path is kept as a base (``https://api.openai.com/v1`` + ``/responses``).
    ``api`` names the endpoints the route forwards (:data:`API_ENDPOINTS`). ``key`` is
    the credential, or a :class:`TokenSource` asked per request (off the event loop);
    ``headers`` are added to every upstream request (their values may be secret)."""

    prefix: str
    upstream: str
    auth: AuthStyle
    key: str | TokenSource = field(repr=False)
    api: ApiKind
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or self.prefix.endswith("/") or "?" in self.prefix:
            raise ValueError(f"route prefix must look like /name, not {self.prefix!r}")
        url = urlsplit(self.upstream)
        if url.scheme not in ("http", "https") or not url.hostname or url.query:
            raise ValueError(f"route upstream must be an http(s) base URL, not {self.upstream!r}")
        if self.auth not in AUTH_STYLES:
            raise ValueError(f"route auth must be one of {', '.join(AUTH_STYLES)}")
        if self.api not in API_ENDPOINTS:
            raise ValueError(f"route api must be one of {', '.join(API_ENDPOINTS)}")
        if self.auth in ("passthrough", "none"):
            if self.key:
                raise ValueError(f"route {self.prefix}: a {self.auth} route holds no key")
        elif isinstance(self.key, str) and not _header_value(self.key):
            raise ValueError(f"route {self.prefix}: the API key is empty or malformed")
        for name, value in self.headers:
            if not _TOKEN_RE.fullmatch(name) or not _header_value(value):
                raise ValueError(f"route {self.prefix}: malformed extra header {name!r}")

    def matches(self, path: str) -> bool:
        return path == self.prefix or path.startswith(self.prefix + "/")

    def refusal(self, method: str, path: str, query: str) -> tuple[int, str] | None:
        """Why the gateway will not forward ``method path?query`` (a path that matches):
        (status, reason), or None for a model API endpoint of this route's kind."""
        rest = path[len(self.prefix) :]
        segments = rest.split("/")[1:]
        if not rest or not all(_SEGMENT_RE.fullmatch(s) for s in segments):
            return 403, f"not a canonical API path: {method} {path}"
        if len(query) > MAX_QUERY or not _QUERY_RE.fullmatch(query):
            return 403, f"malformed or oversized query string on {method} {path}"
        endpoints = API_ENDPOINTS[self.api]
        generic = "/".join([*segments[:-1], "*"])
        if (method, rest) in endpoints or (method, f"/{generic}") in endpoints:
            return None
        return 404, f"not a {self.api} model API endpoint: {method} {path}"

    def target(self, path: str, query: str) -> str:
        """The upstream request target for client ``path`` (which matches and was not
        refused): always under the upstream's base path."""
        base = urlsplit(self.upstream).path.rstrip("/")
        rest = path[len(self.prefix) :]
        if not rest.startswith("/") or "/." in rest or "%" in rest or "\\" in rest:
            raise ValueError(f"refusing to forward {path!r}")  # refusal() was skipped
        return base + rest + (f"?{query}" if query else "")

    @property
    def dynamic(self) -> bool:
        """The credential is fetched per request (may block: run off the event loop)."""
        return not isinstance(self.key, str)

    def auth_headers(self, incoming: Head) -> list[tuple[str, str]]:
        """The credential headers of the upstream request, then the route's extra ones.
        Raises :class:`CredentialError` when a dynamic credential cannot be had."""
        if self.auth == "passthrough":
            own = [(k, v) for k, v in incoming.headers if k.lower() in PASSTHROUGH_AUTH]
            return [*own, *self.headers]
        if self.auth == "none":
            return list(self.headers)
        key = self.key if isinstance(self.key, str) else self.key.token()
        if not _header_value(key):
            raise CredentialError(f"the credential for {self.prefix} is empty or malformed")
        bearer = ("Authorization", f"Bearer {key}")
        headers = {
            "bearer": [bearer],
            "api-key": [("api-key", key)],
            "x-api-key+bearer": [("x-api-key", key), bearer],
        }.get(self.auth, [("x-api-key", key)])
        return [*headers, *self.headers]


def _header_value(value: str) -> bool:
    return bool(value) and not any(c in value for c in "\r\n\0")


@dataclass
class _Exchange:
    """What the usage line records about one request."""

    started: float = field(default_factory=time.monotonic)
    time: str = field(default_factory=now_iso)
    route: str | None = None
    status: int | None = None
    ttfb_ms: int | None = None
    request_model: str | None = None
    parser: UsageParser | None = None
    refused: str | None = None
    client_left: bool = False  # the client hung up before the body's end
    endpoint: str | None = None  # "POST /v1/messages": the API call under the route
    error_body: bytearray | None = None  # the start of an error answer (status >= 400)

    def error(self) -> str | None:
        """The upstream's own message of an error answer (JSON ``error.message``,
        ``message`` or ``error``, else the text), one bounded line."""
        if not self.error_body:
            return None
        text = self.error_body.decode("utf-8", "replace")
        with contextlib.suppress(ValueError):
            data = json.loads(text)
            if isinstance(data, dict):
                inner = data.get("error")
                if isinstance(inner, dict):
                    inner = inner.get("message")
                found = inner if isinstance(inner, str) else data.get("message")
                if isinstance(found, str):
                    text = found
        return one_line(text, REASON_LIMIT) or None

    def record(self) -> dict[str, object]:
        tokens = self.parser.result() if self.parser is not None else None
        return {
            "time": self.time,
            "route": self.route,
            "model": ((tokens.model if tokens else None) or self.request_model or "")[:200] or None,
            "status": self.status,
            "input_tokens": tokens.input_tokens if tokens else None,
            "output_tokens": tokens.output_tokens if tokens else None,
            "cache_read_tokens": tokens.cache_read_tokens if tokens else None,
            "cache_write_tokens": tokens.cache_write_tokens if tokens else None,
            "duration_ms": round((time.monotonic() - self.started) * 1000),
            "ttfb_ms": self.ttfb_ms,
            "refused": self.refused,
            "client_left": self.client_left,
            "endpoint": self.endpoint,
            "error": self.error(),
        }


def _json_error(status: int, message: str) -> bytes:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
    }.get(status, "api_error")
    body = json.dumps({"type": "error", "error": {"type": kind, "message": message}})
    return simple_response(status, body, "application/json")


# Usage-log lines that count nothing (refused requests, answers without usage) written
# between two reads of the log; past it they are only counted, in one line per read
# (:meth:`Gateway.flush`): the agent decides how many it sends, and the log is read
# within a bound (so's budget must see every line that carries tokens).
MAX_QUIET_LINES = 1000
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


class Gateway(UnixServer):
    """The gateway server; ``await start()`` binds ``socket_path``, ``await close()``
    stops it, ends open requests and removes the socket."""

    def __init__(
        self,
        routes: Sequence[Route],
        socket_path: Path | str,
        usage_log: Path | str,
    ) -> None:
        prefixes = [r.prefix for r in routes]
        if len(set(prefixes)) != len(prefixes):
            raise ValueError("two gateway routes share a prefix")
        super().__init__(socket_path)
        self.routes = sorted(routes, key=lambda r: len(r.prefix), reverse=True)
        self.usage_log = Path(usage_log)
        self._ssl: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._quiet = 0  # lines without tokens since the last flush
        self._held = 0  # of those, not written (past MAX_QUIET_LINES)
        self._held_refused = 0
        self._held_reason: str | None = None

    def route_for(self, path: str) -> Route | None:
        return next((r for r in self.routes if r.matches(path)), None)

    async def start(self) -> None:
        if self._ssl is None and any(r.upstream.startswith("https:") for r in self.routes):
            self._ssl = upstream_ssl_context()
        self.usage_log.parent.mkdir(parents=True, exist_ok=True)
        await self._listen(self._handle)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        exchange: _Exchange | None = None
        try:
            raw = await read_head(reader, HEAD_TIMEOUT_S)
            if not raw:
                return
            exchange = _Exchange()
            await self._serve(parse_head(raw), reader, writer, exchange)
        except HttpError as exc:
            if exchange is not None and exchange.status is None:
                exchange.status = exc.status
                exchange.refused = one_line(exc.detail or exc.message, REASON_LIMIT)
                with contextlib.suppress(OSError):
                    writer.write(_json_error(exc.status, f"so gateway: {exc.message}"))
                    await writer.drain()
        except asyncio.CancelledError:
            pass  # close(): end quietly (a cancelled handler task makes asyncio log noise)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away: the usage line still records what was seen
        finally:
            if exchange is not None:
                self._log(exchange.record())
            await close_writer(writer)

    def _log(self, record: dict[str, object]) -> None:
        """Every line that carries tokens; the first :data:`MAX_QUIET_LINES` that do not
        since the last flush, the rest counted."""
        with self._lock:
            if not any(record.get(k) for k in TOKEN_FIELDS):
                self._quiet += 1
                if self._quiet > MAX_QUIET_LINES:
                    self._held += 1
                    if record.get("refused"):
                        self._held_refused += 1
                        self._held_reason = self._held_reason or str(record["refused"])
                    return
            append_json_line(self.usage_log, record)

    def flush(self) -> None:
        """The requests held back since the last flush, as one line (``suppressed``
        requests, ``refused_count`` of them refused); called before each read."""
        with self._lock:
            if self._held:
                append_json_line(
                    self.usage_log,
                    {
                        "time": now_iso(),
                        "suppressed": self._held,
                        "refused_count": self._held_refused,
                        "refused": self._held_reason,
                    },
                )
            self._quiet = self._held = self._held_refused = 0
            self._held_reason = None

    async def _serve(
        self,
        head: Head,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        exchange: _Exchange,
    ) -> None:
        method, target, _version = head.start
        if not target.startswith("/"):
            raise HttpError(400, "send origin-form requests (/prefix/path)")
        path, _, query = target.partition("?")
        route = self.route_for(path)
        if route is None:
            raise HttpError(404, f"no gateway route for {path}")
        exchange.route = route.prefix
        exchange.endpoint = one_line(f"{method} {path[len(route.prefix) :]}", REASON_LIMIT)
        refused = route.refusal(method, path, query)
        if refused is not None:
            raise HttpError(*refused)
        chunked, length = body_framing(head)
        if length is not None and length > MAX_REQUEST_BODY:
            raise HttpError(413, f"request body over {MAX_REQUEST_BODY} bytes")
        if "100-continue" in head.tokens("expect"):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            if route.dynamic:
                auth = await asyncio.to_thread(route.auth_headers, head)
            else:
                auth = route.auth_headers(head)
        except CredentialError as exc:
            # The reason goes to so's log and the user, never to the agent (a helper's
            # stderr may quote a key).
            message = "the credential of this route is not available now (so tells the user why)"
            raise HttpError(401, message, detail=str(exc)) from None
        up_reader, up_writer = await self._connect(route)
        try:
            framing = [("Transfer-Encoding", "chunked")] if chunked else []
            if length is not None:
                framing = [("Content-Length", str(length))]
            up_writer.write(
                render_head(
                    f"{method} {route.target(path, query)} HTTP/1.1",
                    [
                        ("Host", _authority(route.upstream)),
                        *_forwardable(head, route),
                        *auth,
                        ("Accept-Encoding", "identity"),
                        *framing,
                        ("Connection", "close"),
                    ],
                )
            )
            exchange.request_model = await _send_body(reader, up_writer, chunked, length)
            await self._relay_response(method, up_reader, writer, exchange)
        finally:
            await close_writer(up_writer)

    async def _connect(self, route: Route) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        url = urlsplit(route.upstream)
        https = url.scheme == "https"
        host = url.hostname or ""
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(
                    host,
                    url.port or (443 if https else 80),
                    ssl=self._ssl if https else None,
                    server_hostname=host if https else None,
                    limit=MAX_HEAD,
                ),
                CONNECT_TIMEOUT_S,
            )
        except (OSError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise HttpError(502, f"upstream {url.netloc} unreachable: {reason}") from None

    async def _relay_response(
        self,
        method: str,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        exchange: _Exchange,
    ) -> None:
        head = await self._response_head(up_reader)
        status = int(head.start[1])
        exchange.ttfb_ms = round((time.monotonic() - exchange.started) * 1000)
        exchange.status = status
        drop = HOP_BY_HOP | head.tokens("connection")
        headers = [(k, v) for k, v in head.headers if k.lower() not in drop]
        client = ClientSink(writer)  # a client that hangs up does not stop the measuring
        client.write(
            render_head(f"HTTP/1.1 {status} {head.start[2]}", [*headers, ("Connection", "close")])
        )
        await client.drain()
        if method == "HEAD" or status in (204, 304):
            return
        parser = UsageParser(head.get("content-type") or "", head.get("content-encoding") or "")
        exchange.parser = parser
        see: Callable[[bytes], object] = parser.feed
        if status >= 400:
            kept = exchange.error_body = bytearray()

            def see(data: bytes) -> None:
                parser.feed(data)
                kept.extend(data[: ERROR_KEPT - len(kept)])

        try:
            await self._relay_body(head, up_reader, client, see)
        finally:
            exchange.client_left = client.gone

    async def _response_head(self, up_reader: asyncio.StreamReader) -> Head:
        """The final response head (interim 1xx heads are skipped)."""
        while True:
            try:
                raw = await read_head(up_reader, UPSTREAM_IDLE_S, "response")
            except HttpError as exc:
                raise HttpError(502, f"upstream: {exc.message}") from None
            if not raw:
                raise HttpError(502, "upstream closed the connection without answering")
            head = parse_head(raw, response=True)
            if not 100 <= int(head.start[1]) < 200:
                return head

    async def _relay_body(
        self,
        head: Head,
        up_reader: asyncio.StreamReader,
        writer: ClientSink,
        see: Callable[[bytes], object],
    ) -> None:
        """Copy the body as it arrives until its end (by chunked framing, framed anew;
        Content-Length; or the upstream closing); ``see`` reads a copy. Malformed
        upstream framing ends the connection: the client sees a short body."""
        tap = _Tap(see)
        length = head.get("content-length")
        if "chunked" in head.tokens("transfer-encoding"):
            await copy_chunked(up_reader, writer, UPSTREAM_IDLE_S, tap)
        elif length is not None and (size := decimal(length.strip())) is not None:
            await copy_exact(up_reader, writer, size, UPSTREAM_IDLE_S, tap)
        else:
            await copy_to_eof(up_reader, writer, UPSTREAM_IDLE_S, tap)


class _Tap:
    """A body filter that passes everything on unchanged and shows each piece to ``see``."""

    def __init__(self, see: Callable[[bytes], object]) -> None:
        self._see = see

    def feed(self, data: bytes) -> bytes:
        self._see(data)
        return data

    def flush(self) -> bytes:
        return b""


def _authority(url: str) -> str:
    """``host[:port]`` of ``url`` — never its userinfo."""
    netloc = urlsplit(url).netloc
    return netloc.rpartition("@")[2]


def _forwardable(head: Head, route: Route) -> Iterable[tuple[str, str]]:
    """The client's headers that go upstream: no credential, hop-by-hop or framing
    header, and none the route sets itself (its extra headers win)."""
    drop = HOP_BY_HOP | CREDENTIAL_HEADERS | head.tokens("connection")
    drop |= {name.lower() for name, _ in route.headers}
    drop |= {"host", "content-length", "transfer-encoding", "expect", "accept-encoding"}
    return [(k, v) for k, v in head.headers if k.lower() not in drop]


async def _send_body(
    reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    chunked: bool,
    length: int | None,
) -> str | None:
    """Stream the request body upstream (re-chunked when chunked, at most
    :data:`MAX_REQUEST_BODY` bytes); returns the request's ``"model"`` when it appears in
    the first :data:`MODEL_SNIFF` bytes."""
    sniff = bytearray()

    def see(data: bytes) -> None:
        if len(sniff) < MODEL_SNIFF:
            sniff.extend(data[: MODEL_SNIFF - len(sniff)])

    # An upstream that answers early and closes must not pass for a client that went away:
    # the client's body is read on (its limit still holds) and the answer is a 502.
    upstream = ClientSink(up_writer)
    try:
        if chunked:  # past the limit the upstream sees a cut-off body and no end
            await copy_chunked(
                reader, upstream, CLIENT_IDLE_S, _Tap(see), max_size=MAX_REQUEST_BODY
            )
        elif length:
            await copy_exact(reader, upstream, length, CLIENT_IDLE_S, _Tap(see))
        else:
            await upstream.drain()
    except BodyError as exc:
        raise HttpError(400, f"bad request body: {exc}") from None
    if upstream.gone:
        raise HttpError(502, "the upstream closed the connection while the request was sent")
    match = _MODEL_RE.search(sniff)
    return match.group(1).decode("utf-8", "replace") if match else None


class GatewayThread(ServerThread):
    """:class:`Gateway` on its own thread; ``start()``/``stop()`` or a ``with`` block."""

    def __init__(
        self,
        routes: Sequence[Route],
        socket_path: Path | str,
        usage_log: Path | str,
    ) -> None:
        self.gateway = Gateway(routes, socket_path, usage_log)
        super().__init__(self.gateway, "so-net-gateway")
