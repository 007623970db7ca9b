"""observe: the response side. Records what the upstream reported, after the client has it.

Runs once per pipeline request after the last byte went to the client. It is synchronous on
purpose: once the last byte is written nothing here awaits, so a client that closes its
connection at once (curl, urllib, HTTP/1.0) cannot cancel it; the session record is handed to
the store's background writer (`proxy.store.RecordStore.save_soon`), which outlives the handler
and is drained on shutdown. Fails open like every stage: an exception is counted in
`promptcache_stage_errors_total{stage="observe"}` and never reaches the client.

Usage is counted exactly once per exchange (`record_usage` is idempotent): here after a
complete response, or by the handler when the client left mid-stream.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from proxy.debug import remember_measurement
from proxy.exchange import Exchange
from proxy.ledger import attribute_usage
from proxy.malformed import is_too_deep
from proxy.measure import measure
from proxy.pipeline.breakpoints import Plan
from proxy.pipeline.session import after_response
from proxy.providers.base import Usage
from proxy.services import Services

_log = logging.getLogger("promptcache.observe")


def record_usage(exchange: Exchange, services: Services) -> None:
    """Add the response's usage to the token counters (units: tokens), once per exchange."""
    usage = exchange.usage
    if usage is None or exchange.is_usage_counted:
        return
    exchange.is_usage_counted = True
    pm = services.metrics.by_provider[exchange.provider]
    pm.input_tokens["read"].inc(usage.cache_read)
    pm.input_tokens["write"].inc(usage.cache_write)
    pm.input_tokens["none"].inc(usage.input_none)
    pm.output_tokens.inc(usage.output)
    if is_ttl_downgrade(exchange.plan, usage):
        pm.ttl_downgrades.inc()
    if exchange.is_kept_warm:
        pm.keepwarm_saved.inc(usage.cache_read)
    attribute_usage(exchange, services)


def is_ttl_downgrade(plan: Any, usage: Usage) -> bool:
    """True when every marker sent asked for 1h and the usage still reports 5-minute writes
    (`cache_creation.ephemeral_5m_input_tokens`, docs/provider-rules.md 1.7, 9): with only 1h markers every
    write is a 1h one, so the upstream (or a gateway before it) dropped the `ttl`. A plan with a
    5m marker is never counted (its writes may rightly be 5m)."""
    if not isinstance(plan, Plan) or not plan.markers:
        return False
    if any(m.ttl != "1h" for m in plan.markers):
        return False
    return usage.cache_write_5m > 0


def observe(exchange: Exchange, services: Services) -> None:
    """Response-side measurement; schedules the session record write; never raises.

    Timed as `promptcache_stage_duration_seconds{stage="observe"}` (the record build included,
    the background write not)."""
    started = time.perf_counter()
    try:
        record_usage(exchange, services)
        measure(exchange, services)
        remember_measurement(exchange, services)
    except Exception as exc:  # noqa: BLE001 - fail open
        if is_too_deep(exc):  # measured nothing of a body nested deeper than orjson writes
            services.metrics.malformed_parts.labels("observe", "too_deep").inc()
        else:
            services.metrics.stage_error_counters["observe"].inc()
            _log.warning("observe failed (%s)", type(exc).__name__)
    after_response(exchange, services)
    services.metrics.stage_timers["observe"].observe(time.perf_counter() - started)
