"""observe: usage counting for the response side (`proxy.response`, its `usage` stage).

Usage is counted exactly once per exchange (`record_usage` is idempotent): by the `usage`
response stage after a complete response, or by the handler when the client left mid-stream.
"""

from __future__ import annotations

from typing import Any

from proxy.exchange import Exchange
from proxy.ledger import attribute_usage
from proxy.pipeline.breakpoints import Plan
from proxy.providers.base import Usage
from proxy.services import Services


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
