"""Three turns through the whole pipeline (optimise mode) in front of the upstream simulator,
whose clock is advanced past the 5-minute TTL before the third turn.

The metrics must agree exactly with the usage the client saw: input tokens by cache kind, output
tokens, cost and counterfactual cost (rules/pricing.yaml); and the causes must be
first_request, none (the second turn reads what the first wrote) and expired (the third turn's
predicted read came back as a write because the entry's TTL ran out).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from proxy.pricing import default_pricing
from proxy.providers.base import Usage
from proxy.sim.app import start_sim
from proxy.sim.clock import Clock

MODEL = "claude-sonnet-4-6"
SYSTEM = " ".join(f"Rule {i}: keep answers short, cite files by path and never guess." for i in range(160))
HEADERS = {"x-api-key": "sk-ant-sim-test", "anthropic-version": "2023-06-01", "x-session-id": "sim-conv"}


def _body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 32,
        "system": [{"type": "text", "text": SYSTEM}],
        "messages": messages,
    }


async def test_turns_against_the_simulator(make_proxy) -> None:
    runner, sim_url = await start_sim("127.0.0.1", 0, clock=Clock.manual_at())
    try:
        proxy = await make_proxy(upstream=sim_url, mode="optimise")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What does main.py do?"}]
        usages: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as client:
            for turn in range(3):
                if turn == 2:
                    # past even a 1h entry
                    async with client.post(sim_url + "/_sim/clock", json={"advance": 4000}) as r:
                        assert r.status == 200
                async with client.post(
                    proxy.url + "/v1/messages", data=orjson.dumps(_body(messages)), headers=HEADERS
                ) as r:
                    assert r.status == 200, await r.text()
                    answer = orjson.loads(await r.read())
                usages.append(answer["usage"])
                messages += [
                    {"role": "assistant", "content": answer["content"]},
                    {"role": "user", "content": f"And then? ({turn})"},
                ]
    finally:
        await runner.cleanup()
    assert usages[0]["cache_read_input_tokens"] == 0 and usages[0]["cache_creation_input_tokens"] > 0
    assert usages[1]["cache_read_input_tokens"] > 0
    assert usages[2]["cache_read_input_tokens"] == 0 and usages[2]["cache_creation_input_tokens"] > 0
    s = proxy.sample
    a = {"provider": "anthropic"}
    for section, cause in (("none", "first_request"), ("none", "none"), ("none", "expired")):
        assert s("promptcache_prefix_divergences_total", section=section, cause=cause, **a) == 1, cause
    read = sum(u["cache_read_input_tokens"] for u in usages)
    write = sum(u["cache_creation_input_tokens"] for u in usages)
    none = sum(u["input_tokens"] for u in usages)
    output = sum(u["output_tokens"] for u in usages)
    assert s("promptcache_input_tokens_total", cache="read", **a) == read
    assert s("promptcache_input_tokens_total", cache="write", **a) == write
    assert s("promptcache_input_tokens_total", cache="none", **a) == none
    assert s("promptcache_output_tokens_total", **a) == output
    prices = default_pricing().prices("anthropic", MODEL)
    assert prices is not None
    parsed = [
        Usage(
            input_none=u["input_tokens"],
            cache_read=u["cache_read_input_tokens"],
            cache_write_5m=u["cache_creation"]["ephemeral_5m_input_tokens"],
            cache_write_1h=u["cache_creation"]["ephemeral_1h_input_tokens"],
            output=u["output_tokens"],
        )
        for u in usages
    ]
    fam = {"provider": "anthropic", "family": "claude-sonnet-4"}
    assert s("promptcache_cost_usd_total", **fam) == pytest.approx(
        sum(prices.cost(u) for u in parsed), rel=1e-12
    )
    assert s("promptcache_uncached_cost_usd_total", **fam) == pytest.approx(
        sum(prices.uncached_cost(u) for u in parsed), rel=1e-12
    )
    assert s("promptcache_predicted_cache_read_tokens_total", **a) > 0
    assert s("promptcache_stage_errors_total", stage="observe") == 0
