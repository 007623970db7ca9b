"""A lean pooled HTTP/1.1 client for the pipeline's upstream requests (one body of bytes).

Why not aiohttp's `ClientSession` here: measured on the 1 KB pass-through (`bench/gateway_bench.py`
with wrk, 32 connections), aiohttp's client spent ~0.11 ms CPU per request of the bare
pass-through's ~0.20 ms; this client spends ~0.02 ms. The HTTP/1.1 parsing is `httptools`
(llhttp, the parser uvicorn uses); this module only pools connections and relays bytes.

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
- A request on a *reused* connection that the upstream closed before sending a single response
  byte (the keep-alive race: it timed the connection out as we wrote) is sent once more on a new
  connection, as browsers and urllib3 do; never after any response byte.
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
        self._paused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.is_open = True

    def data_received(self, data: bytes) -> None:
        self.seen_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(aiohttp.ClientResponseError(_NO_INFO, (), status=0, message=f"bad upstream HTTP: {exc}"))
            self._close()

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
    def on_status(self, status: bytes) -> None:
        self.reason = status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

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

    def begin(self, payload: bytes) -> asyncio.Future[None]:
        """Send one request's bytes; the future resolves when the response head is in."""
        self._reset()
        self._parser = httptools.HttpResponseParser(self)
        self._until_close = False
        self._head = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(payload)
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
            if self.failure is not None:
                raise self.failure
            if self.complete:
                return None
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
            CIMultiDict((n.decode("latin-1"), v.decode("latin-1")) for n, v in connection.raw_headers)
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
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {_host_header(origin)}\r\n"]
        for key, value in headers:
            if "\r" in value or "\n" in value or "\r" in key or "\n" in key:
                raise aiohttp.InvalidURL(f"header {key!r} holds a line break")  # never splits a request
            lines.append(f"{key}: {value}\r\n")
        lines.append(f"Content-Length: {len(body)}\r\n\r\n")
        payload = "".join(lines).encode("latin-1") + body
        conn, reused = await self._acquire(origin)
        try:
            await self._begin(conn, payload)
        except aiohttp.ServerDisconnectedError:
            if not reused or conn.seen_bytes:
                raise
            conn, _ = await self._acquire(origin, fresh=True)
            await self._begin(conn, payload)
        return UpstreamResponse(self, origin, conn, self.read_timeout)

    @staticmethod
    async def _begin(conn: _Connection, payload: bytes) -> None:
        """Send on `conn` and wait for the response head; `conn` is closed on any failure."""
        try:
            await conn.begin(payload)
        except BaseException:
            conn._close()
            raise

    async def _acquire(self, origin: _Origin, fresh: bool = False) -> tuple[_Connection, bool]:
        idle = self._idle[origin]
        now = time.monotonic()
        while idle and not fresh:
            conn = idle.pop()
            if conn.is_open and now - conn.idle_since < IDLE_SECONDS:
                return conn, True
            conn._close()
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
        return conn, False

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


def _host_header(origin: _Origin) -> str:
    scheme, host, port = origin
    shown = f"[{host}]" if ":" in host else host
    return shown if port == (443 if scheme == "https" else 80) else f"{shown}:{port}"
