"""The pipeline budget (reviewer's gap 6): a body over `pipeline_budget_blocks` or
`pipeline_budget_bytes` skips every stage after `parse`, so one huge body cannot hold the event
loop all tenants share. It still succeeds: its bytes go upstream exactly as sent (fail open),
its usage and cost are counted, the skip is counted by kind, and the reason is in the caller's
`/debug/tenants`; nothing is stored or measured for it. Real HTTP on loopback, the simulator
upstream (and a recording fake upstream to compare the bytes received). The time it saves is
measured by `bench/huge_body_bench.py`, not here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson

from proxy.pipeline.budget import blocks_over_budget, raw_over_budget
from proxy.session_identity import explicit_id
from tests.fakes.upstream import FakeUpstream
from tests.sessions.conftest import Proxy, Sim

EXCEEDED = "promptcache_pipeline_budget_exceeded_total"
OPENAI = {"authorization": "Bearer sk-budget-test-key", "content-type": "application/json", "x-session-id": "big-1"}
ANTHROPIC = {"x-api-key": "key-budget", "anthropic-version": "2023-06-01", "content-type": "application/json"}


def chat(n: int) -> bytes:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)]
    return orjson.dumps({"model": "gpt-5.5", "max_completion_tokens": 8, "messages": messages})


def system_then(n: int, size: int = 0) -> bytes:
    """An Anthropic body a proxy within budget rewrites (a marker on the long system prompt)."""
    messages = [{"role": "user", "content": f"question {i} " + "x" * size} for i in range(0, n, 2)]
    body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "system": "Rules. " * 2000, "messages": messages}
    return orjson.dumps(body)


async def post(proxy_url: str, path: str, raw: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(proxy_url + path, data=raw, headers=headers) as r:
        return r.status, orjson.loads(await r.read())


async def test_a_body_over_the_block_budget_is_forwarded_as_sent_and_succeeds(
    start_proxy: Any, sim: Sim, tmp_path: Path
) -> None:
    proxy: Proxy = await start_proxy(upstream=sim.url, store=f"sqlite://{tmp_path}/s.db", pipeline_budget_blocks=500)
    status, answer = await post(proxy.url, "/v1/chat/completions", chat(501), OPENAI)
    assert status == 200
    assert answer["object"] == "chat.completion"
    await proxy.services.store.flush()  # type: ignore[union-attr]
    assert proxy.sample(EXCEEDED, kind="blocks") == 1
    assert proxy.sample(EXCEEDED, kind="bytes") == 0
    prompt = answer["usage"]["prompt_tokens"]
    assert prompt > 0
    assert proxy.sample("promptcache_input_tokens_total", provider="openai", cache="none") == prompt
    assert proxy.sample("promptcache_stage_errors_total", stage="session") == 0
    assert proxy.sample("promptcache_prompt_bytes_total", provider="openai") == 0  # not measured
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.url + "/debug/tenants", headers=OPENAI) as r:
            [tenant] = (await r.json())["tenants"]
        async with http.get(proxy.url + "/debug/sessions", headers=OPENAI) as r:
            assert (await r.json())["sessions"] == []  # nothing measured or kept for it
    assert tenant["over_budget"] == 1
    assert tenant["last_over_budget"] == "body of 501 blocks is over pipeline_budget_blocks (500)"
    assert tenant["requests"] == 1 and tenant["cost_usd"] > 0
    assert proxy.services.store is not None
    assert await proxy.services.store.load(tenant["tenant"], explicit_id("big-1")) is None
    # one message fewer is within the budget: optimised and measured as usual
    status, _ = await post(proxy.url, "/v1/chat/completions", chat(500), {**OPENAI, "x-session-id": "big-2"})
    assert status == 200
    assert proxy.sample(EXCEEDED, kind="blocks") == 1
    assert proxy.sample("promptcache_prompt_bytes_total", provider="openai") > 0
    await proxy.services.store.flush()
    assert await proxy.services.store.load(tenant["tenant"], explicit_id("big-2")) is not None


async def test_the_upstream_receives_the_clients_exact_bytes(make_proxy: Any, fake_upstream: FakeUpstream) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, pipeline_budget_bytes=20_000)
    within = system_then(4)
    over = system_then(4, size=6_000)
    assert len(within) < 20_000 < len(over)
    assert (await post(proxy.url, "/v1/messages", within, ANTHROPIC))[0] == 200
    assert (await post(proxy.url, "/v1/messages", over, ANTHROPIC))[0] == 200
    first, second = fake_upstream.received
    assert first.body != within and b'"cache_control"' in first.body  # within the budget: optimised
    assert second.body == over  # over it: byte for byte as the client sent it
    assert proxy.sample(EXCEEDED, kind="bytes") == 1
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == 2 * 3000


def tool_inputs(objects: int) -> bytes:
    """An Anthropic body of three blocks whose one tool call's input holds `objects` small objects."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "edit", "input": {"rows": [{"n": i} for i in range(objects)]}}
    messages = [
        {"role": "user", "content": "edit it"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}]},
    ]
    return orjson.dumps({"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": messages})


def test_nodes_are_bounded_from_the_raw_bytes_at_any_depth() -> None:
    raw = tool_inputs(1_000)
    # the body, messages, 3 messages, 2 content lists, 2 blocks, input, rows, 1,000 rows
    assert raw.count(b"{") + raw.count(b"[") == 1_011
    assert raw_over_budget(raw, 1 << 30, 1_011, 1 << 30) is None
    assert raw_over_budget(raw, 1 << 30, 1_010, 1 << 30) == (
        "nodes",
        "body of 1011 '{' and '[' is over pipeline_budget_nodes (1010)",
    )
    assert raw_over_budget(raw, len(raw) - 1, 1 << 30, 1 << 30) == (
        "bytes",
        f"body of {len(raw)} bytes is over pipeline_budget_bytes ({len(raw) - 1})",
    )
    assert blocks_over_budget(orjson.loads(raw), 4) == ("blocks", "body of 5 blocks is over pipeline_budget_blocks (4)")
    assert blocks_over_budget(orjson.loads(raw), 5) is None
    # brackets inside strings count too: the bound errs towards skipping
    texts = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "{[" * 50}]})
    assert raw_over_budget(texts, 1 << 30, 100, 1 << 30)[0] == "nodes"  # type: ignore[index]


async def test_a_body_of_few_blocks_over_the_node_budget_is_forwarded_as_sent(
    make_proxy: Any, fake_upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, pipeline_budget_nodes=5_000)
    within, over = tool_inputs(4_000), tool_inputs(5_000)
    assert (await post(proxy.url, "/v1/messages", within, ANTHROPIC))[0] == 200
    assert (await post(proxy.url, "/v1/messages", over, ANTHROPIC))[0] == 200
    first, second = fake_upstream.received
    assert first.body != within  # within the budget: canonicalised and marked
    assert second.body == over
    assert [proxy.sample(EXCEEDED, kind=k) for k in ("bytes", "blocks", "nodes")] == [0, 0, 1]


def test_values_are_bounded_from_the_raw_bytes_scalars_included() -> None:
    """Review finding (session 4): a flat list of millions of integers has few nodes."""
    raw = b'{"a":[1,2,3],"b":{"c":4,"d":5}}'  # 3 commas in the list and object, 2 more, 3 brackets
    assert raw_over_budget(raw, 1 << 30, 1 << 30, 7) is None
    assert raw_over_budget(raw, 1 << 30, 1 << 30, 6) == (
        "values",
        "body of 7 ',', '{' and '[' is over pipeline_budget_values (6)",
    )


async def test_a_body_of_few_nodes_over_the_values_budget_is_forwarded_as_sent(
    make_proxy: Any, fake_upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, pipeline_budget_values=20_000)
    call = {"type": "tool_use", "id": "toolu_1", "name": "edit", "input": {"ints": list(range(30_000))}}
    messages = [
        {"role": "user", "content": "edit it"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}]},
    ]
    over = orjson.dumps({"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": messages})
    assert (await post(proxy.url, "/v1/messages", over, ANTHROPIC))[0] == 200
    assert fake_upstream.received[0].body == over
    assert [proxy.sample(EXCEEDED, kind=k) for k in ("bytes", "blocks", "nodes", "values")] == [0, 0, 0, 1]
