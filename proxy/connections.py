"""Client connection limits on the proxy listener (issue 11, item 4).

aiohttp's server bounds a header line (`max_line_size`, `max_field_size`) and the header count
(`max_headers`, 128) and closes idle keep-alive connections (`keepalive_timeout`, our
`client_idle_timeout`), but has no timeout for a request head or body that is sent half-way and
then stalls, no bound on a head's total size and none on the number of connections. This
module adds them as a subclass of aiohttp's connection protocol (`LimitedRequestHandler`),
installed by `LimitedRunner`:

- `client_header_timeout`: from the first byte of a request head to its blank line. Exceeded:
  408, connection closed.
- `client_body_timeout`: the longest pause between two reads of a request body (nginx's
  meaning: a large body over a slow link is fine, a stalled one is not). Exceeded: the body
  read fails with `ClientBodyTimeout`; the handler answers 408 and closes the connection.
- `max_header_bytes`: the request line and headers together. Exceeded: 431, closed.
- `max_header_count`: header lines in one request (aiohttp's parser answers more than its
  `max_headers` with a plain 400; this answers first). Exceeded: 431, closed.
- `max_connections`: connections open at once. The connection over the limit is accepted, its
  first request answered 503 (`Retry-After: 1`) and the connection closed (never queued: an
  SDK retries at once on its own, and a queued connection would hold a socket with no
  deadline).
- `max_connections_per_client`: connections open at once from one client address (default a
  quarter of `max_connections`, at least 1), so one client cannot hold every slot. The
  connection over it is answered like one over `max_connections` (503, counted as
  `too_many_client_connections`), and closed after `LINGER_SECONDS` if its request head has
  not arrived by then, so a flood of half-sent requests from one address holds at most this
  many connections for longer than that.
- Probes are never refused by either cap: such a connection is accepted and its request
  head read as usual (aiohttp's parser); a request for `PROBE_PATHS` (`/healthz`, `/readyz`,
  `/metrics`) is then served by the app, and only other paths get the 503. The connection
  closes after that one response either way.

Every local answer is in the provider's error shape, chosen from the request line's path as the
handler would route it (and from the credential headers already received, for shared paths);
with no request line yet, the Anthropic shape (the `route("/")` default). Each close is counted
in `promptcache_connections_closed_total{reason}` (`proxy.metrics.CLOSE_REASONS`), including idle
closes.

Pipelined requests sent in one packet with the end of an earlier body are not under the header
timeout (the idle timeout still closes such a connection once it waits).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import unquote

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from prometheus_client import Counter

from proxy.providers import is_openai_credential_shape, route
from proxy.providers.base import (
    BAD_REQUEST,
    CLIENT_TIMEOUT,
    HEADERS_TOO_LARGE,
    OVERLOADED,
    ErrorKind,
    ProviderAdapter,
)

PROBE_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths a connection over a cap is still served (health, readiness and metrics probes)."""
LINGER_SECONDS: Final = 2.0
"""After a local error answer the connection is half-closed (FIN after the answer) and closed
for good when the client closes or after this long, so the client reads the answer instead of a
reset."""


class ClientBodyTimeout(TimeoutError):
    """The client sent no body byte for `client_body_timeout` seconds (set on the request's
    payload, raised by `request.read()` / `request.content`)."""


@dataclass
class ConnectionLimits:
    """The limits of one listener and its count of open connections."""

    header_timeout: float
    body_timeout: float
    max_header_bytes: int
    max_header_count: int
    max_connections: int
    max_client_connections: int
    """Connections open at once from one client address (`max_connections_per_client`)."""
    closed: dict[str, Counter]
    """`promptcache_connections_closed_total` children by `reason` (`CLOSE_REASONS`)."""
    route_error: Callable[[str, str, bool], ProviderAdapter]
    """`(path, raw path, openai credential shape) -> adapter` whose `error_body` renders."""
    open: int = 0
    """Connections open now on this listener."""
    by_client: dict[str, int] = field(default_factory=dict)
    """Open connections per client address (addresses with none are removed)."""
    _all_closed: asyncio.Event | None = None

    def count(self, reason: str) -> None:
        self.closed[reason].inc()

    def opened(self, client: str) -> int:
        """Count a new connection from `client`; its client's open connections now."""
        self.open += 1
        n = self.by_client.get(client, 0) + 1
        self.by_client[client] = n
        return n

    def closed_one(self, client: str) -> None:
        self.open -= 1
        n = self.by_client.get(client, 1) - 1
        if n > 0:
            self.by_client[client] = n
        else:
            self.by_client.pop(client, None)
        if self.open == 0 and self._all_closed is not None:
            self._all_closed.set()

    async def wait_closed(self, timeout: float) -> None:
        """Return once no connection is open on this listener, or after `timeout` seconds."""
        if self.open == 0:
            return
        self._all_closed = asyncio.Event()
        try:
            await asyncio.wait_for(self._all_closed.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self._all_closed = None


def _default_adapter(path: str, raw: str, openai: bool) -> ProviderAdapter:
    return route(path, openai)[0]


def limits_for(settings: Any, metrics: Any, router: Any = None) -> ConnectionLimits:
    """`ConnectionLimits` from `Settings` (`client_header_timeout`, `client_body_timeout`,
    `max_header_bytes`, `max_connections`) and the app's `Metrics`."""

    def route_error(path: str, raw: str, openai: bool) -> ProviderAdapter:
        if router is not None:
            try:
                return router.route(path, raw, openai).adapter
            except Exception:  # noqa: BLE001 - a bad path falls back to the default shape
                pass
        return _default_adapter(path, raw, openai)

    return ConnectionLimits(
        header_timeout=settings.client_header_timeout,
        body_timeout=settings.client_body_timeout,
        max_header_bytes=settings.max_header_bytes,
        max_header_count=settings.max_header_count,
        max_connections=settings.max_connections,
        max_client_connections=client_connection_cap(settings),
        closed=metrics.connections_closed_by_reason,
        route_error=route_error,
    )


def client_connection_cap(settings: Any) -> int:
    """`max_connections_per_client`, or a quarter of `max_connections` (at least 1) when unset."""
    cap = settings.max_connections_per_client
    return int(cap) if cap is not None else max(1, settings.max_connections // 4)


def _head_facts(head: bytes) -> tuple[str, str, bool]:
    """`(path, raw path, openai credential shape)` from a request head received so far."""
    line, complete, rest = head.partition(b"\r\n")
    parts = line.split(b" ")
    raw = parts[1].decode("latin-1").partition("?")[0] if complete and len(parts) >= 2 else ""
    if not raw.startswith("/"):
        raw = "/"
    names = {
        header.partition(b":")[0].strip().lower().decode("latin-1") for header in rest.split(b"\r\n") if b":" in header
    }
    openai = is_openai_credential_shape(names)
    return unquote(raw), raw, openai


def error_response_bytes(adapter: ProviderAdapter, kind: ErrorKind, message: str) -> bytes:
    """A whole HTTP/1.1 response (`Connection: close`) carrying `adapter`'s error body."""
    body = adapter.error_body(kind, message)
    head = (
        f"HTTP/1.1 {kind.status} {HTTPStatus(kind.status).phrase}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _closing_error(
    adapter: ProviderAdapter, kind: ErrorKind, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    """`kind` as a JSON response in `adapter`'s error shape, the connection closed after it."""
    response = web.Response(
        status=kind.status, body=adapter.error_body(kind, message), content_type="application/json", headers=headers
    )
    response.force_close()
    return response


class LimitedRequestHandler(RequestHandler):
    """aiohttp's connection protocol with the limits of the module docstring."""

    def __init__(self, manager: web.Server, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._head = bytearray()
        """The request head received so far (header phase only; bounded by `max_header_bytes`)."""
        self._body: StreamReader | None = None
        """The payload still being received (body phase)."""
        self._body_deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._is_counted_open = False
        self._is_lingering = False
        self._client = ""
        self._app_handler = self._request_handler
        self._refusal = ""
        """Why this connection is over a cap (`""` when it is not): the 503's message."""
        self._cap_timer: asyncio.TimerHandle | None = None

    # connection lifecycle -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limits = self._limits
        peer = transport.get_extra_info("peername")
        self._client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        from_client = limits.opened(self._client)
        self._is_counted_open = True
        if limits.open > limits.max_connections:
            limits.count("too_many_connections")
            self._refusal = f"promptcache has {limits.max_connections} connections open (max_connections); retry"
        elif from_client > limits.max_client_connections:
            limits.count("too_many_client_connections")
            self._refusal = (
                f"promptcache has {limits.max_client_connections} connections open from this client address "
                "(max_connections_per_client); retry"
            )
            self._cap_timer = self._loop.call_later(LINGER_SECONDS, self._cap_timed_out)
        if self._refusal:
            self._request_handler = self._answer_overloaded
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._is_counted_open:
            self._is_counted_open = False
            self._limits.closed_one(self._client)
        self._cancel_timer()
        if self._cap_timer is not None:
            self._cap_timer.cancel()
            self._cap_timer = None
        super().connection_lost(exc)

    def eof_received(self) -> None:
        if self._is_lingering:
            self.force_close()

    def _process_keepalive(self) -> None:
        was_closed = self._force_close
        super()._process_keepalive()
        if self._force_close and not was_closed:
            self._limits.count("idle")

    # incoming bytes -------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._is_lingering:
            return
        if self._force_close or self._close or self._upgraded or self._payload_parser is not None:
            super().data_received(data)
            return
        if self._body is not None:
            if not self._body.is_eof():
                self._body_deadline = self._loop.time() + self._limits.body_timeout
                super().data_received(data)
                self._after_body_data()
                return
            self._body = None
        self._on_head_data(data)

    def _on_head_data(self, data: bytes) -> None:
        limits = self._limits
        if not self._head:
            end = data.find(b"\r\n\r\n")
            if 0 <= end <= limits.max_header_bytes - 4 and data.count(b"\r\n", 0, end) <= limits.max_header_count:
                # the whole head in one read, within the limits: no header timer to arm and
                # cancel, no copy (most requests)
                self._cancel_timer()
                self._on_head(data)
                return
            self._arm(limits.header_timeout, self._header_timed_out)
        start = max(0, len(self._head) - 3)  # a head trickled byte by byte is searched once
        self._head += data
        end = self._head.find(b"\r\n\r\n", start)
        size = len(self._head) if end < 0 else end + 4
        if size > limits.max_header_bytes:
            limits.count("header_too_large")
            self._answer_locally(
                HEADERS_TOO_LARGE, f"request headers exceed the limit of {limits.max_header_bytes} bytes"
            )
            return
        if end < 0:
            super().data_received(data)
            return
        if self._head.count(b"\r\n", 0, end) > limits.max_header_count:  # one CRLF per header line
            limits.count("too_many_headers")
            self._answer_locally(
                HEADERS_TOO_LARGE, f"request has more than {limits.max_header_count} header lines (max_header_count)"
            )
            return
        self._cancel_timer()
        self._head.clear()
        self._on_head(data)

    def _on_head(self, data: bytes) -> None:
        """Hand bytes that complete a request head (within the limits) to the parser; a body
        still to come gets the body timer."""
        limits = self._limits
        before = self._request_count
        super().data_received(data)
        if self._request_count > before and self._messages:
            payload = self._messages[-1][1]
            if isinstance(payload, StreamReader) and not payload.is_eof():
                self._body = payload
                self._body_deadline = self._loop.time() + limits.body_timeout
                self._arm(limits.body_timeout, self._body_timer)

    def _after_body_data(self) -> None:
        if self._body is not None and self._body.is_eof():
            self._body = None
            self._cancel_timer()

    # timers ---------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._cancel_timer()
        self._timer = self._loop.call_later(delay, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_timed_out(self) -> None:
        self._timer = None
        if not self._head or self._force_close or self.transport is None:
            return
        if self._request_in_progress:  # a pipelined head: its time starts after this response
            self._arm(self._limits.header_timeout, self._header_timed_out)
            return
        self._limits.count("header_timeout")
        self._answer_locally(CLIENT_TIMEOUT, f"request headers not received within {self._limits.header_timeout:g} s")

    def _cap_timed_out(self) -> None:
        self._cap_timer = None
        if self._request_count == 0:  # no request head within LINGER_SECONDS: close
            self.force_close()

    def _body_timer(self) -> None:
        self._timer = None
        body = self._body
        if body is None or body.is_eof() or self._force_close:
            return
        now = self._loop.time()
        if now < self._body_deadline:
            self._timer = self._loop.call_at(self._body_deadline, self._body_timer)
            return
        self._limits.count("body_timeout")
        self._body = None
        body.set_exception(ClientBodyTimeout(f"no request body byte received for {self._limits.body_timeout:g} s"))

    # local answers --------------------------------------------------------------------

    def _answer_locally(self, kind: ErrorKind, message: str) -> None:
        """Write `kind` in the shape the head's path routes to, then half-close and linger."""
        path, raw, openai = _head_facts(bytes(self._head))
        self._head.clear()
        self._cancel_timer()
        transport = self.transport
        if transport is None:
            return
        adapter = self._limits.route_error(path, raw, openai)
        transport.write(error_response_bytes(adapter, kind, message))
        self._is_lingering = True
        self.keep_alive(False)
        self.close()
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = self._loop.call_later(LINGER_SECONDS, self.force_close)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (400) is answered in the provider's shape and
        logged by exception class only: aiohttp's own log line quotes the raw head bytes, and
        so the client's credential (`x-api-key: ...`). Counted as `bad_request`. Other
        statuses are aiohttp's."""
        if status != HTTPStatus.BAD_REQUEST or exc is None or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        self.logger.warning("malformed HTTP request from %s: %s", request.remote, type(exc).__name__)
        self._limits.count("bad_request")
        path, raw, openai = _head_facts(bytes(self._head)) if self._head else ("/", "/", False)
        adapter = self._limits.route_error(path, raw, openai)
        return _closing_error(adapter, BAD_REQUEST, f"malformed HTTP request ({type(exc).__name__})")

    async def _answer_overloaded(self, request: web.BaseRequest) -> web.StreamResponse:
        """The request handler of a connection over a cap: a probe is served, anything else
        answered 503 (`Retry-After: 1`) in the path's error shape; the connection then closes."""
        if request.path in PROBE_PATHS and self._app_handler is not None:
            served = await self._app_handler(request)
            served.force_close()
            return served
        raw = request.raw_path.partition("?")[0]
        openai = is_openai_credential_shape(request.headers)
        adapter = self._limits.route_error(request.path, raw, openai)
        return _closing_error(adapter, OVERLOADED, self._refusal, {"Retry-After": "1"})


class LimitedServer(web.Server):
    """`web.Server` whose connections are `LimitedRequestHandler`s."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._handler_kwargs = {
            k: v for k, v in kwargs.items() if k not in ("loop", "request_factory", "handler_cancellation")
        }

    def __call__(self) -> RequestHandler:
        return LimitedRequestHandler(self, loop=self._loop, limits=self.limits, **self._handler_kwargs)


class LimitedRunner(web.AppRunner):
    """`web.AppRunner` serving through `LimitedServer` (aiohttp builds its server in
    `_make_server`; this keeps aiohttp's and swaps only the connection protocol)."""

    def __init__(self, app: web.Application, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.limits = limits
        self._server_kwargs = kwargs

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        kwargs = {k: v for k, v in self._server_kwargs.items() if k != "handler_cancellation"}
        return LimitedServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            limits=self.limits,
            **kwargs,
        )
