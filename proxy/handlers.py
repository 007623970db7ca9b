"""HTTP handlers: the catch-all proxy route, health endpoints and `/metrics`.

Pipeline routes (`POST /v1/messages`, `/v1/chat/completions`, `/v1/responses`, optionally under
`/anthropic` or `/openai`) read the body (at most `max_body_bytes`, else 413 in the provider's
error shape; a `Content-Length` over it gets the 413 from the head alone, with no `100 Continue`:
`expect_continue`), run the request stages, forward, then observe. Every other path and method is
reverse-proxied as is, body streamed (a compressed one inflated as it streams, at most
`max_body_bytes` once inflated, else the same 413: `_bounded`).

Logging: one access line per request (`proxy.logs.access_fields`): provider, method, path
(never the query string), status, time, tokens, cost, cause and session; never a header value,
never a body.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import HttpVersion11, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from proxy.affinity import is_failure
from proxy.appkeys import CLIENT_SESSIONS, SERVICES, UPSTREAM_POOLS, UPSTREAMS
from proxy.body_encoding import (
    UNDECODABLE_BODY,
    BodyTooLarge,
    StackedCodings,
    UndecodableBody,
    codings,
    inflate,
    inflating,
    streamable,
    too_large_message,
)
from proxy.connections import ClientBodyTimeout
from proxy.exchange import Exchange
from proxy.forward import closing, forward, local_error
from proxy.logs import ACCESS_LOGGER, access_fields, log_access
from proxy.metrics import ProviderMetrics
from proxy.pipeline import run_request_stages
from proxy.pipeline.observe import record_usage
from proxy.pipeline.parse import invalid_utf8_message
from proxy.profiles import Profile, load_profiles
from proxy.providers import Route, Router, is_openai_credential_shape, redact_path, route
from proxy.providers.base import BAD_REQUEST, CLIENT_TIMEOUT, NOT_FOUND, TOO_LARGE
from proxy.response import run_response_stages
from proxy.services import Services
from proxy.tenant import credential_of
from proxy.upstreams import host_of

_log = logging.getLogger(ACCESS_LOGGER)
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


SIM_FALLBACK_WARNING: Final = (
    "no real API was reachable at start (upstream: auto): the built-in simulator answers with canned "
    "replies; set upstream: real in production"
)
CLIENT_CLOSED: Final = 499
"""Pseudo-status of a request whose client went away before the response ended (nginx's 499)."""


def outcome_for(status: int) -> str:
    """Metric outcome of an HTTP status (0 = no status: the proxy failed; 499 = client gone)."""
    if 200 <= status < 400:
        return "ok"
    if status in (502, 504) or status >= 500:
        return "upstream_error"
    if 400 <= status < 500:
        return "client_error"
    return "proxy_error"


def _is_openai_shaped(request: web.Request) -> bool:
    return is_openai_credential_shape(request.headers)  # case-insensitive names


def _route_of(request: web.Request, services: Services) -> Route:
    if services.router is None:
        services.router = Router(load_profiles(services.settings.rules_dir))
    return services.router.route(request.path, request.raw_path.partition("?")[0], _is_openai_shaped(request))


def is_declared_too_large(request: web.Request, limit: int) -> bool:
    """True when the request's `Content-Length` is over `limit` bytes (`max_body_bytes`): the
    body need not be read to be refused. False without the header (chunked: the read is bounded)."""
    length = request.content_length
    return length is not None and length > limit


async def expect_continue(request: web.Request) -> None:
    """aiohttp's `Expect: 100-continue` answer, withheld from a pipeline request whose declared
    length is over `max_body_bytes` (its handler answers 413 at once; the client then never
    sends the body)."""
    services = request.app[SERVICES]
    limit = services.settings.max_body_bytes
    if request.method == "POST" and is_declared_too_large(request, limit) and _route_of(request, services).is_pipeline:
        return
    if request.version != HttpVersion11:
        return
    if request.headers.get("Expect", "").lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {request.headers.get('Expect', '')}")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the response's own size starts after the interim line


async def _answer_then_close(request: web.Request, response: web.Response) -> None:
    """Send `response` whole, then close the connection at once: a client that asked for
    `100 Continue` and got a final answer instead sends no body (RFC 9110, 10.1.1), so there is
    nothing for aiohttp's lingering close to drain (it held such a socket ~10 s)."""
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()  # the transport flushes what is written, then closes


async def proxy_handler(request: web.Request) -> web.StreamResponse:
    """Every client request to an upstream goes through here."""
    services = request.app[SERVICES]
    where = _route_of(request, services)
    adapter, path = where.adapter, where.path
    pm = services.metrics.by_provider[adapter.name]
    started = time.perf_counter()
    pm.in_flight.inc()
    services.metrics.worker_requests.inc()
    status = 0
    exchange: Exchange | None = None
    try:
        upstream_base = request.app[UPSTREAMS][adapter.name]
        session = request.app[CLIENT_SESSIONS][adapter.name]
        read_timeout = services.settings.read_timeout
        if request.method == "POST" and where.is_pipeline:
            if is_declared_too_large(request, services.settings.max_body_bytes):
                # refused from the head: the body is not read (aiohttp drains what arrives for
                # its lingering time after the answer, then closes, so a client sending the body
                # reads the 413 rather than a reset)
                pm.body_too_large.inc()
                status = TOO_LARGE.status
                refusal = closing(local_error(adapter, TOO_LARGE, too_large_message(services.settings.max_body_bytes)))
                if request.headers.get("Expect", "").lower() == "100-continue":
                    await _answer_then_close(request, refusal)
                return refusal
            try:
                wire = await read_wire(request, services.settings.max_body_bytes)
                raw = decode_body(request, wire, services.settings.max_body_bytes)
            except web.HTTPRequestEntityTooLarge:
                pm.body_too_large.inc()
                status = TOO_LARGE.status
                return local_error(adapter, TOO_LARGE, too_large_message(services.settings.max_body_bytes))
            except ClientBodyTimeout as exc:
                status = CLIENT_TIMEOUT.status
                return closing(local_error(adapter, CLIENT_TIMEOUT, str(exc)))
            except StackedCodings as exc:
                status = BAD_REQUEST.status
                return closing(local_error(adapter, BAD_REQUEST, str(exc)))
            except (UndecodableBody, web.RequestPayloadError):  # (aiohttp's, when it inflates: tests' runners)
                status = BAD_REQUEST.status
                return closing(local_error(adapter, BAD_REQUEST, UNDECODABLE_BODY))
            if services.recorder is not None:
                services.recorder.record(redact_path(path, credential_of(request.headers)), request.headers, raw)
            exchange = Exchange(adapter, path, request.raw_path.partition("?")[2], request.headers, raw, started)
            exchange.is_anonymous = not credential_of(request.headers)
            exchange.is_pipeline = True
            _platform_route(exchange, where, pm)
            if exchange.is_signed and raw is not wire:
                # the signature covers the body as sent (SigV4's payload hash): it goes as
                # received, with its coding; the stages measure the decoded bytes
                exchange.header_overrides["Content-Encoding"] = codings(request.headers.getall("Content-Encoding"))
            gate = services.gate
            if gate is None:
                await run_request_stages(exchange, services)
            elif gate.try_enter(len(raw)):  # nobody waits: no async context manager
                try:
                    await run_request_stages(exchange, services)
                finally:
                    gate.leave(len(raw))
            else:
                async with gate.admit(len(raw)):
                    await run_request_stages(exchange, services)
            bad_utf8 = exchange.invalid_utf8
            if bad_utf8 is not None:
                status = BAD_REQUEST.status
                return local_error(adapter, BAD_REQUEST, invalid_utf8_message(*bad_utf8))
            if adapter.counts_tokens and services.tokenizer is not None:
                await services.tokenizer.ensure(services)  # the first such request builds it
                await services.tokenizer.count_ahead(exchange, services)  # big texts, off the loop
            upstream_base = _session_base(services, exchange, upstream_base)
            lean = request.app[UPSTREAM_POOLS].get(adapter.name, session)
            data = wire if exchange.is_signed else exchange.outgoing
            if exchange.release_raw():  # the rewritten body goes: the client's is not held meanwhile
                raw = wire = b""
            response = await forward(request, exchange, lean, upstream_base, pm, read_timeout, data)
            moved = _after_answer(services, exchange, upstream_base, pm)
            if moved is not None and not response.prepared:
                # nothing reached the upstream (connect error): the request goes to the new one
                response = await forward(request, exchange, lean, moved, pm, read_timeout, data)
                _after_answer(services, exchange, moved, pm)
            status = exchange.status
            # The last byte is out: from here on nothing awaits, so the client leaving now
            # cannot cancel the measurement or the record save (a background task).
            run_response_stages(exchange, services)
            if services.keep_warm is not None:
                services.keep_warm.arm(exchange, services, upstream_base)
            return response
        exchange = Exchange(adapter, path, request.raw_path.partition("?")[2], request.headers, b"", started)
        if where.upstream_path != path:
            exchange.upstream_path = where.upstream_path
        body: AsyncIterator[bytes] | None = None
        if request.method in _BODY_METHODS and request.body_exists:
            # streamed as received, whatever its size (a file upload: the Files APIs take
            # hundreds of MB; nothing is held here)
            body = request.content.iter_any()
        lines = request.headers.getall("Content-Encoding", [])
        if body is not None and lines and not is_inflated(request):
            if len(lines) == 1 and streamable(lines[0]):  # inflated as it streams (as aiohttp did), sent identity
                limit = services.settings.max_body_bytes  # what inflating makes of it is bounded
                body = _bounded(_noting_undecodable(inflating(body, lines[0]), exchange), limit, exchange)
            else:  # a coding we do not decode, or stacked ones: the client's bytes go with them (one line)
                exchange.header_overrides["Content-Encoding"] = ", ".join(lines)
        response = await forward(request, exchange, session, upstream_base, pm, read_timeout, body)
        status = exchange.status
        if exchange.body_too_large is not None:
            pm.body_too_large.inc()
        return response
    except (asyncio.CancelledError, ConnectionResetError) as exc:
        # The client disconnected before the last byte (mid-body or mid-stream): a client
        # outcome, not ours; usage the upstream already reported is counted (once).
        status = CLIENT_CLOSED
        if exchange is not None and exchange.is_pipeline:
            record_usage(exchange, services)
        if isinstance(exc, asyncio.CancelledError):
            raise
        # A write met the closed connection before the cancellation did: re-raised, aiohttp
        # would log it as a server error with a traceback. A stub goes nowhere (aiohttp's
        # final write on the closed connection is dropped quietly).
        return web.Response(status=CLIENT_CLOSED)
    finally:
        elapsed = time.perf_counter() - started
        pm.in_flight.dec()
        pm.outcome[outcome_for(status)].inc()
        pm.duration.observe(elapsed)
        if _log.isEnabledFor(logging.INFO):  # the line's fields are built only when it is written
            logged_path = redact_path(request.path, credential_of(request.headers))
            log_access(_log, access_fields(adapter.name, request.method, logged_path, status, elapsed, exchange))


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole request body, decoded (`read_wire`, then `decode_body`): what
    `request.read()` returns, with one copy at most."""
    return decode_body(request, await read_wire(request, limit), limit)


async def read_wire(request: web.Request, limit: int) -> bytes:
    """The whole request body as received (still in its `Content-Encoding`), with one copy at
    most: the received chunks are joined once (a body that arrived in one chunk is that chunk),
    where `read()` grows a `bytearray` and copies it into `bytes` (two to three copies of a
    600 KB body). `limit` is bytes (`max_body_bytes`); over it raises
    `web.HTTPRequestEntityTooLarge` as `read()` does, with the buffer limits raised to it as
    `read()` does (no pause-reading below it). A stalled body raises what the payload was
    failed with (`proxy.connections.ClientBodyTimeout`)."""
    payload = request.content
    payload.set_read_chunk_size(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        # one buffered chunk per call, never joined (`readany()` joins what is buffered);
        # `(b"", True)` marks the end of an HTTP chunk of a chunked upload, `(b"", False)` the end
        chunk, end_of_http_chunk = await payload.readchunk()
        if not chunk:
            # aiohttp's empty payload (`Content-Length: 0`) answers `(b"", True)` every time,
            # at once: at its end there is no next chunk to wait for (it spun the loop for ever)
            if end_of_http_chunk and not payload.at_eof():
                continue
            break
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(limit, size)
        chunks.append(chunk)
    return b"".join(chunks)  # one exact bytes chunk is returned as is (no copy)


def decode_body(request: web.Request, wire: bytes, limit: int) -> bytes:
    """`wire` (`read_wire`) decoded: the same object when the request has no
    `Content-Encoding` or aiohttp inflated it already (a plain `web.AppRunner`;
    `proxy.app.limited_runner` turns that off), else decoded whole
    (`proxy.body_encoding.inflate`: `UndecodableBody` for a truncated or corrupt stream,
    `StackedCodings` for more than one coding; inflating past `limit` raises
    `web.HTTPRequestEntityTooLarge`)."""
    lines = request.headers.getall("Content-Encoding", [])
    if not lines or is_inflated(request):
        return wire
    encoding = codings(lines)  # StackedCodings (an UndecodableBody) for more than one
    try:
        return inflate(wire, encoding, limit)
    except BodyTooLarge:
        raise web.HTTPRequestEntityTooLarge(limit, limit + 1) from None


async def _bounded(body: AsyncIterator[bytes], limit: int, exchange: Exchange) -> AsyncIterator[bytes]:
    """`body`'s pieces while their total stays within `limit` bytes (`max_body_bytes`); the
    piece that would pass it is not sent: `Exchange.body_too_large` is set and `BodyTooLarge`
    raised, which `proxy.forward` answers as the client's 413. Wraps the inflated pieces of a
    body inflated as it streams (a 40 KB gzip bomb is 40 MiB); the bytes as received stream
    unbounded, as an upload's do."""
    size = 0
    async for piece in body:
        size += len(piece)
        if size > limit:
            exchange.body_too_large = limit
            raise BodyTooLarge(limit)
        yield piece


async def _noting_undecodable(body: AsyncIterator[bytes], exchange: Exchange) -> AsyncIterator[bytes]:
    """`body`, noting on `exchange` why it stopped decoding (`undecodable_body`) before the
    failure goes on: the upstream client reports it as its own connection error, which
    `proxy.forward` then answers as the client's 400."""
    try:
        async for piece in body:
            yield piece
    except UndecodableBody as exc:
        exchange.undecodable_body = str(exc)
        raise


def is_inflated(request: web.Request) -> bool:
    """Whether aiohttp inflated the request body as it arrived (its server's `auto_decompress`,
    on in plain `web.AppRunner`s; `limited_runner` turns it off): then the body read is
    identity-encoded whatever `Content-Encoding` said."""
    return request.content.total_compressed_bytes is not None


async def not_found(request: web.Request) -> web.Response:
    """JSON 404 in the provider's error shape for a path promptcache owns but does not serve
    (`/debug/...` on the main listener, anything unknown on the admin listener)."""
    adapter, _ = route(request.path, _is_openai_shaped(request))
    return local_error(adapter, NOT_FOUND, f"promptcache serves no {request.method} {request.path}")


def _affinity_key(exchange: Exchange) -> str | None:
    """The key a session's upstream is hashed by: tenant and session, `None` without a session."""
    if exchange.session_id is None:
        return None
    return f"{exchange.tenant or ''}\x00{exchange.session_id}"


def _session_base(services: Services, exchange: Exchange, default: str) -> str:
    """The base URL of the exchange's session among its upstream's (`proxy.affinity`)."""
    pool = (services.affinity or {}).get(exchange.provider)
    return pool.pick(_affinity_key(exchange)) if pool is not None else default


def _after_answer(services: Services, exchange: Exchange, base: str, pm: ProviderMetrics) -> str | None:
    """After a failure (connect error, 5xx, 429) move the session to its next base URL: the new
    URL, counted in `promptcache_upstream_moves_total` (the next request writes its cache afresh
    there), else `None`."""
    pool = (services.affinity or {}).get(exchange.provider)
    key = _affinity_key(exchange)
    if pool is None or not is_failure(exchange.status) or not pool.failed(key, base):
        return None
    pm.upstream_moves.inc()
    moved = pool.pick(key)
    _log.warning(
        "%s upstream %s answered %s: session moved to %s (a cold cache write there)",
        exchange.provider,
        host_of(base),
        exchange.status,
        host_of(moved),
    )
    return moved


def _platform_route(exchange: Exchange, where: Route, pm: ProviderMetrics) -> None:
    """Platform path facts on the exchange: the path's model, the upstream path, and whether
    the request is signed over its body (then forwarded byte-identical, measured only)."""
    if where.upstream_path != where.path:
        exchange.upstream_path = where.upstream_path
    exchange.path_model = where.model
    profile = getattr(exchange.adapter, "profile", None)
    if isinstance(profile, Profile) and profile.is_signed(exchange.headers.get("authorization", "")):
        exchange.is_signed = True
        pm.signed.inc()
        _log.info(
            "%s %s: signed request (%s covers the body): forwarded byte-identical, measured only",
            exchange.provider,
            exchange.path,
            exchange.headers.get("authorization", "").split(" ", 1)[0],
        )


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process serves HTTP."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: upstream sessions are open and the session store is healthy. The body names
    each provider's upstream mode (`real`, `sim`, `custom`) and host, with a `warning` when
    `upstream: auto` fell back to the built-in simulator, and the store's health (checked now,
    `proxy.store.RecordStore.check`): `status` is `store_unhealthy` (503) while the store
    cannot take writes, naming the cause (`store.problem`: `disk_full`, `read_only` ...).
    Requests are served meanwhile, without replay. While `serve` drains for shutdown, `status`
    is `draining` (503)."""
    services = request.app[SERVICES]
    ready = CLIENT_SESSIONS in request.app and bool(request.app[CLIENT_SESSIONS])
    active = services.active_upstreams or {}
    status = "ready" if ready else "starting"
    store = services.store
    health = await store.check() if store is not None else None
    if ready and health is not None and not health.is_healthy:
        ready, status = False, "store_unhealthy"
    if services.draining:
        ready, status = False, "draining"
    body: dict[str, object] = {
        "status": status,
        "upstreams": {name: item.as_json() for name, item in active.items()},
    }
    if health is not None:
        body["store"] = health.as_json()
    if any(item.fallback for item in active.values()):
        body["warning"] = SIM_FALLBACK_WARNING
    return web.json_response(body, status=200 if ready else 503)


async def metrics_handler(request: web.Request) -> web.Response:
    """Prometheus text exposition of this app's own registry; under `--workers`
    (`PROMETHEUS_MULTIPROC_DIR` set) the sum over every worker's samples (`proxy.workers`)."""
    registry = request.app[SERVICES].metrics.registry
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        combined = CollectorRegistry()
        multiprocess.MultiProcessCollector(combined)
        # Info series are not written to the shared files: this worker's build info
        body = generate_latest(combined) + generate_latest(registry.restricted_registry(["promptcache_build_info"]))
    else:
        body = generate_latest(registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
