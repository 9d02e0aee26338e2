"""Token usage read from model API responses as they stream through the gateway.

:class:`UsageParser` is fed the response body (already de-chunked) piece by piece and never
raises: a body it cannot read just yields no usage. It understands

- Anthropic Messages: JSON ``usage``, or SSE ``message_start.message.usage`` followed by
  cumulative ``message_delta.usage``;
- OpenAI Responses: JSON ``usage``, or the SSE ``response.completed`` (also ``.incomplete``,
  ``.failed``) event's ``response.usage``;
- OpenAI Chat Completions: JSON ``usage``, or the streamed chunk that carries ``usage``.

Counts follow the harness parsers' convention (:class:`sono.events.Usage`):
``input_tokens`` is the *uncached* input, so ``input + cache_read + cache_write`` is the
whole prompt. OpenAI reports cached tokens inside its input count; they are subtracted.
Fields stay ``None`` when the response did not report them.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import zlib
from dataclasses import dataclass
from typing import Any

MAX_JSON_BODY = 32 * 1024 * 1024
MAX_SSE_EVENT = 16 * 1024 * 1024


@dataclass(frozen=True)
class Tokens:
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


class UsageParser:
    """Feed body bytes with :meth:`feed`, then call :meth:`result`."""

    def __init__(self, content_type: str = "", content_encoding: str = "") -> None:
        self._sse = "text/event-stream" in content_type.lower()
        encoding = content_encoding.strip().lower()
        self._inflate = (
            zlib.decompressobj(wbits=47) if encoding in ("gzip", "x-gzip", "deflate") else None
        )
        self._broken = encoding not in ("", "identity", "gzip", "x-gzip", "deflate")
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._body = bytearray()
        self._line = ""
        self._data: list[str] = []
        self._data_size = 0
        self._values: dict[str, Any] = {}

    def feed(self, data: bytes) -> None:
        if self._broken or not data:
            return
        try:
            if self._inflate is not None:
                data = self._inflate.decompress(data)
            if self._sse:
                self._feed_sse(self._text.decode(data))
            elif len(self._body) + len(data) <= MAX_JSON_BODY:
                self._body += data
            else:
                self._broken = True
        except (zlib.error, ValueError):
            self._broken = True

    def result(self) -> Tokens:
        """What the body reported so far (a JSON body is parsed here, once complete)."""
        if not self._sse and self._body and not self._broken:
            body, self._body = bytes(self._body), bytearray()
            try:
                self._on_object(json.loads(body))
            except ValueError:
                self._broken = True
        v = self._values
        return Tokens(
            v.get("model"),
            v.get("input"),
            v.get("output"),
            v.get("cache_read"),
            v.get("cache_write"),
        )

    # --- SSE -----------------------------------------------------------------------------

    def _feed_sse(self, text: str) -> None:
        self._line += text
        while True:
            end = self._line.find("\n")
            if end < 0:
                if len(self._line) > MAX_SSE_EVENT:
                    self._line, self._data, self._data_size = "", [], MAX_SSE_EVENT + 1
                return
            line, self._line = self._line[:end].removesuffix("\r"), self._line[end + 1 :]
            self._sse_line(line)

    def _sse_line(self, line: str) -> None:
        if not line:
            data, size = "\n".join(self._data), self._data_size
            self._data, self._data_size = [], 0
            if data and data != "[DONE]" and size <= MAX_SSE_EVENT:
                with contextlib.suppress(ValueError):  # one bad event: keep reading the rest
                    self._on_object(json.loads(data))
            return
        field, _, value = line.partition(":")
        if field == "data":
            value = value.removeprefix(" ")
            self._data_size += len(value)
            if self._data_size <= MAX_SSE_EVENT:
                self._data.append(value)

    # --- the APIs ---------------------------------------------------------------------------

    def _on_object(self, obj: object) -> None:
        if not isinstance(obj, dict):
            return
        kind = obj.get("type")
        target: object = obj
        if kind == "message_start":
            target = obj.get("message")
        elif isinstance(kind, str) and kind.startswith("response."):
            target = obj.get("response")
        if not isinstance(target, dict):
            return
        if isinstance(target.get("model"), str) and target["model"]:
            self._values["model"] = target["model"]
        self._merge(target.get("usage"))

    def _merge(self, usage: object) -> None:
        """Take the counts ``usage`` reports; later reports replace earlier ones (Anthropic's
        ``message_delta`` counts are cumulative)."""
        if not isinstance(usage, dict):
            return
        v = self._values
        raw_input = _int(usage.get("input_tokens"), usage.get("prompt_tokens"))
        output = _int(usage.get("output_tokens"), usage.get("completion_tokens"))
        details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details")
        if isinstance(details, dict) or "prompt_tokens" in usage:  # OpenAI's shape
            cached = _int(details.get("cached_tokens") if isinstance(details, dict) else 0) or 0
            if raw_input is not None:
                v["input"] = max(raw_input - cached, 0)
                v["cache_read"] = cached
                v.setdefault("cache_write", 0)
        else:
            if raw_input is not None:
                v["input"] = raw_input
            for key, name in (
                ("cache_read_input_tokens", "cache_read"),
                ("cache_creation_input_tokens", "cache_write"),
            ):
                count = _int(usage.get(key))
                if count is not None:
                    v[name] = count
        if output is not None:
            v["output"] = output


def _int(*values: object) -> int | None:
    """The first value that is a non-negative integer count."""
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None
