"""HTTP/1.1 framing for the proxy and the gateway: strict heads, bounded bodies.

Everything here reads what a hostile sandbox (or an upstream) sent, so every reader is
bounded: a head by the stream's ``limit`` (:data:`MAX_HEAD`, ``431`` beyond), every read
by an idle timeout, and a chunked body by :class:`ChunkedBody`, the one chunked decoder:
hex sizes and CRLF only (chunk extensions and bare CR/LF are refused: servers disagree on
where they end, which is how a body smuggles a second request), framing lines of at most
:data:`MAX_CHUNK_LINE` bytes, at most :data:`MAX_TRAILERS` trailer lines (read and
dropped, never forwarded), and optionally at most ``max_size`` payload bytes, refused on
the size line before the chunk is read. Bodies are passed on framed anew
(:func:`copy_chunked`): the receiver sees only ``SIZE CRLF data CRLF`` chunks and an empty
trailer section, whatever the sender wrote.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 30.0
BUFFER = 64 * 1024
MAX_CHUNK_LINE = 8192  # a chunk-size or trailer line, CRLF included
MAX_TRAILERS = 32
LAST_CHUNK = b"0\r\n\r\n"
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

_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VERSION_RE = re.compile(r"HTTP/1\.[01]")
_BAD_VALUE_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_CHUNK_SIZE_RE = re.compile(rb"[0-9A-Fa-f]{1,16}")


class HttpError(Exception):
    """Answer the client ``status`` with ``message`` and close."""

    def __init__(self, status: int, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        # What the host-side log records, when the client must not see it (a credential
        # helper's own words may quote a secret).
        self.detail = detail


class BodyError(ConnectionError):
    """A body that cannot be read to its end: malformed chunked framing, or the sender
    closed the connection in the middle. The connection is not used again."""


class BodyTooLarge(HttpError):
    """A chunked body whose chunk sizes add up to more than the reader's ``max_size``."""

    def __init__(self, max_size: int) -> None:
        super().__init__(413, f"request body over {max_size} bytes")
        self.max_size = max_size


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


# --- heads -------------------------------------------------------------------------------------


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


_DECIMAL_RE = re.compile(r"[0-9]{1,18}")


def decimal(text: str) -> int | None:
    """``text`` as a number if it is ASCII digits only (at most 18), else None.
    ``str.isdigit`` would take ``²`` (``int`` then fails) or ``٣`` (``int`` reads 3),
    where a peer reads something else: a framing number is ASCII or it is refused."""
    return int(text) if _DECIMAL_RE.fullmatch(text) else None


def parse_head(data: bytes, *, response: bool = False) -> Head:
    """Strict parse: CRLF line ends, token header names, no folding, no control bytes."""
    lines = data.decode("latin-1").removesuffix("\r\n\r\n").split("\r\n")
    if any("\n" in line or "\r" in line for line in lines):
        raise HttpError(400, "bare CR or LF in head")
    parts = lines[0].split(" ", 2)
    if response:
        if len(parts) < 2 or not _VERSION_RE.fullmatch(parts[0]) or decimal(parts[1]) is None:
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
    length = decimal(lengths.pop()) if len(lengths) == 1 else None
    if length is None:
        raise HttpError(400, "malformed Content-Length")
    return False, length


def keeps_alive(head: Head) -> bool:
    """Does the sender of ``head`` (request or response) keep the connection open?"""
    tokens = head.tokens("connection")
    if "close" in tokens:
        return False
    version = head.start[0] if head.start[0].startswith("HTTP/") else head.start[2]
    return version == "HTTP/1.1" or "keep-alive" in tokens


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


# --- bodies --------------------------------------------------------------------------------------


class Filter(Protocol):
    """What a body passes through on its way: same bytes out or changed ones
    (:class:`sono.net.secrets.Scrubber` masks secrets; the gateway's usage tap reads)."""

    def feed(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class ChunkedBody:
    """The payload of a chunked body on ``reader``: each :meth:`read` returns the next
    piece as it arrives (at most :data:`BUFFER` bytes), ``b""`` once the last chunk and
    the trailer section (dropped) have been read; bytes after the body stay in
    ``reader``. Malformed framing or an early end raises :class:`BodyError`, chunk sizes
    adding up to more than ``max_size`` raise :class:`BodyTooLarge` before that chunk is
    read, a read idle for ``idle`` seconds ``TimeoutError``."""

    def __init__(
        self, reader: asyncio.StreamReader, idle: float, max_size: int | None = None
    ) -> None:
        self._reader = reader
        self._idle = idle
        self._max_size = max_size
        self._left = 0  # of the current chunk
        self._total = 0
        self.done = False

    async def read(self) -> bytes:
        if self.done:
            return b""
        if self._left == 0:
            size = _chunk_size(await self._line())
            if size == 0:
                await self._skip_trailers()
                self.done = True
                return b""
            self._total += size
            if self._max_size is not None and self._total > self._max_size:
                raise BodyTooLarge(self._max_size)
            self._left = size
        data = await asyncio.wait_for(self._reader.read(min(BUFFER, self._left)), self._idle)
        if not data:
            raise BodyError("connection closed in the middle of a chunk")
        self._left -= len(data)
        if self._left == 0 and await self._exactly(2) != b"\r\n":
            raise BodyError("chunk not followed by CRLF")
        return data

    async def _line(self) -> bytes:
        """One CRLF-terminated framing line with no other CR or LF in it."""
        try:
            line = await asyncio.wait_for(self._reader.readuntil(b"\r\n"), self._idle)
        except asyncio.LimitOverrunError:
            raise BodyError("chunked framing line too long") from None
        except asyncio.IncompleteReadError:
            raise BodyError("connection closed in the chunked framing") from None
        if len(line) > MAX_CHUNK_LINE:
            raise BodyError(f"chunked framing line over {MAX_CHUNK_LINE} bytes")
        if b"\n" in line[:-2] or b"\r" in line[:-2]:
            raise BodyError("bare CR or LF in chunked framing")
        return line

    async def _exactly(self, size: int) -> bytes:
        try:
            return await asyncio.wait_for(self._reader.readexactly(size), self._idle)
        except asyncio.IncompleteReadError:
            raise BodyError("connection closed in the chunked framing") from None

    async def _skip_trailers(self) -> None:
        for _ in range(MAX_TRAILERS + 1):
            if await self._line() == b"\r\n":
                return
        raise BodyError(f"more than {MAX_TRAILERS} trailer lines")


def _chunk_size(line: bytes) -> int:
    """Strict: hex digits and CRLF only (no extensions, no spaces)."""
    size = line[:-2]
    if not _CHUNK_SIZE_RE.fullmatch(size):
        raise BodyError(f"bad chunk size line {size[:20]!r} (no extensions)")
    return int(size, 16)


def frame_chunk(data: bytes) -> bytes:
    """``data`` as one chunk; nothing for no data (an empty chunk would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


class Sink(Protocol):
    """Where a body is copied to: an ``asyncio.StreamWriter`` or a :class:`ClientSink`."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class ClientSink:
    """A relay's write side, whose reader may hang up mid-body: from then on what is
    written goes nowhere (``gone``) and the relay reads its source on to the end — what
    the upstream served is measured whether or not the client stayed, and a request's
    body limit holds whether or not the upstream did."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.gone = False

    def write(self, data: bytes) -> None:
        if not self.gone and self.writer.transport.is_closing():
            self.gone = True
        if not self.gone:
            self.writer.write(data)

    async def drain(self) -> None:
        if self.gone:
            return
        try:
            await self.writer.drain()
        except (OSError, RuntimeError):  # reset, broken pipe, a closed transport
            self.gone = True


async def copy_chunked(
    reader: asyncio.StreamReader,
    writer: Sink,
    idle: float,
    through: Filter | None = None,
    *,
    max_size: int | None = None,
) -> None:
    """Copy a chunked body up to its end, framed anew, each piece written as soon as it
    arrives (through ``through`` when given)."""
    body = ChunkedBody(reader, idle, max_size)
    while data := await body.read():
        writer.write(frame_chunk(through.feed(data) if through else data))
        await writer.drain()
    if through:
        writer.write(frame_chunk(through.flush()))
    writer.write(LAST_CHUNK)
    await writer.drain()


async def copy_exact(
    reader: asyncio.StreamReader,
    writer: Sink,
    size: int,
    idle: float,
    through: Filter | None = None,
) -> None:
    """Copy a ``size``-byte body, each piece written as soon as it arrives."""
    while size > 0:
        data = await asyncio.wait_for(reader.read(min(BUFFER, size)), idle)
        if not data:
            raise BodyError("connection closed in the middle of a body")
        size -= len(data)
        writer.write(through.feed(data) if through else data)
        await writer.drain()
    if through:
        writer.write(through.flush())
        await writer.drain()


async def copy_to_eof(
    reader: asyncio.StreamReader,
    writer: Sink,
    idle: float,
    through: Filter | None = None,
) -> None:
    """Copy a body that ends with the connection."""
    while data := await asyncio.wait_for(reader.read(BUFFER), idle):
        writer.write(through.feed(data) if through else data)
        await writer.drain()
    if through:
        writer.write(through.flush())
        await writer.drain()


def upstream_ssl_context() -> ssl.SSLContext:
    """TLS toward an upstream (the proxy's, the gateway's): the system's trust store plus
    ``SSL_CERT_FILE`` when set, loaded here and now — not left to OpenSSL's own reading
    of the variable — speaking HTTP/1.1."""
    context = ssl.create_default_context()
    cafile = os.environ.get("SSL_CERT_FILE")
    if cafile:
        context.load_verify_locations(cafile=cafile)
    context.set_alpn_protocols(["http/1.1"])
    return context
