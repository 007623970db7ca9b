"""Tracing hooks: what the stage runner and `forward` call, with no OpenTelemetry import.

While a request is served with tracing on (`settings.tracing`, the `otel` extra), `CURRENT` holds
its `RequestTrace`, set by the request middleware of `proxy/otel.py`; otherwise it is `None` and
each hook costs one context-variable read. Span layout (names exact, `proxy/otel.py`):

    POST /v1/messages                 server span, one per proxied request
      promptcache.stage.<name>        one per request stage that ran (`REQUEST_STAGES` order)
      upstream POST                   client span around the upstream call, response streamed

The upstream receives a W3C `traceparent` naming the `upstream` span (the request span's trace).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Final, Protocol

from multidict import CIMultiDict

from proxy.providers.base import Usage


class StageSpan(Protocol):
    def fail(self, exc: BaseException) -> None:
        """Mark the stage failed (fail open: the request goes on with the client's bytes)."""
        ...

    def end(self) -> None: ...


class UpstreamSpan(Protocol):
    def set_status_code(self, status: int) -> None:
        """The HTTP status the client got (the upstream's, or a local 502/504)."""
        ...

    def set_usage(self, usage: Usage) -> None:
        """Token counts teed off the response (GenAI semantic-convention attributes)."""
        ...


class RequestTrace(Protocol):
    def stage(self, name: str) -> StageSpan:
        """Start the span of request stage `name` (a child of the request span)."""
        ...

    def upstream(self, method: str, url: str, headers: CIMultiDict[str]) -> AbstractContextManager[UpstreamSpan]:
        """The span around the upstream call; sets `traceparent` (and `tracestate`) in `headers`."""
        ...


CURRENT: Final[ContextVar[RequestTrace | None]] = ContextVar("promptcache_trace", default=None)
