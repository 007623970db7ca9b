"""Keep-warm end to end on the simulator's manual clock (no sleeps: the test drives
`KeepWarm.fire_due` on the simulator's time): pauses of 6, 25, 40 and 70 minutes, the cap, the
window's end, observe mode, and a next request that comes first."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import pytest

from proxy.keepwarm import MARGIN, ping_pays, return_chance, silence_model
from proxy.pacing import FIVE_MINUTES, RETURN_PRIOR, RETURN_WEIGHT, Pacing
from proxy.pricing import default_pricing
from proxy.providers.anthropic_request import PING_TEXT, prefix_request
from proxy.providers.base import Usage
from proxy.sim.app import start_sim
from proxy.sim.clock import Clock
from tests.sessions.conftest import Client, Sim
from tests.sessions.test_simulator import MODEL, body, first_message, usage

SESSION = {"x-session-id": "warm"}


async def warm_proxy(start_proxy: Any, sim: Sim, *, returning: bool = True, **settings: Any) -> Any:
    """A keep-warm proxy on the simulator's clock. `returning`: its tenant's people came back
    after each of their last 98 turns (no gaps kept: the prior lognormal gives their timing),
    so pings pay for most of the hour; else a new tenant (`Pacing.return_share` from the prior)."""
    proxy = await start_proxy(upstream=sim.url, **{"keep_warm": "on", **settings})
    state = proxy.services.sessions
    state.clock = sim.clock.now
    if returning:
        tenant = state.tenant_of("anthropic", {"x-api-key": "key-a"})
        state.pacing.put(tenant, Pacing(ends=98, responses=98, returns=98))
    if proxy.services.keep_warm is not None:
        proxy.services.keep_warm.stop_loop()
    return proxy


async def pause(proxy: Any, sim: Sim, seconds: float) -> list[float]:
    """Let `seconds` pass on the simulator's clock, sending each ping when it is due; returns
    the clock seconds at which pings were sent."""
    kw = proxy.services.keep_warm
    end = sim.clock.now() + seconds
    sent = []
    while kw is not None and (due := kw.next_due()) is not None and due <= end:
        await sim.advance(max(0.0, due - sim.clock.now()))
        if await kw.fire_due(sim.clock.now()):
            sent.append(sim.clock.now())
    await sim.advance(end - sim.clock.now())
    return sent


async def two_turns(
    proxy: Any, sim: Sim, client: Client, gap: float
) -> tuple[list[dict[str, Any]], list[float], float]:
    history = [first_message("2026-11-29T20:00:00Z")]
    start = sim.clock.now()
    status, response = await client.messages(proxy, body(history), headers=SESSION)
    assert status == 200, response
    await client.settle(proxy)
    pings = await pause(proxy, sim, gap)
    history = [*history, {"role": "assistant", "content": response["content"]}, {"role": "user", "content": "q"}]
    status, second = await client.messages(proxy, body(history), headers=SESSION)
    assert status == 200, second
    await client.settle(proxy)
    return [usage(response), usage(second)], pings, start


def test_a_ping_pays_while_the_person_is_likely_back_within_five_minutes() -> None:
    # the prior (lognormal, median 4 minutes): still worth a ping after 50 minutes away
    survival = lambda t: 1 - NormalDist().cdf(math.log(t / 240.0) / 1.65)  # noqa: E731
    assert return_chance((), 270.0) == pytest.approx((survival(270) - survival(570)) / survival(270))
    assert return_chance((), 270.0) == pytest.approx(0.3637, abs=1e-4)
    assert ping_pays((), 3000.0)
    # a tenant whose people always come back within 2 minutes: after 4 minutes they are gone
    quick = (60.0, 90.0, 100.0, 110.0, 120.0)
    assert return_chance(quick, 240.0) == return_chance((), 240.0)  # too few longer gaps: the prior
    assert return_chance((300.0, 310.0, 2000.0, 2500.0), 240.0) == 0.5
    assert not ping_pays((4000.0, 4000.0, 4000.0), 270.0)
    # some never come back: r (S(w) - S(w + h)) / (r S(w) + 1 - r)
    r = 0.5
    assert return_chance((), 270.0, returning=r) == pytest.approx(
        r * (survival(270) - survival(570)) / (r * survival(270) + 1 - r)
    )
    assert return_chance((300.0, 310.0, 2000.0, 2500.0), 240.0, returning=r) == pytest.approx(0.5 * 0.5 / 1.0)
    assert return_chance((), 270.0, returning=0.0) == 0.0
    assert ping_pays((), 270.0, returning=r) and not ping_pays((), 540.0, returning=r)
    assert ping_pays((), 3000.0, returning=0.996) and not ping_pays((), 3000.0, returning=0.8)


@pytest.mark.parametrize("minutes", [6, 25, 40])
async def test_pauses_the_entry_survives(start_proxy: Any, sim: Sim, client: Client, minutes: int) -> None:
    proxy = await warm_proxy(start_proxy, sim)
    (first, second), pings, start = await two_turns(proxy, sim, client, minutes * 60)
    assert first["cache_creation"]["ephemeral_5m_input_tokens"] > 0
    # one ping MARGIN seconds before every expiry: each lands while the entry still lives
    step = FIVE_MINUTES - MARGIN
    expected = [start + k * step for k in range(1, 100) if k * step < minutes * 60]
    assert pings == expected
    lived = [start, *pings]
    assert all(b - a < FIVE_MINUTES for a, b in zip(lived, lived[1:], strict=False))
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert proxy.sample("promptcache_keepwarm_pings_total", provider="anthropic", outcome="ok") == len(pings)
    saved = proxy.sample("promptcache_keepwarm_saved_read_tokens_total", provider="anthropic")
    assert saved == second["cache_read_input_tokens"]
    prices = default_pricing().prices("anthropic", MODEL)
    assert prices is not None
    one = prices.cost(Usage(cache_read=first["cache_creation_input_tokens"] + first["input_tokens"], output=1))
    cost = proxy.sample("promptcache_keepwarm_cost_usd_total", provider="anthropic")
    # each ping reads the whole prompt (and the simulator's short reply is its output)
    assert one * len(pings) <= cost <= (one + 32 * prices.output / 1e6) * len(pings)


async def test_seventy_minutes_pings_stop_at_the_hour_and_the_credential_goes(
    start_proxy: Any, sim: Sim, client: Client
) -> None:
    proxy = await warm_proxy(start_proxy, sim)
    (first, second), pings, start = await two_turns(proxy, sim, client, 70 * 60)
    assert pings and all(t < start + 3600 for t in pings) and pings[-1] + FIVE_MINUTES < start + 70 * 60
    assert proxy.services.keep_warm.windows == {} or all(
        w.session != "warm" for w in proxy.services.keep_warm.windows.values()
    )
    assert second["cache_read_input_tokens"] == 0  # gone by then: written again
    assert proxy.sample("promptcache_keepwarm_saved_read_tokens_total", provider="anthropic") == 0


async def test_no_ping_past_the_cap(start_proxy: Any, sim: Sim, client: Client) -> None:
    probe = await warm_proxy(start_proxy, sim)
    (first, _), _, _ = await two_turns(probe, sim, client, 10.0)
    prices = default_pricing().prices("anthropic", MODEL)
    assert prices is not None
    one = prices.cost(Usage(cache_read=first["cache_creation_input_tokens"] + first["input_tokens"], output=1))
    await probe.stop()
    await sim.advance(7200)
    proxy = await warm_proxy(start_proxy, sim, keep_warm=str(2.5 * one), secret="c" * 32)
    _, pings, _ = await two_turns(proxy, sim, client, 25 * 60)
    assert len(pings) == 2
    assert proxy.sample("promptcache_keepwarm_cost_usd_total", provider="anthropic") <= 2.5 * one


async def test_no_ping_when_the_next_request_comes_first_nor_in_observe_mode_nor_when_off(
    start_proxy: Any, sim: Sim, client: Client
) -> None:
    proxy = await warm_proxy(start_proxy, sim)
    (_, second), pings, _ = await two_turns(proxy, sim, client, FIVE_MINUTES - MARGIN - 1)
    assert pings == [] and second["cache_read_input_tokens"] > 0
    assert proxy.sample("promptcache_keepwarm_pings_total", provider="anthropic", outcome="ok") == 0
    observing = await warm_proxy(start_proxy, sim, mode="observe")
    _, pings, _ = await two_turns(observing, sim, client, 25 * 60)
    assert pings == [] and observing.services.keep_warm.windows == {}
    off = await warm_proxy(start_proxy, sim, keep_warm="off")
    assert off.services.keep_warm is None


EPH = {"type": "ephemeral"}


def test_a_ping_carries_the_prefix_up_to_the_last_marker_and_nothing_after() -> None:
    question = {"role": "user", "content": [{"type": "text", "text": "q0"}]}
    done = {"role": "assistant", "content": [{"type": "text", "text": "Ok.", "cache_control": EPH}]}
    newest = {"role": "user", "content": [{"type": "text", "text": "q1"}, {"type": "text", "text": "reminder"}]}
    sent = {"model": MODEL, "max_tokens": 32, "system": "s", "messages": [question, done, newest]}
    # blocks: system 0, q0 1, Ok. 2, q1 3, reminder 4
    cut = prefix_request(sent, 2)
    assert cut == {**sent, "messages": [question, done, {"role": "user", "content": PING_TEXT}]}
    assert cut is not None and cut["messages"][1] is done  # the very blocks sent: the same bytes
    assert prefix_request(sent, 3) == {
        **sent,
        "messages": [question, done, {**newest, "content": newest["content"][:1]}],
    }
    assert prefix_request(sent, 4) is sent
    assert prefix_request(sent, 0) is None  # not in the messages: the body goes whole
    call = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t", "name": "ls", "input": {}, "cache_control": EPH}],
    }
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}
    assert prefix_request({**sent, "messages": [question, call, result]}, 2) is None  # a call without its result
    results = {
        "role": "user",
        "content": [{**result["content"][0], "cache_control": EPH}, {**result["content"][0], "tool_use_id": "u"}],
    }
    assert prefix_request({**sent, "messages": [question, call, results]}, 3) is None  # a result dropped


async def test_a_ping_after_a_client_marked_turn_reads_the_marked_prefix_and_sends_nothing_else_uncached(
    start_proxy: Any, sim: Sim, client: Client
) -> None:
    proxy = await warm_proxy(start_proxy, sim)
    question = first_message("2026-11-29T20:00:00Z")
    done = {"role": "assistant", "content": [{"type": "text", "text": "Ok.", "cache_control": EPH}]}
    newest = {"role": "user", "content": "Rebuilt every turn. " * 200}
    status, response = await client.messages(proxy, body([question, done, newest]), headers=SESSION)
    assert status == 200, response
    await client.settle(proxy)
    first = usage(response)
    # the proxy leaves the newest message unmarked (the client marked an earlier one)
    assert first["cache_creation_input_tokens"] > 0 and first["input_tokens"] > 800
    assert await pause(proxy, sim, FIVE_MINUTES + 60) == [sim.clock.now() - 60 - MARGIN]
    ((_, _, ping),) = proxy.services.keep_warm.sent
    # the marked prefix read; only the one-token user turn and its message overhead uncached
    # (the simulator counts 3 tokens per message, proxy/sim/anthropic.py MESSAGE_OVERHEAD)
    assert (ping.cache_read, ping.cache_write, ping.input_none) == (first["cache_creation_input_tokens"], 0, 1 + 3)


async def test_a_failing_ping_opens_the_tenant_s_breaker_and_drops_every_credential(
    start_proxy: Any, client: Client
) -> None:
    clock = Clock.manual_at()
    runner, url = await start_sim("127.0.0.1", 0, clock=clock)
    proxy = await start_proxy(upstream=url, keep_warm="on")
    proxy.services.sessions.clock = clock.now
    kw = proxy.services.keep_warm
    kw.stop_loop()
    for session in ("one", "two"):
        history = [first_message(f"2026-11-29T20:00:00Z {session}")]
        status, response = await client.messages(proxy, body(history), headers={"x-session-id": session})
        assert status == 200, response
        await client.settle(proxy)
    held = list(kw.windows.values())
    assert len(held) == 2 and all(w.headers for w in held)
    await runner.cleanup()  # the upstream is gone: the first ping fails
    due = kw.next_due()
    assert due is not None and await kw.fire_due(due) == 0
    # the failing window dropped, the other refused by the open breaker: no credential kept
    assert kw.windows == {} and all(w.headers == {} for w in held)
    assert proxy.sample("promptcache_keepwarm_pings_total", provider="anthropic", outcome="error") == 1
    assert proxy.sample("promptcache_keepwarm_pings_total", provider="anthropic", outcome="ok") == 0
    assert kw.breaker[held[0].tenant] == due + 3600


async def test_a_new_tenant_s_pings_stop_once_the_silence_says_the_person_is_gone(
    start_proxy: Any, sim: Sim, client: Client
) -> None:
    proxy = await warm_proxy(start_proxy, sim, returning=False)
    # one turn ended, none followed yet: return_share = (0 + 0.8 * 2) / (1 + 2)
    tenant = proxy.services.sessions.tenant_of("anthropic", {"x-api-key": "key-a"})
    (first, second), pings, start = await two_turns(proxy, sim, client, 25 * 60)
    share = proxy.services.sessions.pacing.peek(tenant).return_share
    assert share == pytest.approx((1 + RETURN_PRIOR * RETURN_WEIGHT) / (2 + RETURN_WEIGHT))  # after the return
    # the first ping pays (r = 0.533 at 4.5 minutes), the second would not (9 minutes away)
    assert pings == [start + FIVE_MINUTES - MARGIN]
    assert second["cache_read_input_tokens"] == 0  # the entry lapsed: written again


LS_TOOL = {"name": "ls", "description": "List a folder.", "input_schema": {"type": "object", "properties": {}}}


async def test_a_tool_call_left_unanswered_for_minutes_is_kept_warm_for_a_new_tenant(
    start_proxy: Any, sim: Sim, client: Client
) -> None:
    # a new tenant's first request ends in a tool call; the result comes 6 minutes later (a
    # permission prompt): one ping at 4.5 minutes pays (`silence_model`: chance 0.140)
    proxy = await warm_proxy(start_proxy, sim, returning=False)
    history = [first_message("2026-11-29T20:00:00Z")]
    start = sim.clock.now()
    headers = {**SESSION, "x-sim-tool-call": "ls"}
    status, response = await client.messages(proxy, body(history, tools=[LS_TOOL]), headers=headers)
    assert status == 200 and response["stop_reason"] == "tool_use", response
    await client.settle(proxy)
    window = proxy.services.keep_warm.windows[next(iter(proxy.services.keep_warm.windows))]
    assert window.turn == "tool"
    pings = await pause(proxy, sim, 360.0)
    assert pings == [start + FIVE_MINUTES - MARGIN]
    call = next(b for b in response["content"] if b["type"] == "tool_use")
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "a b c"}
    history = [*history, {"role": "assistant", "content": response["content"]}, {"role": "user", "content": [result]}]
    status, second = await client.messages(proxy, body(history, tools=[LS_TOOL]), headers=SESSION)
    assert status == 200, second
    first = usage(response)
    assert first["cache_creation"]["ephemeral_5m_input_tokens"] > 0
    assert usage(second)["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert (
        proxy.sample("promptcache_keepwarm_saved_read_tokens_total", provider="anthropic")
        == (first["cache_creation_input_tokens"])
    )


def test_after_a_tool_call_held_tool_gaps_and_abandonment_time_the_silence() -> None:
    # returning = q / (q + 0.015), q = (held + 0.02 * 2) / (tool gaps + 2)
    human = Pacing(human=(60.0,) * 4, ends=4, responses=8, returns=4)
    assert silence_model(human, "human") == ((60.0,) * 4, human.return_share)
    new_gaps, new_r = silence_model(Pacing(), "tool")
    assert new_gaps == () and new_r == pytest.approx(0.02 / 0.035)
    assert return_chance((), 270.0, returning=new_r) == pytest.approx(0.1403, abs=1e-4)
    assert ping_pays((), 270.0, returning=new_r) and not ping_pays((), 540.0, returning=new_r)
    # tool results that always came within seconds: an open call is an abandoned one, no ping
    fast_gaps, fast_r = silence_model(Pacing(tool=(5.0, 8.0, 20.0)), "tool")
    assert fast_gaps == () and fast_r == pytest.approx(0.008 / 0.023)
    assert not ping_pays(fast_gaps, 270.0, returning=fast_r)
    # a person approving each call 6 minutes later: back within 5 more minutes
    held_gaps, held_r = silence_model(Pacing(tool=(20.0, 360.0, 360.0, 360.0)), "tool")
    assert held_gaps == (360.0,) * 3 and held_r == pytest.approx((3.04 / 6) / (3.04 / 6 + 0.015))
    assert return_chance(held_gaps, 270.0, returning=held_r) == pytest.approx(held_r / (held_r + 1 - held_r))
    # held calls that come back only after the hour: none within the next 5 minutes
    assert return_chance(silence_model(Pacing(tool=(4000.0,) * 3), "tool")[0], 270.0) == 0.0
