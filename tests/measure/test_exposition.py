"""`/metrics` stays small: no `_created` series, and cost series only for model families seen."""

from __future__ import annotations

import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry, generate_latest

from proxy.exchange import Exchange
from proxy.measure import measure
from proxy.metrics import Metrics
from proxy.providers import ANTHROPIC
from proxy.providers.base import Usage
from proxy.services import Services
from proxy.settings import Settings
from tests.measure.bodies import BASE


def _lines(registry: CollectorRegistry, prefix: str) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_no_created_series_and_no_family_series_before_use() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    text = generate_latest(registry).decode()
    assert "_created" not in text
    assert _lines(registry, "promptcache_cost_usd_total{") == []
    assert _lines(registry, "promptcache_uncached_cost_usd_total{") == []


def test_family_series_created_on_first_use() -> None:
    registry = CollectorRegistry()
    services = Services(settings=Settings(), metrics=Metrics(registry))
    body = {**BASE, "model": "claude-sonnet-4-6"}
    ex = Exchange(ANTHROPIC, "/v1/messages", "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(body))
    ex.body, ex.status = body, 200
    ex.usage = Usage(input_none=1_000_000, output=0, seen=True)
    measure(ex, services)
    assert _lines(registry, "promptcache_cost_usd_total{") == [
        'promptcache_cost_usd_total{family="claude-sonnet-4",provider="anthropic"} 3.0'
    ]
    assert _lines(registry, "promptcache_uncached_cost_usd_total{") == [
        'promptcache_uncached_cost_usd_total{family="claude-sonnet-4",provider="anthropic"} 3.0'
    ]
