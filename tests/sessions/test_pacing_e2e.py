"""Pacing end to end on the simulator's manual clock: who acts next read from the response, a
tenant that learns its people's pauses, 1h writes seen in usage, TTL downgrades counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.pacing import HUMAN, TOOL
from proxy.providers.anthropic import AnthropicUsage
from proxy.providers.openai import ChatUsage, ResponsesUsage
from tests.sessions.conftest import Client, Proxy, Sim
from tests.sessions.test_simulator import body, first_message, usage

SIX_MINUTES = 360.0


def test_who_acts_next_from_each_api_s_response() -> None:
    def anthropic(stop: str | None, stream: bool = False) -> str | None:
        reader = AnthropicUsage()
        if stream:
            reader.feed_event("message_start", {"type": "message_start", "message": {"id": "m", "usage": {}}})
            reader.feed_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop}})
        else:
            reader.feed_json({"id": "m", "stop_reason": stop, "usage": {"input_tokens": 1}})
        return reader.result().turn

    assert [anthropic(s) for s in ("end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn")] == [
        HUMAN,
        HUMAN,
        HUMAN,
        TOOL,
        TOOL,
    ]
    assert anthropic("tool_use", stream=True) == TOOL and anthropic("end_turn", stream=True) == HUMAN
    assert anthropic(None) is None and anthropic("something_new") is None

    def chat(reason: str | None, stream: bool = False) -> str | None:
        reader = ChatUsage()
        chunk = {"id": "c", "choices": [{"index": 0, "finish_reason": reason}]}
        reader.feed_event("", chunk) if stream else reader.feed_json(chunk)
        return reader.result().turn

    assert [chat("stop"), chat("length"), chat("tool_calls"), chat("tool_calls", True), chat(None)] == [
        HUMAN,
        HUMAN,
        TOOL,
        TOOL,
        None,
    ]

    def responses(output: list[dict[str, Any]], stream: bool = False) -> str | None:
        reader = ResponsesUsage()
        response = {"id": "r", "output": output, "usage": {"input_tokens": 3}}
        if stream:
            reader.feed_event("response.completed", {"type": "response.completed", "response": response})
        else:
            reader.feed_json(response)
        return reader.result().turn

    message = {"type": "message", "content": [{"type": "output_text", "text": "hi"}]}
    call = {"type": "function_call", "name": "ls", "call_id": "1", "arguments": "{}"}
    assert [responses([message]), responses([message, call]), responses([call], True)] == [HUMAN, TOOL, TOOL]


async def conversation(
    proxy: Proxy, sim: Sim, client: Client, session: str, turns: int, gap: float, **headers: str
) -> list[dict[str, Any]]:
    """`turns` requests of one session, `gap` seconds apart (the simulator answers text: each
    response ends the turn, so every gap is a human one)."""
    history = [first_message(f"2026-11-29T20:00:00Z {session}")]
    usages = []
    for n in range(turns):
        status, response = await client.messages(
            proxy, body(history), headers={"x-session-id": session, **headers}
        )
        assert status == 200, response
        usages.append(usage(response))
        answer = {"role": "assistant", "content": response["content"]}
        history = [*history, answer, {"role": "user", "content": f"q{n}"}]
        await client.settle(proxy)
        await sim.advance(gap)
    return usages


def split(usages: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """`(read, 5m written, 1h written)` per request."""
    return [
        (
            u["cache_read_input_tokens"],
            u["cache_creation"]["ephemeral_5m_input_tokens"],
            u["cache_creation"]["ephemeral_1h_input_tokens"],
        )
        for u in usages
    ]


async def test_a_tenant_that_pauses_six_minutes_gets_1h_from_its_next_conversation_s_first_request(
    start_proxy: Any, sim: Sim, client: Client, tmp_path: Path
) -> None:
    store = f"sqlite://{tmp_path}/s.db"
    proxy = await start_proxy(upstream=sim.url, store=store, secret="s" * 32)
    proxy.services.sessions.clock = sim.clock.now
    first = split(await conversation(proxy, sim, client, "a", 4, SIX_MINUTES))
    # a new tenant: the prior says people mostly come back within 5 minutes, so 5m; gone after
    # 6 minutes, written again with 1h once a 6-minute pause was seen, then read every turn
    assert first[0][0] == 0 and first[0][1] > 0 and first[0][2] == 0
    assert first[1][0] == 0 and first[1][2] > 0
    assert all(read > 0 and five == 0 and one > 0 for read, five, one in first[2:])
    assert proxy.sample("promptcache_ttl_downgrades_total", provider="anthropic") == 0
    await proxy.stop()
    # a restarted proxy on the same store: the tenant's pacing was kept there
    proxy = await start_proxy(upstream=sim.url, store=store, secret="s" * 32)
    proxy.services.sessions.clock = sim.clock.now
    second = split(await conversation(proxy, sim, client, "b", 2, SIX_MINUTES))
    assert second[0][1] == 0 and second[0][2] > 0  # 1h from the first request
    assert second[1][0] > 0 and second[1][1] == 0  # read after the pause


async def test_thirty_second_people_never_pay_for_1h(start_proxy: Any, sim: Sim, client: Client) -> None:
    proxy = await start_proxy(upstream=sim.url)
    proxy.services.sessions.clock = sim.clock.now
    got = split(await conversation(proxy, sim, client, "a", 4, 30.0))
    assert all(one == 0 for _, _, one in got)
    assert all(read > 0 for read, _, _ in got[1:])


async def test_a_subagent_tail_stays_5m_while_the_parent_keeps_1h(
    start_proxy: Any, sim: Sim, client: Client
) -> None:
    proxy = await start_proxy(upstream=sim.url)
    proxy.services.sessions.clock = sim.clock.now
    await conversation(proxy, sim, client, "parent", 3, SIX_MINUTES)
    agent = split(await conversation(proxy, sim, client, "worker", 1, 5.0, **{"x-claude-code-agent-id": "a1"}))
    assert agent[0][1] > 0 and agent[0][2] == 0
    parent = split(await conversation(proxy, sim, client, "parent2", 1, SIX_MINUTES))
    assert parent[0][2] > 0 and parent[0][1] == 0


async def test_a_gateway_that_strips_ttl_shows_as_downgrades(start_proxy: Any, sim: Sim, client: Client) -> None:
    async def strip(request: web.Request) -> web.StreamResponse:
        data = orjson.loads(await request.read())

        def drop(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: drop(v) for k, v in value.items() if k != "ttl"}
            if isinstance(value, list):
                return [drop(v) for v in value]
            return value

        headers = {k: v for k, v in request.headers.items() if k.lower() in ("x-api-key", "anthropic-version")}
        async with aiohttp.ClientSession() as session:
            async with session.post(sim.url + request.path, data=orjson.dumps(drop(data)), headers=headers) as up:
                return web.Response(status=up.status, body=await up.read(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/messages", strip)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        proxy = await start_proxy(upstream=f"http://{host}:{port}")
        proxy.services.sessions.clock = sim.clock.now
        got = split(await conversation(proxy, sim, client, "a", 4, SIX_MINUTES))
        # every marker asked for 1h from the second request on; the gateway made them 5m, so the
        # entries expired and were written again (5m) each time
        assert all(read == 0 and one == 0 and five > 0 for read, five, one in got)
        assert proxy.sample("promptcache_ttl_downgrades_total", provider="anthropic") == 3
    finally:
        await runner.cleanup()


async def test_people_who_come_back_the_next_day_get_no_tail_written(
    start_proxy: Any, sim: Sim, client: Client
) -> None:
    proxy = await start_proxy(upstream=sim.url)
    proxy.services.sessions.clock = sim.clock.now
    usages = await conversation(proxy, sim, client, "a", 3, 2 * 3600.0)
    # the prior writes the first tail (5m); after a two-hour pause seen (the turn ended, the
    # person came back after the hour) nothing predicts a read: every token goes uncached
    assert split(usages)[0][1] == usages[0]["input_tokens"] + usages[0]["cache_creation_input_tokens"]
    for u in usages[1:]:
        assert (u["cache_read_input_tokens"], u["cache_creation_input_tokens"]) == (0, 0)
        assert u["input_tokens"] > usages[0]["cache_creation_input_tokens"]
