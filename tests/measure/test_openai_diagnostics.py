"""OpenAI cache diagnostics (GPT-5.6+ Responses) beside Anthropic's: the stage asks with
`prompt_cache_options.comparison_response_id`, the simulator answers `prompt_cache_diagnostics`,
and each diagnosis is reconciled with promptcache's own cause (agree / disagree / unknown)."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp
import pytest

from proxy.measure import agreement
from proxy.providers import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from proxy.sim.app import start_sim
from proxy.sim.clock import Clock

POLICY = " ".join(f"Rule {i}: answer politely and cite the policy section number." for i in range(200))
TOOLS = [{"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}]
HEADERS = {"authorization": "Bearer sk-openai-diag", "x-session-id": "diag-1"}


def _body(turns: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-5.6", "instructions": POLICY, "tools": TOOLS, "input": turns, "store": True, **extra}


def test_adapter_asks_only_on_responses_for_gpt_56_with_a_baseline() -> None:
    body = _body([{"role": "user", "content": "hi"}], prompt_cache_options={"mode": "explicit"})
    asked = OPENAI_RESPONSES.with_cache_diagnostics(body, "resp_1")
    assert asked == {**body, "prompt_cache_options": {"mode": "explicit", "comparison_response_id": "resp_1"}}
    assert body["prompt_cache_options"] == {"mode": "explicit"}
    assert OPENAI_RESPONSES.with_cache_diagnostics(body, None) is None
    assert OPENAI_RESPONSES.with_cache_diagnostics({**body, "model": "gpt-5.5"}, "resp_1") is None
    assert OPENAI_CHAT.with_cache_diagnostics(body, "resp_1") is None
    own = {**body, "prompt_cache_options": {"comparison_response_id": "resp_0"}}
    assert OPENAI_RESPONSES.with_cache_diagnostics(own, "resp_1") is None


@pytest.mark.parametrize(
    ("adapter", "reason", "cause", "result"),
    [
        (OPENAI_RESPONSES, None, "none", "agree"),
        (OPENAI_RESPONSES, "tools_changed", "tools_changed", "agree"),
        (OPENAI_RESPONSES, "input_changed", "system_volatile_text", "agree"),
        (OPENAI_RESPONSES, "service_tier_changed", "none", "disagree"),
        (OPENAI_RESPONSES, "comparison_response_not_found", "none", "unknown"),
        (ANTHROPIC, None, "expired", "agree"),
        (ANTHROPIC, "messages_changed", "history_rewritten", "agree"),
        (ANTHROPIC, "system_changed", "tools_changed", "disagree"),
        (ANTHROPIC, "pending", "none", "unknown"),
        (ANTHROPIC, "system_changed", "first_request", "unknown"),
    ],
)
def test_agreement_tables(adapter: Any, reason: str | None, cause: str, result: str) -> None:
    assert agreement(adapter.diagnostic_causes, reason, cause) == result


async def _responses(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(f"{url}/v1/responses", json=body, headers=HEADERS) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_simulator_answers_openai_diagnostics() -> None:
    runner, url = await start_sim("127.0.0.1", 0, clock=Clock.manual_at())
    try:
        async with aiohttp.ClientSession() as http:
            first = await _responses(http, url, _body([{"role": "user", "content": "hi"}]))
            assert "prompt_cache_diagnostics" not in first
            ask = {"comparison_response_id": first["id"]}
            turns = [{"role": "user", "content": "hi"}, *first["output"], {"role": "user", "content": "more"}]
            hit = await _responses(http, url, _body(turns, prompt_cache_options=ask))
            assert hit["prompt_cache_diagnostics"] == {"type": "cache_hit"}
            other_tools = copy.deepcopy(TOOLS)
            other_tools[0]["name"] = "get_date"
            miss = await _responses(http, url, {**_body(turns, prompt_cache_options=ask), "tools": other_tools})
            total = miss["usage"]["input_tokens"]
            assert miss["prompt_cache_diagnostics"] == {
                "type": "cache_miss",
                "reason": "tools_changed",
                "cache_missed_tokens": total,
                "comparison_reusable_tokens": 0,
            }
            edited = [{"role": "user", "content": "hello"}, *turns[1:]]
            changed = await _responses(http, url, _body(edited, prompt_cache_options=ask))
            diagnosis = changed["prompt_cache_diagnostics"]
            assert (diagnosis["type"], diagnosis["reason"]) == ("cache_miss", "input_changed")
            reusable = diagnosis["comparison_reusable_tokens"]
            assert diagnosis["cache_missed_tokens"] == changed["usage"]["input_tokens"] - reusable
            assert 0 < reusable < first["usage"]["input_tokens"]
            gone = await _responses(http, url, _body(turns, prompt_cache_options={"comparison_response_id": "resp_x"}))
            assert gone["prompt_cache_diagnostics"] == {"type": "comparison_response_not_found"}
            old = await _responses(http, url, {**_body(turns, prompt_cache_options=ask), "model": "gpt-5.5"})
            assert old["prompt_cache_diagnostics"] == {"type": "unavailable"}
    finally:
        await runner.cleanup()


async def test_proxy_reconciles_openai_diagnostics(make_proxy) -> None:
    runner, url = await start_sim("127.0.0.1", 0, clock=Clock.manual_at())
    try:
        proxy = await make_proxy(upstream=url, cache_diagnostics=True)
        async with aiohttp.ClientSession() as http:
            turns: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
            first = await _responses(http, proxy.url, _body(turns))
            assert "prompt_cache_diagnostics" not in first  # no baseline yet: nothing asked
            turns += [*first["output"], {"role": "user", "content": "more"}]
            second = await _responses(http, proxy.url, _body(turns))
            assert second["prompt_cache_diagnostics"] == {"type": "cache_hit"}
            turns += [*second["output"], {"role": "user", "content": "again"}]
            third = await _responses(http, proxy.url, {**_body(turns), "service_tier": "flex"})
            assert third["prompt_cache_diagnostics"]["reason"] == "service_tier_changed"
        # turn 2: cache_hit vs cause none (agree); turn 3: the upstream saw a service tier change
        # that promptcache's params fingerprint does not cover (disagree).
        assert proxy.sample("promptcache_diagnostics_agreement_total", provider="openai", result="agree") == 1
        assert proxy.sample("promptcache_diagnostics_agreement_total", provider="openai", result="disagree") == 1
        assert proxy.sample("promptcache_diagnostics_agreement_total", provider="openai", result="unknown") == 0
        assert (
            proxy.sample("promptcache_upstream_cache_miss_reasons_total", reason="service_tier_changed", cause="none")
            == 1
        )
    finally:
        await runner.cleanup()
