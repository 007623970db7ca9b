"""1,000 sessions over 50 model names produce a bounded, pre-declared set of series.

Runs the real response side (`observe`) on 1,000 exchanges: every session is different, models
cycle through 50 names (known families, unknown ids, both providers), causes vary, and cache
diagnostics report known and unknown reasons.
"""

from __future__ import annotations

import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry

from proxy.exchange import Exchange
from proxy.metrics import CAUSES, UPSTREAM_MISS_REASONS, Metrics
from proxy.pricing import default_pricing
from proxy.providers import ANTHROPIC, OPENAI_CHAT
from proxy.providers.base import Usage
from proxy.response import run_response_stages
from proxy.services import Services
from proxy.settings import Settings
from tests.measure.bodies import BASE, variant
from tests.measure.test_divergence import record_of

MODELS = [f"claude-sonnet-4-{i}" for i in range(10)]
MODELS += [f"claude-opus-4-{i}-2025" for i in range(10)]
MODELS += [f"claude-custom-{i}" for i in range(10)]
MODELS += [f"gpt-5-variant-{i}" for i in range(10)]
MODELS += [f"gpt-9.{i}" for i in range(10)]
VARIANTS = ["none", "identical", "tools_changed", "system_changed", "messages_changed", "params_changed"]


def _series(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items()))) for m in registry.collect() for s in m.samples}


async def test_series_are_bounded() -> None:
    registry = CollectorRegistry()
    services = Services(settings=Settings(), metrics=Metrics(registry))
    at_start = _series(registry)
    previous = record_of(BASE)
    reasons = [*UPSTREAM_MISS_REASONS[:-1], "a_reason_from_the_future", None]
    for n in range(1000):
        model = MODELS[n % len(MODELS)]
        is_openai = model.startswith("gpt")
        if is_openai:
            body = {"model": model, "messages": [{"role": "user", "content": f"session {n}"}]}
            ex = Exchange(
                OPENAI_CHAT, "/v1/chat/completions", "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(body)
            )
        else:
            body = {
                **variant(VARIANTS[n % len(VARIANTS)]),
                "model": model,
                "metadata": {"user_id": f"user-{n}"},
            }
            ex = Exchange(ANTHROPIC, "/v1/messages", "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(body))
            ex.previous = None if n % 7 == 0 else previous
            ex.is_diagnostics_requested = n % 3 == 0
        ex.body, ex.status, ex.session_id = body, 200, f"session-{n}"
        ex.usage = Usage(input_none=n, cache_read=n % 5, cache_write_5m=n % 3, output=1, seen=True)
        ex.usage.cache_miss_reason = reasons[n % len(reasons)]
        run_response_stages(ex, services)
    after = _series(registry)
    grown = after - at_start
    # Created lazily: the upstream-reason counter (at most reasons x causes series) and the cost
    # series of each family seen (bounded by the price table's families).
    assert {name for name, _ in grown} <= {
        "promptcache_upstream_cache_miss_reasons_total",
        "promptcache_cost_usd_total",
        "promptcache_uncached_cost_usd_total",
        "promptcache_team_requests_total",
        "promptcache_team_input_tokens_total",
        "promptcache_team_cost_usd_total",
        "promptcache_team_uncached_cost_usd_total",
    }
    # No team configured: every request is team `other`.
    assert {value for _, labels in grown for key, value in labels if key == "team"} == {"other"}
    reasons_grown = [g for g in grown if g[0] == "promptcache_upstream_cache_miss_reasons_total"]
    assert len(reasons_grown) <= len(UPSTREAM_MISS_REASONS) * len(CAUSES)
    table = default_pricing()
    allowed_families = set(table.family_names("anthropic")) | set(table.family_names("openai"))
    values = {value for _, labels in after for key, value in labels if key == "family"}
    assert values <= allowed_families and "other" in values
    assert len(after) < 1500
    text = b"".join(f"{name}{labels}".encode() for name, labels in after)
    for n in (0, 1, 999):
        assert f"session-{n}".encode() not in text and f"user-{n}".encode() not in text
    assert b"claude-custom" not in text and b"gpt-9." not in text and b"future" not in text
    assert registry.get_sample_value("promptcache_stage_errors_total", {"stage": "observe"}) == 0
