"""Predicted cache reads for OpenAI are counted in real `o200k_base` tokens, so "predicted vs
actual" agrees exactly with the simulator (automatic caching and GPT-5.6+ breakpoints)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from proxy.sim.app import start_sim
from proxy.sim.clock import Clock

POLICY = " ".join(f"Rule {i}: answer politely and cite the policy section number." for i in range(300))
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]


def _prompt_and_cached(usage: dict[str, Any]) -> tuple[int, int]:
    details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
    return usage.get("input_tokens") or usage["prompt_tokens"], details.get("cached_tokens", 0)


@pytest.mark.parametrize(
    ("model", "path", "expected_cached"),
    [
        # GPT-5.6+: each turn reads at the previous request's implicit breakpoint (its last user message).
        ("gpt-5.6", "/v1/responses", [0, 3981, 4121, 4261]),
        # Automatic caching: the longest 1,024 + k x 128 within the previous prompt.
        ("gpt-5.5", "/v1/chat/completions", [0, 3968, 4096, 4224]),
    ],
)
async def test_predicted_reads_equal_the_simulator(
    make_proxy, model: str, path: str, expected_cached: list[int]
) -> None:
    runner, url = await start_sim("127.0.0.1", 0, clock=Clock.manual_at())
    try:
        proxy = await make_proxy(upstream=url)
        headers = {"authorization": "Bearer sk-openai-tokens", "x-session-id": f"tokens-{model}"}
        turns: list[dict[str, Any]] = [{"role": "user", "content": "hi " * 50}]
        cached, predicted = [], []
        async with aiohttp.ClientSession() as http:
            for t in range(4):
                if path == "/v1/responses":
                    body = {"model": model, "instructions": POLICY, "tools": TOOLS, "input": turns}
                else:
                    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
                    body = {"model": model, "tools": tools, "messages": [{"role": "system", "content": POLICY}, *turns]}
                async with http.post(f"{proxy.url}{path}", json=body, headers=headers) as r:
                    assert r.status == 200, await r.text()
                    data = await r.json()
                cached.append(_prompt_and_cached(data["usage"])[1])
                predicted.append(proxy.sample("promptcache_predicted_cache_read_tokens_total", provider="openai"))
                reply = data["output"] if path == "/v1/responses" else [data["choices"][0]["message"]]
                turns = [*turns, *reply, {"role": "user", "content": f"next {t} " * 40}]
        assert cached == expected_cached
        per_turn = [b - a for a, b in zip([0.0, *predicted], predicted, strict=False)]
        assert per_turn == [float(c) for c in expected_cached]
        assert (
            proxy.sample("promptcache_prefix_divergences_total", provider="openai", section="none", cause="none") == 3
        )
    finally:
        await runner.cleanup()
