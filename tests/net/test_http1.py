"""HTTP/1.1 framing: strict heads and the one chunked decoder the proxy and gateway share."""

from __future__ import annotations

import asyncio

import pytest
from net_helpers import dechunk

from sono.net.http1 import (
    MAX_CHUNK_LINE,
    MAX_TRAILERS,
    BodyError,
    BodyTooLarge,
    ChunkedBody,
    Head,
    HttpError,
    body_framing,
    copy_chunked,
    decimal,
    keeps_alive,
    parse_head,
    split_authority,
)


def chunked(*pieces: bytes, trailer: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return body + b"0\r\n" + trailer + b"\r\n"


# --- heads ---------------------------------------------------------------------------------


def test_parse_head_keeps_names_and_reads_tokens() -> None:
    head = parse_head(
        b"POST /x HTTP/1.1\r\nHost: a.test\r\nConnection: Keep-Alive, Upgrade\r\n\r\n"
    )
    assert head.start == ("POST", "/x", "HTTP/1.1")
    assert head.get("host") == "a.test"
    assert head.tokens("connection") == {"keep-alive", "upgrade"}


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\r\nX: a\nY: b\r\n\r\n",  # bare LF
        b"GET / HTTP/1.1\r\n folded\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
    ],
)
def test_parse_head_is_strict(raw: bytes) -> None:
    with pytest.raises(HttpError) as caught:
        parse_head(raw)
    assert caught.value.status == 400


def test_body_framing_refuses_ambiguity() -> None:
    def head(*headers: tuple[str, str]) -> Head:
        return Head(("POST", "/", "HTTP/1.1"), headers)

    assert body_framing(head()) == (False, None)
    assert body_framing(head(("Content-Length", "5"))) == (False, 5)
    assert body_framing(head(("Transfer-Encoding", "chunked"))) == (True, None)
    for bad, status in (
        ((("Content-Length", "5"), ("Transfer-Encoding", "chunked")), 400),
        ((("Content-Length", "5"), ("Content-Length", "6")), 400),
        ((("Content-Length", "-1"),), 400),
        ((("Transfer-Encoding", "gzip, chunked"),), 501),
    ):
        with pytest.raises(HttpError) as caught:
            body_framing(head(*bad))
        assert caught.value.status == status


def test_keeps_alive_and_split_authority() -> None:
    assert keeps_alive(Head(("GET", "/", "HTTP/1.1"), ()))
    assert not keeps_alive(Head(("GET", "/", "HTTP/1.0"), ()))
    assert not keeps_alive(Head(("HTTP/1.1", "200", "OK"), (("Connection", "close"),)))
    assert split_authority("[::1]:443") == ("::1", 443)
    assert split_authority("a.test") == ("a.test", None)
    assert split_authority("user@a.test:1") is None


# --- the chunked decoder -------------------------------------------------------------------


def pieces_of(wire: bytes, *, step: int = 0, max_size: int | None = None) -> tuple[bytes, bytes]:
    """(payload, the bytes left after the body), the wire fed ``step`` bytes at a time."""

    async def run() -> tuple[bytes, bytes]:
        reader = asyncio.StreamReader(limit=64 * 1024)
        body = ChunkedBody(reader, 5.0, max_size)

        async def feed() -> None:
            for i in range(0, len(wire), step or len(wire) or 1):
                reader.feed_data(wire[i : i + (step or len(wire))])
                await asyncio.sleep(0)
            reader.feed_eof()

        feeder = asyncio.create_task(feed())
        out = b""
        while piece := await body.read():
            out += piece
        await feeder
        assert body.done and await body.read() == b""
        return out, await reader.read()

    return asyncio.run(run())


def test_decodes_byte_by_byte_drops_trailers_and_leaves_what_follows() -> None:
    wire = chunked(b"hello ", b"chunked ", b"world", trailer=b"X-Trailer: 1\r\n") + b"NEXT"
    assert pieces_of(wire, step=1) == (b"hello chunked world", b"NEXT")
    assert pieces_of(wire) == (b"hello chunked world", b"NEXT")
    assert dechunk(chunked()) == b""


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (b"zz\r\nabc\r\n", "bad chunk size"),
        (b"-1\r\n", "bad chunk size"),
        (b" 3\r\nabc\r\n0\r\n\r\n", "bad chunk size"),
        (b"3;name=value\r\nabc\r\n0\r\n\r\n", "no extensions"),  # smuggling vector
        (b"1" * 17 + b"\r\n", "bad chunk size"),  # more than 16 hex digits
        (b"3\nabc\r\n0\r\n\r\n", "bare CR or LF"),
        (b"3\r\nabcX\r\n", "not followed by CRLF"),
        (b"3\r\nabc\r\n0\r\nX: y\n\r\n", "bare CR or LF"),  # bare LF in a trailer
    ],
)
def test_malformed_framing_is_refused(wire: bytes, why: str) -> None:
    with pytest.raises(BodyError, match=why):
        pieces_of(wire)


def test_framing_lines_and_trailers_are_bounded() -> None:
    long_trailer = b"X: " + b"t" * MAX_CHUNK_LINE + b"\r\n"
    with pytest.raises(BodyError, match="line over"):
        pieces_of(chunked(b"abc", trailer=long_trailer))
    with pytest.raises(BodyError, match="too long"):  # past the reader's own limit
        pieces_of(b"1" * 100_000)
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_TRAILERS + 1))
    with pytest.raises(BodyError, match="trailer lines"):
        pieces_of(chunked(b"abc", trailer=many))
    assert pieces_of(chunked(b"abc", trailer=many[: -len(b"X-32: 1\r\n")]))[0] == b"abc"


def test_an_oversized_chunk_is_refused_before_it_is_read() -> None:
    with pytest.raises(BodyTooLarge) as caught:
        pieces_of(b"1000\r\n", max_size=4095)  # only the size line has arrived
    assert caught.value.status == 413
    with pytest.raises(BodyTooLarge):
        pieces_of(chunked(b"a" * 3000, b"b" * 3000), max_size=4096)
    assert (
        pieces_of(chunked(b"a" * 2048, b"b" * 2048), max_size=4096)[0] == b"a" * 2048 + b"b" * 2048
    )


@pytest.mark.parametrize(
    "wire",
    [b"", b"5\r\nab", b"5\r\nabcde", b"5\r\nabcde\r\n", b"0\r\n", b"0\r\nX: 1\r\n", b"3"],
)
def test_a_body_cut_short_is_an_error(wire: bytes) -> None:
    with pytest.raises(BodyError, match="closed"):
        pieces_of(wire)


def test_copy_chunked_frames_anew_through_a_filter() -> None:
    class Upper:
        def feed(self, data: bytes) -> bytes:
            return data.upper()

        def flush(self) -> bytes:
            return b"!"

    class Sink:
        def __init__(self) -> None:
            self.data = b""

        def write(self, data: bytes) -> None:
            self.data += data

        async def drain(self) -> None:
            pass

    async def run() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(chunked(b"ab", b"cd", trailer=b"X-T: 1\r\n"))
        reader.feed_eof()
        sink = Sink()
        await copy_chunked(reader, sink, 5.0, Upper())  # a fake writer: a Sink
        return sink.data

    assert asyncio.run(run()) == b"2\r\nAB\r\n2\r\nCD\r\n1\r\n!\r\n0\r\n\r\n"


@pytest.mark.parametrize("text", ["\u00b2", "\u0663", "+1", "1_0", "1 1", "1" * 19, ""])
def test_framing_numbers_are_ascii_digits_only(text: str) -> None:
    assert decimal(text) is None
    head = parse_head(b"POST / HTTP/1.1\r\nContent-Length: " + text.encode() + b"\r\n\r\n")
    with pytest.raises(HttpError) as refused:
        body_framing(head)
    assert refused.value.status == 400


def test_decimal_reads_ascii_digits() -> None:
    assert decimal(" 1") is None  # the caller strips a header value's whitespace
    assert decimal("0") == 0 and decimal("0042") == 42 and decimal("9" * 18) == 10**18 - 1
