"""observe: the response side. Records what the upstream reported, after the client has it.

Runs once per pipeline request after the last byte went to the client. Fails open like every
stage: an exception is counted in `promptcache_stage_errors_total{stage="observe"}` and never
reaches the client.
"""

from __future__ import annotations

import logging
import time

from proxy.debug import remember_measurement
from proxy.exchange import Exchange
from proxy.measure import measure
from proxy.pipeline.session import after_response
from proxy.services import Services

_log = logging.getLogger("promptcache.observe")


def record_usage(exchange: Exchange, services: Services) -> None:
    """Add the response's usage to the token counters (units: tokens)."""
    usage = exchange.usage
    if usage is None:
        return
    pm = services.metrics.by_provider[exchange.provider]
    pm.input_tokens["read"].inc(usage.cache_read)
    pm.input_tokens["write"].inc(usage.cache_write)
    pm.input_tokens["none"].inc(usage.input_none)
    pm.output_tokens.inc(usage.output)


async def observe(exchange: Exchange, services: Services) -> None:
    """Response-side measurement and the session record write; never raises.

    Timed as `promptcache_stage_duration_seconds{stage="observe"}` (store write included)."""
    started = time.perf_counter()
    try:
        record_usage(exchange, services)
        measure(exchange, services)
        remember_measurement(exchange, services)
    except Exception as exc:  # noqa: BLE001 - fail open
        services.metrics.stage_error_counters["observe"].inc()
        _log.warning("observe failed (%s)", type(exc).__name__)
    await after_response(exchange, services)
    services.metrics.stage_timers["observe"].observe(time.perf_counter() - started)
