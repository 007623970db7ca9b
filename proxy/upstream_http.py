"""A lean pooled HTTP/1.1 client for the pipeline's upstream requests (one body of bytes).

Why not aiohttp's `ClientSession` here: on the 1 KB pass-through (wrk, 32 connections) the bare
aiohttp pass-through spent 0.20 ms CPU per request and the same server with this pool's
prototype as its client 0.08 ms: aiohttp's client was most of it. The HTTP/1.1 parsing is
`httptools` (llhttp, the parser uvicorn uses); this module only pools connections and relays bytes.

What it does (RFC 9112):
- One keep-alive pool per origin (scheme, host, port), unbounded like the `TCPConnector(limit=0)`
  it stands beside; an idle connection is kept at most `IDLE_SECONDS` (aiohttp's keep-alive
  default) and dropped when the upstream closed it meanwhile.
- The request goes as `METHOD target HTTP/1.1`, `Host`, the caller's headers and
  `Content-Length` (the body is bytes: never chunked), in one write.
- The response body is delimited by `Content-Length`, chunked coding, or the end of the
  connection; `Connection: close`, HTTP/1.0 or a close-delimited body make the connection
  single-use. Interim 1xx responses are skipped. Chunks are handed over as they arrive, with
  back-pressure: reading pauses while more than `HIGH_WATER` bytes wait for the client.
- Failures surface as aiohttp's own exception types, so `proxy.forward` maps them to its
  502/504 replies exactly as for the `ClientSession`: connect failure `ClientConnectorError`
  (connect timeout `ConnectionTimeoutError`), connection closed before a response
  `ServerDisconnectedError`, before the end of the body `ClientPayloadError`, no bytes within
  `read_timeout` while reading the body `SocketTimeoutError`.
- Nothing is sent twice: an upstream that closes without answering is a 502, on a reused
  connection too (aiohttp's client retries only idempotent methods; these are POSTs). Idle
  connections are closed after `IDLE_SECONDS`, checked oldest first at each request.
- Limits: a response head over `MAX_HEAD_BYTES` or `MAX_HEADERS` fields is a 502; bytes after a
  complete response (a second response in one read, a body on a 204, a body longer than its
  Content-Length) end the connection, never merged into the response; a request target keeps
  only bytes a request line may hold (the rest percent-encoded); header values go as the bytes
  the client sent (UTF-8 included).
- An upstream URL with credentials (`http://user:pass@host`) is not served here: its
  requests keep aiohttp's `ClientSession` (`proxy/app.py`), which sends them as Basic auth.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator, Iterable
from typing import Final, cast

import aiohttp
import httptools
from aiohttp.client_reqrep import ConnectionKey
from multidict import CIMultiDict, CIMultiDictProxy

IDLE_SECONDS: Final = 15.0
"""An idle pooled connection older than this is closed rather than reused (aiohttp's default)."""
HIGH_WATER: Final = 256 * 1024
"""Response bytes buffered for the client before reading from the upstream pauses."""
MAX_HEAD_BYTES: Final = 64 * 1024
"""A response's status line and headers together; more is a 502 (aiohttp's client allows
8190 bytes per line and field, 128 fields)."""
MAX_HEADERS: Final = 256
"""Header fields in one response; more is a 502."""
_TARGET_SAFE: Final = frozenset(range(0x21, 0x7F))
"""Bytes a request target may hold as they are (RFC 9112 3.2: no space, no control byte, ASCII)."""


class _Unexpected(Exception):
    """Bytes after a complete response on a connection with no request pending."""


class _Connection(asyncio.Protocol):
    """One upstream connection: parses responses with `httptools`, queues body chunks."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.is_open = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._until_close = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.reason = ""
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.seen_bytes = False
        self.headers_done = False
        self.complete = False
        self.reusable = False
        self.failure: BaseException | None = None
        self.head_bytes = 0  # bytes read before the head ended (an unfinished head is bounded)
        self.header_bytes = 0  # the fields' bytes
        self._paused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.is_open = True

    def data_received(self, data: bytes) -> None:
        self.seen_bytes = True
        if not self.headers_done:
            self.head_bytes += len(data)
        try:
            if self.complete or self._head is None:
                raise _Unexpected
            self._parser.feed_data(data)
            if not self.headers_done and self.head_bytes > MAX_HEAD_BYTES:
                raise _Unexpected(f"response head over {MAX_HEAD_BYTES} bytes")
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, _Unexpected) as exc:
            cause = exc.__cause__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
            if not isinstance(cause, _Unexpected) or cause.args:
                self._protocol_error(f"bad upstream HTTP: {type(exc).__name__} {exc}")
            # else: bytes after a complete response (a second response, a body on a 204, a
            # body longer than its Content-Length): the response stands, the connection goes
            self.reusable = False
            self._close()

    def _protocol_error(self, message: str) -> None:
        """Before the head: a 502 (`ClientResponseError`); after it: the body ends early
        (`ClientPayloadError`, as a body cut short)."""
        if self.headers_done:
            self._fail(aiohttp.ClientPayloadError(message))
        else:
            self._fail(aiohttp.ClientResponseError(_NO_INFO, (), status=0, message=message))

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_open = False
        if self.complete:
            pass
        elif self.headers_done and self._until_close:
            self.complete = True  # a close-delimited body ends with the connection
        elif self.headers_done:
            self._fail(aiohttp.ClientPayloadError("Response payload is not completed"))
        elif self._head is not None and not self._head.done():
            self._fail(aiohttp.ServerDisconnectedError())
        self._wake_reader()

    def pause_writing(self) -> None:  # the request write is one buffer: nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.complete:
            raise _Unexpected  # a second response in the same read: never merged into the first

    def on_status(self, status: bytes) -> None:
        self.reason = status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))
        self.header_bytes += len(name) + len(value) + 4
        if len(self.raw_headers) > MAX_HEADERS:
            raise _Unexpected(f"more than {MAX_HEADERS} response header fields")
        if self.header_bytes > MAX_HEAD_BYTES:
            raise _Unexpected(f"response head over {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            return  # interim: its message completes without a body and is skipped
        self.status = status
        self.headers_done = True
        names = {name.lower() for name, _ in self.raw_headers}
        chunked = any(n.lower() == b"transfer-encoding" and b"chunked" in v.lower() for n, v in self.raw_headers)
        self._until_close = b"content-length" not in names and not chunked and status not in (204, 304)
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def on_message_complete(self) -> None:
        if not self.headers_done:  # an interim 1xx response ended: the real one follows
            self.raw_headers = []
            return
        self.complete = True
        self.reusable = self._parser.should_keep_alive() and not self._until_close
        self._wake_reader()

    # used by UpstreamResponse
    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
        self._wake_reader()

    def _wake_reader(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _close(self) -> None:
        self.is_open = False
        if self.transport is not None:
            self.transport.close()

    def begin(self, head: bytes, body: bytes) -> asyncio.Future[None]:
        """Send one request (its head, then its body); the future resolves when the response
        head is in. The two go as two buffers of one write (uvloop: one `writev`), so the body
        is never copied behind its head."""
        self._reset()
        self._parser = httptools.HttpResponseParser(self)
        self._until_close = False
        self._head = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.writelines((head, body))
        return self._head

    async def arrival(self) -> None:
        """Wait for the next body bytes, the end of the body or a failure."""
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await self._wake
        finally:
            self._wake = None

    async def next_chunk(self, read_timeout: float) -> bytes | None:
        """The next body chunk, `None` at the end of the body."""
        while not self.chunks:
            if self.complete:
                return None
            if self.failure is not None:
                raise self.failure
            try:
                async with asyncio.timeout(read_timeout):
                    await self.arrival()
            except TimeoutError:
                raise aiohttp.SocketTimeoutError(f"no upstream bytes within {read_timeout:g} s") from None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self._paused and self.buffered <= HIGH_WATER // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk


_NO_INFO: Final = aiohttp.RequestInfo(
    url=aiohttp.client_reqrep.URL("http://upstream"), method="POST", headers=CIMultiDictProxy(CIMultiDict())
)


class _Content:
    """`response.content` with the one method `proxy.forward` reads (`iter_any`)."""

    def __init__(self, connection: _Connection, read_timeout: float) -> None:
        self._connection = connection
        self._read_timeout = read_timeout

    async def iter_any(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive (raises the connection's failure, if any)."""
        while True:
            chunk = await self._connection.next_chunk(self._read_timeout)
            if chunk is None:
                return
            yield chunk


class UpstreamResponse:
    """One upstream response: `status`, `reason`, `headers` (case-insensitive, as received),
    `content.iter_any()`; then `release()` (connection back to the pool once the body was read
    whole) or `close()` (connection dropped)."""

    def __init__(self, pool: UpstreamPool, origin: _Origin, connection: _Connection, read_timeout: float) -> None:
        self._pool, self._origin, self._connection = pool, origin, connection
        self.status = connection.status
        self.reason = connection.reason
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(
            CIMultiDict(
                (n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
                for n, v in connection.raw_headers
            )
        )
        self.content = _Content(connection, read_timeout)
        self._done = False

    def release(self) -> None:
        """Return the connection to its pool when the body ended and it may be reused, else close it."""
        if self._done:
            return
        self._done = True
        conn = self._connection
        if conn.complete and conn.reusable and conn.is_open and not conn.chunks:
            conn.idle_since = time.monotonic()
            self._pool._idle[self._origin].append(conn)
        else:
            conn._close()

    def close(self) -> None:
        """Drop the connection (the body was not read to its end)."""
        if not self._done:
            self._done = True
            self._connection._close()


_Origin = tuple[str, str, int]


class UpstreamPool:
    """Keep-alive connections per origin for one provider's upstream requests.

    `connect_timeout` and `read_timeout` are seconds (the settings of the same names)."""

    def __init__(self, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: collections.defaultdict[_Origin, list[_Connection]] = collections.defaultdict(list)
        self._tls: ssl.SSLContext | None = None

    async def request(self, method: str, url: str, headers: Iterable[tuple[str, str]], body: bytes) -> UpstreamResponse:
        """Send `method url` with `headers` and `body`; returns once the response head is in
        (the body is read through `content.iter_any()`). `url` is absolute, already encoded."""
        origin, target = _split_url(url)
        lines = [method.encode("ascii"), b" ", _encode_target(target), b" HTTP/1.1\r\nHost: "]
        lines += [_host_header(origin).encode("idna"), b"\r\n"]
        for key, value in headers:
            if "\r" in value or "\n" in value or "\r" in key or "\n" in key:
                raise aiohttp.InvalidURL(f"header {key!r} holds a line break")  # never splits a request
            # the bytes the client sent (aiohttp's server decodes them as UTF-8, surrogateescape)
            lines += [key.encode("utf-8", "surrogateescape"), b": ", value.encode("utf-8", "surrogateescape"), b"\r\n"]
        lines += [b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n"]
        conn = await self._acquire(origin)
        # No second attempt when the upstream closes without answering, even on a reused
        # connection: a POST it may have begun would be billed twice (aiohttp's client retries
        # only idempotent methods).
        await self._begin(conn, b"".join(lines), body)
        return UpstreamResponse(self, origin, conn, self.read_timeout)

    @staticmethod
    async def _begin(conn: _Connection, head: bytes, body: bytes) -> None:
        """Send on `conn` and wait for the response head; `conn` is closed on any failure."""
        try:
            await conn.begin(head, body)
        except BaseException:
            conn._close()
            raise

    async def _acquire(self, origin: _Origin) -> _Connection:
        idle = self._idle[origin]
        now = time.monotonic()
        while idle and now - idle[0].idle_since >= IDLE_SECONDS:  # the oldest first
            idle.pop(0)._close()
        while idle:
            conn = idle.pop()
            if conn.is_open:
                return conn
        scheme, host, port = origin
        tls = self._tls_context() if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(_Connection, host, port, ssl=tls)
        except TimeoutError:
            raise aiohttp.ConnectionTimeoutError(f"connection to {host}:{port} timed out") from None
        except OSError as exc:
            key = ConnectionKey(host, port, tls is not None, tls or True, None, None, None, None)
            raise aiohttp.ClientConnectorError(key, exc) from None
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for conn in idle:
                conn._close()
        self._idle.clear()


def _split_url(url: str) -> tuple[_Origin, str]:
    """`(scheme, host, port)` and the request target of an absolute `http(s)` URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise aiohttp.InvalidURL(url)
    authority, slash, path = rest.partition("/")
    target = slash + path if slash else "/"
    if "?" in authority:
        authority, _, query = authority.partition("?")
        target = "/?" + query
    host, port = authority, 443 if scheme == "https" else 80
    if authority.startswith("["):
        end = authority.find("]")
        host, tail = authority[1:end], authority[end + 1 :]
        if tail.startswith(":"):
            port = int(tail[1:])
    elif ":" in authority:
        host, _, digits = authority.rpartition(":")
        port = int(digits)
    if "@" in host:
        raise aiohttp.InvalidURL(url)  # credentials in an upstream URL are not forwarded
    return (scheme, host, port), target


def _encode_target(target: str) -> bytes:
    """`target` as request-line bytes: a byte that may not appear there (space, CR, LF, any
    control or non-ASCII byte: a decoded query can hold them) is percent-encoded, so a client's
    query string can never add a header or a second request."""
    raw = target.encode("utf-8", "surrogateescape")
    if all(b in _TARGET_SAFE for b in raw):
        return raw
    return b"".join(bytes((b,)) if b in _TARGET_SAFE else b"%%%02X" % b for b in raw)


def _host_header(origin: _Origin) -> str:
    scheme, host, port = origin
    shown = f"[{host}]" if ":" in host else host
    return shown if port == (443 if scheme == "https" else 80) else f"{shown}:{port}"
