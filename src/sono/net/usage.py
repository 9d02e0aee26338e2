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

:func:`measure` sums the gateway's usage-log lines of one iteration into what the budget
trusts: the host's own reading of the upstream's answers, never what the agent prints.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import zlib
from collections.abc import Iterable, Mapping
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


# List prices in dollars per million tokens (input, output) by model-name prefix, first
# match wins. Cache reads count at a tenth of the input price and cache writes at 1.25
# times it (Anthropic's terms; OpenAI reports no writes and discounts reads by half or
# more). A floor for --max-cost, not an invoice: a model the table does not know adds
# nothing here, and the agent's own figure is used when it is higher.
PRICES: tuple[tuple[str, float, float], ...] = (
    ("claude-3-opus", 15.0, 75.0),
    ("claude-opus-4-0", 15.0, 75.0),
    ("claude-opus-4-1", 15.0, 75.0),
    ("claude-opus-4-2025", 15.0, 75.0),
    ("claude-opus", 5.0, 25.0),
    ("claude-3-haiku", 0.25, 1.25),
    ("claude-3-5-haiku", 0.8, 4.0),
    ("claude-haiku", 1.0, 5.0),
    ("claude-", 3.0, 15.0),  # Sonnet, and any other Claude model
    ("gpt-5-nano", 0.05, 0.4),
    ("gpt-5-mini", 0.25, 2.0),
    ("gpt-5", 1.25, 10.0),
    ("gpt-4.1-nano", 0.1, 0.4),
    ("gpt-4.1-mini", 0.4, 1.6),
    ("gpt-4.1", 2.0, 8.0),
    ("gpt-4o-mini", 0.15, 0.6),
    ("gpt-4o", 2.5, 10.0),
    ("o4-mini", 1.1, 4.4),
    ("o3", 2.0, 8.0),
)


@dataclass(frozen=True)
class Measured:
    """What the gateway saw in a set of requests, in the harness parsers' convention
    (:class:`sono.events.Usage`: ``input_tokens`` counts cache writes, ``cached_tokens``
    the reads); ``metered`` when some answer reported usage at all."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    metered: bool = False


def measure(lines: Iterable[Mapping[str, Any]]) -> Measured:
    """Sum the gateway's usage-log lines (:mod:`sono.net.gateway`)."""
    requests = tokens_in = tokens_out = cached = 0
    cost = 0.0
    metered = False
    for line in lines:
        requests += 1
        fresh, writes = (
            _int(line.get("input_tokens")) or 0,
            _int(line.get("cache_write_tokens")) or 0,
        )
        reads, out = _int(line.get("cache_read_tokens")) or 0, _int(line.get("output_tokens")) or 0
        metered = metered or any(
            _int(line.get(k)) is not None for k in ("input_tokens", "output_tokens")
        )
        tokens_in, tokens_out, cached = tokens_in + fresh + writes, tokens_out + out, cached + reads
        model = line.get("model")
        price = _price(model if isinstance(model, str) else "")
        if price is not None:
            per_in, per_out = price
            cost += (fresh * per_in + writes * per_in * 1.25 + reads * per_in * 0.1) / 1e6
            cost += out * per_out / 1e6
    return Measured(requests, tokens_in, tokens_out, cached, cost, metered)


def _price(model: str) -> tuple[float, float] | None:
    """(input, output) dollars per million tokens; a provider prefix (``anthropic/``,
    ``us.anthropic.``, ``openai.``) is ignored."""
    name = model.lower().rsplit("/", 1)[-1]
    for vendor in ("anthropic.", "openai."):
        name = name.rsplit(vendor, 1)[-1]
    return next(((i, o) for prefix, i, o in PRICES if name.startswith(prefix)), None)
