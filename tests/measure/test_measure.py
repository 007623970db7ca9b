"""`measure(exchange, services)`: typed outputs written, metrics updated, costs, `expired`.

Real `Exchange`, `Services`, `Metrics` (fresh registry) and `SessionRecord`s; no fakes.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry

from proxy.exchange import Exchange
from proxy.measure import Measurement, measure
from proxy.metrics import Metrics
from proxy.prefix import PrefixChain
from proxy.pricing import Prices, PricingTable
from proxy.providers import ANTHROPIC, OPENAI_CHAT
from proxy.providers.base import Usage
from proxy.rules import RuleSet, load_rules
from proxy.services import Services
from proxy.settings import Settings
from tests.measure.bodies import BASE, variant
from tests.measure.test_divergence import record_of

PATH = "/v1/messages"
USAGE = Usage(input_none=20, cache_read=0, cache_write_5m=300, output=10, seen=True)
READ_SYSTEM = Usage(input_none=20, cache_read=44, cache_write_5m=300, output=10, seen=True)
"""Read the system breakpoint's entry (block 2, ~44 tokens) as `BASE`'s markers predict."""


NO_MINIMUM = RuleSet(rules=(), min_tokens_by_prefix=(), default_min_tokens=0)
"""No segment rules and no minimum cacheable prefix, so these small bodies can be cached."""


def services(rules: RuleSet = NO_MINIMUM) -> Services:
    return Services(settings=Settings(), metrics=Metrics(CollectorRegistry()), rules=rules)


def exchange_for(
    body: dict[str, Any], previous: Any, usage: Usage | None = USAGE, status: int = 200
) -> Exchange:
    ex = Exchange(ANTHROPIC, PATH, "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(body))
    ex.body = body
    ex.status = status
    ex.usage = usage
    ex.previous = previous
    return ex


def sample(svc: Services, name: str, **labels: str) -> float:
    value = svc.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.mark.parametrize(
    ("name", "section", "cause", "usage"),
    [
        ("none", "none", "none", Usage(cache_read=80, cache_write_5m=20, seen=True)),
        ("model_changed", "none", "model_changed", USAGE),
        ("tools_changed", "tools", "tools_changed", USAGE),
        ("params_changed", "none", "params_changed", USAGE),
        ("system_changed", "system", "system_changed", USAGE),
        ("messages_changed", "messages", "messages_changed", READ_SYSTEM),
        ("messages_changed", "messages", "expired", USAGE),
        ("none", "none", "expired", USAGE),
    ],
)
def test_cause_counted_once(name: str, section: str, cause: str, usage: Usage) -> None:
    svc = services()
    ex = exchange_for(variant(name), record_of(BASE), usage)
    measure(ex, svc)
    result = ex.measurement
    assert isinstance(result, Measurement)
    assert (result.divergence.section, result.cause) == (section, cause)
    assert (
        sample(
            svc, "promptcache_prefix_divergences_total", provider="anthropic", section=section, cause=cause
        )
        == 1
    )
    total = sum(
        s.value
        for metric in svc.metrics.registry.collect()
        if metric.name == "promptcache_prefix_divergences"
        for s in metric.samples
        if s.name.endswith("_total")
    )
    assert total == 1


def test_first_request_and_history_rewritten_come_from_the_session_stage() -> None:
    svc = services()
    first = exchange_for(BASE, None)
    measure(first, svc)
    assert first.measurement.cause == "first_request"
    rewritten = exchange_for(variant("history_rewritten"), record_of(BASE), READ_SYSTEM)
    rewritten.history_rewritten = 0
    measure(rewritten, svc)
    assert rewritten.measurement.cause == "history_rewritten"
    assert rewritten.measurement.block_path == "messages[0].content"
    # First requests are not a divergence position: the histograms only saw the rewrite.
    assert sample(svc, "promptcache_prefix_divergence_position_tokens_count", provider="anthropic") == 1
    assert sample(svc, "promptcache_prefix_divergence_position_tokens_sum", provider="anthropic") == 44


def test_append_measurement_and_metrics_exact() -> None:
    svc = services()
    usage = Usage(input_none=20, cache_read=80, cache_write_5m=30, cache_write_1h=10, output=5, seen=True)
    ex = exchange_for(variant("none"), record_of(BASE), usage)
    measure(ex, svc)
    m: Measurement = ex.measurement
    chain = ex.sent_chain
    assert isinstance(chain, PrefixChain)
    assert chain.ends == (76, 129, 174, 188, 258, 320, 334, 365)
    assert (m.divergence.block_index, m.divergence.byte_offset, m.divergence.tokens) == (6, 320, 80)
    assert (m.predicted_breakpoint, m.predicted_read_tokens) == (5, 80)
    assert (m.prompt_blocks, m.prompt_bytes, m.family, m.block_path) == (8, 365, "claude-sonnet-4", None)
    # claude-sonnet-4 family: input 3, 5m write 3.75, 1h write 6, read 0.30, output 15 USD/MTok.
    cost = (20 * 3 + 80 * 0.30 + 30 * 3.75 + 10 * 6 + 5 * 15) / 1e6
    uncached = (140 * 3 + 5 * 15) / 1e6
    assert m.cost_usd == pytest.approx(cost, rel=1e-12)
    assert m.uncached_cost_usd == pytest.approx(uncached, rel=1e-12)
    assert m.savings_usd == pytest.approx(uncached - cost, rel=1e-12)
    labels = {"provider": "anthropic", "family": "claude-sonnet-4"}
    assert sample(svc, "promptcache_cost_usd_total", **labels) == pytest.approx(cost, rel=1e-12)
    assert sample(svc, "promptcache_uncached_cost_usd_total", **labels) == pytest.approx(uncached, rel=1e-12)
    assert sample(svc, "promptcache_prompt_bytes_total", provider="anthropic") == 365
    assert sample(svc, "promptcache_prefix_matched_bytes_total", provider="anthropic") == 320
    assert sample(svc, "promptcache_predicted_cache_read_tokens_total", provider="anthropic") == 80
    assert (
        sample(svc, "promptcache_prefix_divergence_position_ratio_bucket", provider="anthropic", le="0.99")
        == 0
    )
    assert (
        sample(svc, "promptcache_prefix_divergence_position_ratio_bucket", provider="anthropic", le="1.0")
        == 1
    )


def test_costs_come_from_the_pricing_injected_in_services() -> None:
    table = PricingTable("2026-12-01", (), (), (("anthropic", Prices(7.0, 0.0, 0.0, 0.0, 0.0)),))
    svc = Services(settings=Settings(), metrics=Metrics(CollectorRegistry()), rules=NO_MINIMUM, pricing=table)
    ex = exchange_for(BASE, None, Usage(input_none=1_000_000, seen=True))
    measure(ex, svc)
    assert (ex.measurement.family, ex.measurement.cost_usd) == ("other", 7.0)
    assert sample(svc, "promptcache_cost_usd_total", provider="anthropic", family="other") == 7.0


def test_unknown_model_is_priced_and_labelled_other() -> None:
    svc = services()
    body = {**BASE, "model": "claude-experimental-9"}
    ex = exchange_for(body, None, Usage(input_none=1_000_000, seen=True))
    measure(ex, svc)
    assert ex.measurement.family == "other"
    assert sample(svc, "promptcache_cost_usd_total", provider="anthropic", family="other") == 3.0


def test_sent_body_is_what_went_upstream() -> None:
    svc = services()
    # A stage rewrote the body (tools changed) and serialised it: the upstream body is measured.
    ex = exchange_for(BASE, record_of(BASE))
    ex.upstream_body = orjson.dumps(variant("tools_changed"))
    measure(ex, svc)
    assert ex.measurement.cause == "tools_changed"
    # A stage failed: the client's original bytes went upstream, whatever `body` holds.
    failed = exchange_for(variant("tools_changed"), record_of(BASE), READ_SYSTEM)
    failed.raw = orjson.dumps(BASE)
    failed.failed_stage = "reorder"
    measure(failed, svc)
    assert failed.measurement.cause == "none"


@pytest.mark.parametrize("status", [400, 429, 500, 0])
def test_non_2xx_is_not_measured(status: int) -> None:
    svc = services()
    ex = exchange_for(BASE, None, status=status)
    measure(ex, svc)
    assert ex.measurement is None and ex.sent_chain is None


def test_upstream_reason_counted_next_to_own_cause_only_when_requested() -> None:
    svc = services()
    usage = Usage(input_none=10, cache_write_5m=300, seen=True, cache_miss_reason="system_changed")
    quiet = exchange_for(variant("system_changed"), record_of(BASE), usage)
    measure(quiet, svc)
    assert quiet.measurement.upstream_reason is None
    asked = exchange_for(variant("system_changed"), record_of(BASE), usage)
    asked.is_diagnostics_requested = True
    measure(asked, svc)
    unknown = Usage(seen=True, cache_miss_reason="brand_new_reason")
    odd = exchange_for(variant("system_changed"), record_of(BASE), unknown)
    odd.is_diagnostics_requested = True
    measure(odd, svc)
    name = "promptcache_upstream_cache_miss_reasons_total"
    assert sample(svc, name, reason="system_changed", cause="system_changed") == 1
    assert sample(svc, name, reason="other", cause="system_changed") == 1


def test_openai_chat_is_measured_too() -> None:
    svc = services()
    body = {
        "model": "gpt-5.1",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    }
    ex = Exchange(OPENAI_CHAT, "/v1/chat/completions", "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(body))
    ex.body, ex.status = body, 200
    ex.usage = Usage(input_none=128, cache_read=1920, output=5, seen=True)
    measure(ex, svc)
    m = ex.measurement
    assert (m.family, m.cause, m.prompt_blocks) == ("gpt-5", "first_request", 2)
    assert m.cost_usd == pytest.approx((128 * 1.25 + 1920 * 0.125 + 5 * 10) / 1e6, rel=1e-12)


def test_packaged_rules_volatile_text_and_model_minimum() -> None:
    svc = services(load_rules())
    before = copy.deepcopy(BASE)
    before["system"][1]["text"] = "Current time: 2026-11-29 10:15"
    after = copy.deepcopy(BASE)
    after["system"][1]["text"] = "Current time: 2026-11-29 10:20"
    ex = exchange_for(after, record_of(before), USAGE)
    measure(ex, svc)
    assert ex.measurement.cause == "system_volatile_text"
    # claude-sonnet-4-6 caches nothing under 1,024 tokens (rules/models.yaml): no read predicted,
    # so a write after a pure append is not `expired`.
    append = exchange_for(variant("none"), record_of(BASE), USAGE)
    measure(append, svc)
    assert (append.measurement.predicted_read_tokens, append.measurement.cause) == (
        0,
        "none",
    )


def test_volatile_checker_scans_lines_up_to_the_rule_limit_only() -> None:
    from proxy.measure import volatile_checker
    from proxy.providers.base import Block
    from proxy.rules import MAX_RULE_LINE_CHARS, load_rules

    is_volatile = volatile_checker(load_rules())
    assert is_volatile is not None
    stamp = "Current time: 2026-11-29T20:09:13Z"
    short = Block("system", "system[1]", "text", {"type": "text", "text": f"You are helpful.\n{stamp}"})
    long = Block("system", "system[1]", "text", {"type": "text", "text": stamp + " " + "1 " * MAX_RULE_LINE_CHARS})
    assert (is_volatile(short), is_volatile(long)) == (True, False)
