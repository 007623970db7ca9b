"""forward: the terminal step. Sends the request upstream and streams the answer back untouched.

- Request headers pass through except hop-by-hop ones (RFC 9110 section 7.6.1) and `Host` /
  `Content-Length`, which the client library sets for the new connection.
- The response's status, headers and body bytes reach the client unchanged and as they arrive:
  no decompression (the upstream `ClientSession` has `auto_decompress=False`), no buffering of
  SSE. Each chunk is written first and then teed to a usage reader (gzip/deflate bodies are
  inflated on the side for the tee only). A JSON body over `WHOLE_JSON_BYTES` is not held whole:
  its usage is read from its head and tail (`top_level_fields`), so memory per in-flight
  response stays O(chunk).
- Local errors, in the provider's error shape: connect failure -> 502, no response within
  `read_timeout` -> 504. A failure after the headers went out ends the stream (the status can
  no longer change).
- A client disconnect cancels the handler (`handler_cancellation=True`), which closes the
  upstream connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any, Final

import aiohttp
import orjson
import yarl
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.body_encoding import UNDECODABLE_BODY, too_large_message
from proxy.connections import ClientBodyTimeout
from proxy.eventstream import EventStreamDecoder, Message, bedrock_chunk
from proxy.exchange import Exchange
from proxy.metrics import ProviderMetrics
from proxy.providers.base import (
    BAD_GATEWAY,
    BAD_REQUEST,
    CLIENT_TIMEOUT,
    GATEWAY_TIMEOUT,
    TOO_LARGE,
    ErrorKind,
    ProviderAdapter,
    UsageReader,
)
from proxy.sse import SSEDecoder
from proxy.tracing import CURRENT as CURRENT_TRACE
from proxy.upstream_http import UpstreamPool, UpstreamResponse
from proxy.upstreams import host_of

_log = logging.getLogger("promptcache.forward")

HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_DROP_REQUEST: Final = HOP_BY_HOP | {"host", "content-length", "content-encoding", "expect"}
"""`Content-Encoding` goes too: a gzip/deflate request body is inflated before it is forwarded
(`proxy.handlers.read_body`, `proxy.body_encoding`), so the bytes forwarded are identity-encoded
(a streamed body of another coding gets its coding back through `Exchange.header_overrides`).
`Expect` is hop-by-hop here: aiohttp's server answers `100 Continue` itself, so forwarding
`Expect: 100-continue` would make the upstream request wait for a second 100 that an upstream
may never send (RFC 9110 10.1.1: a proxy that answered 100 does not forward the expectation)."""
_DROP_RESPONSE: Final = HOP_BY_HOP
WHOLE_JSON_BYTES: Final = 1024 * 1024
"""A JSON response up to this size is parsed whole for its usage; a larger one is read from its
first `JSON_HEAD_BYTES` and last `JSON_TAIL_BYTES` only (memory per response bounded)."""
JSON_HEAD_BYTES: Final = 64 * 1024
JSON_TAIL_BYTES: Final = 256 * 1024
_HEAD_KEYS: Final = ("id", "type", "object", "model", "role")
_TAIL_KEYS: Final = ("usage", "stop_reason", "status")


def _value_end(text: bytes, start: int) -> int:
    """End of the JSON value starting at `text[start]` (an object, array, string or scalar),
    or -1 when it does not end inside `text`."""
    opener = text[start : start + 1]
    if opener == b'"':
        i = start + 1
        while i < len(text):
            if text[i : i + 1] == b"\\":
                i += 2
                continue
            if text[i : i + 1] == b'"':
                return i + 1
            i += 1
        return -1
    if opener in (b"{", b"["):
        depth, i, in_string = 0, start, False
        while i < len(text):
            ch = text[i : i + 1]
            if in_string:
                if ch == b"\\":
                    i += 1
                elif ch == b'"':
                    in_string = False
            elif ch == b'"':
                in_string = True
            elif ch in (b"{", b"["):
                depth += 1
            elif ch in (b"}", b"]"):
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return -1
    i = start
    while i < len(text) and text[i : i + 1] not in (b",", b"}", b"]"):
        i += 1
    return i if i < len(text) else -1


def top_level_fields(head: bytes, tail: bytes) -> dict[str, Any]:
    """The response fields usage readers need, from the head and tail of a JSON body too large
    to parse whole: the first `"key":` of `_HEAD_KEYS` in `head`, the last of `_TAIL_KEYS` in
    `tail` (top-level keys in the providers' own field order); what cannot be read is left out."""
    out: dict[str, Any] = {}
    for text, keys, find in ((head, _HEAD_KEYS, bytes.find), (tail, _TAIL_KEYS, bytes.rfind)):
        for key in keys:
            at = find(text, b'"' + key.encode() + b'":')
            if at < 0:
                continue
            start = at + len(key) + 3
            while start < len(text) and text[start : start + 1] in b" \t\r\n":
                start += 1
            end = _value_end(text, start)
            if end < 0:
                continue
            try:
                out[key] = orjson.loads(text[start:end])
            except orjson.JSONDecodeError:
                continue
    return out
EVENTSTREAM_TYPE: Final = "application/vnd.amazon.eventstream"
_STREAM_TYPES: Final = ("text/event-stream", EVENTSTREAM_TYPE)


class _HeadWithBody(web.StreamResponse):
    """A relayed response whose status line and headers go out in one write with the first
    body bytes (aiohttp's `Response` does the same), not in a write of their own: one send per
    small JSON answer instead of two. Streams (SSE, AWS event streams) keep aiohttp's default
    (headers sent at `prepare`), so a client sees a stream open before its first event."""

    _send_headers_immediately = False


def request_headers(incoming: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Headers to send upstream: all but hop-by-hop, `Host`, `Content-Length` and
    `Content-Encoding` (the body we forward is already inflated)."""
    out: CIMultiDict[str] = CIMultiDict()
    connection_listed = {
        token.strip().lower() for value in incoming.getall("connection", []) for token in value.split(",")
    }
    for key, value in incoming.items():
        lower = key.lower()
        if lower in _DROP_REQUEST or lower in connection_listed:
            continue
        out.add(key, value)
    return out


def local_error(adapter: ProviderAdapter, kind: ErrorKind, message: str) -> web.Response:
    """A reply promptcache answers itself, in the provider's error JSON shape."""
    return web.Response(
        status=kind.status, body=adapter.error_body(kind, message), content_type="application/json"
    )


def closing(response: web.Response) -> web.Response:
    """`response` with `Connection: close` (the connection ends after it)."""
    response.force_close()
    return response


def _upstream_failure(exchange: Exchange, base_url: str, read_timeout: float, exc: BaseException) -> web.Response:
    """The local 502/504 for an upstream request that raised `exc` before any response."""
    adapter = exchange.adapter
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)):
        exchange.status = BAD_GATEWAY.status
        _log.warning("upstream %s unreachable: %s", base_url, type(exc).__name__)
        return local_error(
            adapter, BAD_GATEWAY, f"promptcache could not reach the upstream {host_of(base_url)} ({type(exc).__name__})"
        )
    if isinstance(exc, (TimeoutError, aiohttp.ServerTimeoutError)):
        exchange.status = GATEWAY_TIMEOUT.status
        _log.warning("upstream %s timed out after %.1f s", base_url, read_timeout)
        return local_error(
            adapter, GATEWAY_TIMEOUT, f"the upstream {host_of(base_url)} did not answer within {read_timeout:g} s"
        )
    exchange.status = BAD_GATEWAY.status
    _log.warning("upstream %s failed: %s", base_url, type(exc).__name__)
    return local_error(
        adapter, BAD_GATEWAY, f"the request to the upstream {host_of(base_url)} failed ({type(exc).__name__})"
    )


def _client_body_failure(request: web.Request, exchange: Exchange) -> web.Response | None:
    """The 408 for a streamed client body that stalled (`proxy.connections.ClientBodyTimeout`
    set on the request payload), or the 400 for one that did not decode as its
    `Content-Encoding` says (`Exchange.undecodable_body`), or the 413 for one that passed
    `max_body_bytes` (`Exchange.body_too_large`), surfacing as whatever the upstream request
    raised; `None` when the client's body is not the cause."""
    if exchange.body_too_large is not None:
        exchange.status = TOO_LARGE.status
        return closing(local_error(exchange.adapter, TOO_LARGE, too_large_message(exchange.body_too_large)))
    if exchange.undecodable_body is not None:
        exchange.status = BAD_REQUEST.status
        return closing(local_error(exchange.adapter, BAD_REQUEST, UNDECODABLE_BODY))
    failure = request.content.exception()
    if not isinstance(failure, ClientBodyTimeout):
        return None
    exchange.status = CLIENT_TIMEOUT.status
    return closing(local_error(exchange.adapter, CLIENT_TIMEOUT, str(failure)))


class UsageTee:
    """Feeds response bytes to a `UsageReader` without touching them."""

    def __init__(self, reader: UsageReader, content_type: str, content_encoding: str) -> None:
        self.reader = reader
        self._is_sse = content_type.startswith("text/event-stream")
        self._frames = EventStreamDecoder() if content_type.startswith(EVENTSTREAM_TYPE) else None
        self._is_json = "json" in content_type
        encoding = content_encoding.lower().strip()
        self._inflate = zlib.decompressobj(47) if encoding in ("gzip", "deflate", "x-gzip") else None
        self._disabled = encoding not in ("", "identity", "gzip", "deflate", "x-gzip")
        self._sse = SSEDecoder()
        self._json = bytearray()
        self._head = b""
        self._is_large = False

    def feed(self, chunk: bytes) -> None:
        if self._disabled or not (self._is_sse or self._is_json or self._frames):
            return
        try:
            if self._inflate is not None:
                chunk = self._inflate.decompress(chunk)
            if self._frames is not None:
                for message in self._frames.decode(chunk):
                    self._frame(message)
            elif self._is_sse:
                for event in self._sse.decode(chunk):
                    self._event(event.event, event.data)
            else:
                self._keep_json(chunk)
        except (zlib.error, ValueError):
            self._disabled = True

    def _frame(self, message: Message) -> None:
        """One AWS event-stream message: a Bedrock `chunk` carries an Anthropic stream event
        (base64 JSON); other events (Converse `metadata` ...) carry their JSON directly."""
        data = bedrock_chunk(message)
        if data is not None:
            if isinstance(data, dict):
                self.reader.feed_event(str(data.get("type", "")), data)
            return
        if message.headers.get(":message-type") == "event":
            try:
                self.reader.feed_event(str(message.headers.get(":event-type", "")), orjson.loads(message.payload))
            except orjson.JSONDecodeError:
                pass

    @property
    def buffered_bytes(self) -> int:
        """Bytes of a JSON body held for the usage reader (at most `WHOLE_JSON_BYTES`, then
        `JSON_HEAD_BYTES + JSON_TAIL_BYTES` plus one chunk)."""
        return len(self._head) + len(self._json)

    def _keep_json(self, chunk: bytes) -> None:
        self._json += chunk
        if not self._is_large and len(self._json) > WHOLE_JSON_BYTES:
            self._is_large = True
            self._head = bytes(self._json[:JSON_HEAD_BYTES])
        if self._is_large and len(self._json) > JSON_TAIL_BYTES:
            del self._json[: len(self._json) - JSON_TAIL_BYTES]

    def _event(self, name: str, data: str) -> None:
        if not data or data == "[DONE]":
            return
        try:
            self.reader.feed_event(name, orjson.loads(data))
        except orjson.JSONDecodeError:
            pass

    def finish(self) -> None:
        if self._disabled:
            return
        try:
            if self._inflate is not None:
                tail = self._inflate.flush()
                if self._is_sse:
                    for event in self._sse.decode(tail):
                        self._event(event.event, event.data)
                else:
                    self._keep_json(tail)
            if self._is_sse:
                for event in self._sse.flush():
                    self._event(event.event, event.data)
            elif self._is_json and self._is_large:
                self.reader.feed_json(top_level_fields(self._head, bytes(self._json)))
            elif self._is_json and self._json:
                self.reader.feed_json(orjson.loads(bytes(self._json)))
        except (zlib.error, ValueError):
            pass


def _take_usage(exchange: Exchange, reader: UsageReader) -> None:
    usage = reader.result()
    if usage.seen:
        exchange.usage = usage


async def forward(
    request: web.Request,
    exchange: Exchange,
    session: aiohttp.ClientSession | UpstreamPool,
    base_url: str,
    metrics: ProviderMetrics,
    read_timeout: float,
    data: bytes | AsyncIterator[bytes] | None,
) -> web.StreamResponse:
    """Send `exchange` upstream and stream the response to the client.

    `data` is the request body (`exchange.outgoing` on pipeline routes, the client's stream or
    `None` elsewhere). `session` is the lean pool (`proxy.upstream_http`, a body of bytes) or
    aiohttp's `ClientSession` (a streamed body). Sets `exchange.status`, `exchange.usage` (when
    the response carries usage) and `exchange.sent_at`. Returns the prepared response (or a
    local 502/504 reply). With tracing on (`proxy/tracing.py`) the call runs in an `upstream`
    span whose `traceparent` goes upstream.
    """
    path = exchange.upstream_path or exchange.path
    url: str | yarl.URL = base_url + path + (f"?{exchange.query_string}" if exchange.query_string else "")
    if exchange.upstream_path is not None:
        url = yarl.URL(url, encoded=True)  # a platform path goes as received (signed paths)
    headers = request_headers(exchange.headers)
    for key, value in exchange.header_overrides.items():
        headers.popall(key, None)
        if value is not None:
            headers[key] = value
    trace = CURRENT_TRACE.get()
    if trace is None:
        return await _send(request, exchange, session, base_url, url, headers, metrics, read_timeout, data)
    with trace.upstream(request.method, str(url), headers) as span:
        response = await _send(request, exchange, session, base_url, url, headers, metrics, read_timeout, data)
        span.set_status_code(exchange.status)
        if exchange.usage is not None:
            span.set_usage(exchange.usage)
        return response


async def _send(
    request: web.Request,
    exchange: Exchange,
    session: aiohttp.ClientSession | UpstreamPool,
    base_url: str,
    url: str | yarl.URL,
    headers: CIMultiDict[str],
    metrics: ProviderMetrics,
    read_timeout: float,
    data: bytes | AsyncIterator[bytes] | None,
) -> web.StreamResponse:
    exchange.sent_at = time.perf_counter()
    metrics.overhead.observe(exchange.sent_at - exchange.received_at)
    adapter = exchange.adapter
    try:
        async with asyncio.timeout(read_timeout):
            if isinstance(session, UpstreamPool):
                assert isinstance(data, bytes), "the lean pool sends a body of bytes"
                upstream: aiohttp.ClientResponse | UpstreamResponse = await session.request(
                    request.method, str(url), headers.items(), data
                )
            else:
                upstream = await session.request(request.method, url, headers=headers, data=data)
    except (aiohttp.ClientError, TimeoutError) as exc:
        stalled = _client_body_failure(request, exchange)
        if stalled is not None:
            return stalled
        return _upstream_failure(exchange, base_url, read_timeout, exc)
    is_complete = False
    try:
        metrics.first_byte.observe(time.perf_counter() - exchange.sent_at)
        exchange.status = upstream.status
        content_type = upstream.headers.get("content-type", "")
        is_stream = content_type.startswith(_STREAM_TYPES)
        response_type = web.StreamResponse if is_stream else _HeadWithBody
        response = response_type(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in _DROP_RESPONSE:
                response.headers.add(key, value)
        reader = adapter.usage_reader()
        tee = UsageTee(reader, content_type, upstream.headers.get("content-encoding", ""))
        try:
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
                tee.feed(chunk)
        except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ServerTimeoutError) as exc:
            _log.warning("upstream stream ended early: %s", type(exc).__name__)
            exchange.stream_error = type(exc).__name__
            if response.prepared and not is_stream:
                with contextlib.suppress(ConnectionResetError):  # the held status line and headers go out
                    await response.write(b"")
            _take_usage(exchange, reader)
            if request.transport is not None:
                request.transport.close()
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            # The client went away: the upstream is closed below; usage already seen (billed
            # by the upstream, e.g. Anthropic's `message_start`) is still counted.
            exchange.is_client_gone = True
            _take_usage(exchange, reader)
            raise
        # Every upstream byte is relayed and read: usage is final and the upstream connection
        # reusable, whatever happens to the terminating write below.
        is_complete = True
        tee.finish()
        _take_usage(exchange, reader)
        try:
            await response.write_eof()
        except ConnectionResetError:
            # The client hung up right after the last data byte (only the chunked terminator
            # or a buffered tail was lost): the response counts as delivered, not as a 499.
            _log.debug("client closed before the end of the response was written")
        return response
    finally:
        if is_complete:
            upstream.release()
        else:
            upstream.close()
