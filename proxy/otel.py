"""OpenTelemetry tracing (`settings.tracing`, the `otel` extra): spans per request, stage and
upstream call, W3C trace context in and out. Imported only when tracing is on.

- `tracing_middleware(provider)` opens the request span (kind SERVER) around every proxied
  request, continuing the client's `traceparent` when it sends one, and publishes the request's
  `RequestTrace` in `proxy.tracing.CURRENT` for the stage runner and `forward`.
- Names (`proxy/tracing.py` draws the tree): `{method} {path}` for a pipeline route (`POST
  /v1/messages`), `{method}` elsewhere; `promptcache.stage.{stage}`; `upstream {method}`.
- Attributes follow the HTTP semantic conventions (`http.request.method`, `url.path`,
  `server.address`, `server.port`, `http.response.status_code`) plus `promptcache.provider`;
  the upstream span also carries the response's token counts (GenAI conventions:
  `gen_ai.usage.input_tokens` = the whole prompt, `.output_tokens`, `.cache_read.input_tokens`,
  `.cache_creation.input_tokens`).
  Never a header value, a query string, a body or a session id. A 5xx and a failed stage set the
  span status to ERROR.
- `install_tracing(app)` adds the middleware. `default_provider()`: the SDK provider already
  installed globally (for example by `opentelemetry-instrument`), else one exporting OTLP over
  HTTP as the standard `OTEL_EXPORTER_OTLP_*` variables say, with service name
  `OTEL_SERVICE_NAME` (default `promptcache`); one made here is flushed when the app stops.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware
from multidict import CIMultiDict
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy import __version__
from proxy.providers import redact_path, route
from proxy.providers.base import Usage
from proxy.tenant import credential_of
from proxy.tracing import CURRENT

_PROPAGATOR = TraceContextTextMapPropagator()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def install_tracing(app: web.Application, provider: trace.TracerProvider | None = None) -> None:
    """Trace `app`'s proxied requests to `provider` (default: `default_provider()`). A provider
    made here is shut down (its pending spans exported) when the app stops."""
    if provider is None:
        provider = default_provider()
        if provider is not trace.get_tracer_provider():
            owned = provider

            async def shutdown(_: web.Application) -> None:
                await asyncio.to_thread(owned.shutdown)

            app.on_cleanup.append(shutdown)
    app.middlewares.append(tracing_middleware(provider))


def default_provider() -> TracerProvider:
    """The global SDK tracer provider when one is installed, else a new OTLP/HTTP one."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "promptcache"})
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class _Stage:
    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def fail(self, exc: BaseException) -> None:
        self._span.record_exception(exc)
        self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))

    def end(self) -> None:
        self._span.end()


class _Upstream:
    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def set_status_code(self, status: int) -> None:
        self._span.set_attribute("http.response.status_code", status)
        if status >= 500 or status == 0:
            self._span.set_status(Status(StatusCode.ERROR))

    def set_usage(self, usage: Usage) -> None:
        self._span.set_attributes(
            {
                "gen_ai.usage.input_tokens": usage.prompt_total,
                "gen_ai.usage.output_tokens": usage.output,
                "gen_ai.usage.cache_read.input_tokens": usage.cache_read,
                "gen_ai.usage.cache_creation.input_tokens": usage.cache_write,
            }
        )


class _RequestTrace:
    __slots__ = ("_tracer", "_context", "_provider")

    def __init__(self, tracer: Tracer, span: Span, provider: str) -> None:
        self._tracer = tracer
        self._context = trace.set_span_in_context(span)
        self._provider = provider

    def stage(self, name: str) -> _Stage:
        return _Stage(self._tracer.start_span(f"promptcache.stage.{name}", context=self._context))

    @contextmanager
    def upstream(self, method: str, url: str, headers: CIMultiDict[str]) -> Iterator[_Upstream]:
        parts = urlsplit(url)
        attributes: dict[str, str | int] = {
            "http.request.method": method,
            "server.address": parts.hostname or "",
            "server.port": parts.port or (443 if parts.scheme == "https" else 80),
            "url.path": redact_path(parts.path, credential_of(headers)),
            "promptcache.provider": self._provider,
        }
        with self._tracer.start_as_current_span(
            f"upstream {method}", context=self._context, kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            for name in ("traceparent", "tracestate"):
                headers.popall(name, None)
            _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
            yield _Upstream(span)


def tracing_middleware(provider: trace.TracerProvider) -> Middleware:
    """The aiohttp middleware opening each proxied request's span (`/healthz`, `/readyz`,
    `/metrics` and `/debug` are not traced)."""
    from proxy.handlers import _is_openai_shaped, proxy_handler

    tracer = provider.get_tracer("promptcache", __version__)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.match_info.handler is not proxy_handler:
            return await handler(request)
        adapter, path = route(request.path, _is_openai_shaped(request))
        is_pipeline = request.method == "POST" and path == adapter.api_path
        name = f"{request.method} {request.path}" if is_pipeline else request.method
        parent = _PROPAGATOR.extract(request.headers)
        attributes = {
            "http.request.method": request.method,
            "url.path": redact_path(request.path, credential_of(request.headers)),
            "promptcache.provider": adapter.name,
        }
        with tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes) as span:
            token = CURRENT.set(_RequestTrace(tracer, span, adapter.name))
            try:
                response = await handler(request)
            finally:
                CURRENT.reset(token)
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            return response

    return middleware
