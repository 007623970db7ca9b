"""Sessions against the upstream simulator (real prompt-cache accounting, manual clock):
replay of re-rendered timestamps, compaction, pacing TTLs, 4xx responses."""

from __future__ import annotations

from typing import Any

from tests.sessions.conftest import Client, Proxy, Sim

MODEL = "claude-sonnet-4-6"
SYSTEM = "You are a careful coding assistant."
CONTEXT = " ".join(f"Line {i}: the build system compiles module {i} before linking." for i in range(400))
SESSION = {"x-session-id": "sim-session"}


def first_message(timestamp: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": f"Current time: {timestamp}\n{CONTEXT}"}]}


def body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 32, "system": SYSTEM, "messages": messages, **extra}


def usage(response: Any) -> dict[str, Any]:
    return response["usage"]


async def converse(
    client: Client, proxy: Proxy, turns: list[list[dict[str, Any]]], headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    out = []
    for messages in turns:
        status, response = await client.messages(proxy, body(messages), headers=headers)
        assert status == 200, response
        out.append(usage(response))
    return out


async def test_rerendered_timestamp_is_replayed_and_read_every_turn(
    start_proxy: Any, sim: Sim, client: Client
) -> None:
    proxy = await start_proxy(upstream=sim.url)
    history: list[dict[str, Any]] = []
    usages = []
    for n in range(5):
        stamp = f"2026-11-29T20:{n:02d}:13Z"  # the client re-renders it every turn
        history = [first_message(stamp), *history[1:]] if history else [first_message(stamp)]
        status, response = await client.messages(proxy, body(history))  # no session id: inferred
        assert status == 200, response
        usages.append(usage(response))
        history = [
            *history,
            {"role": "assistant", "content": response["content"]},
            {"role": "user", "content": f"Step {n}?"},
        ]
    assert usages[0]["cache_read_input_tokens"] == 0 and usages[0]["cache_creation_input_tokens"] > 0
    for later in usages[1:]:
        assert later["cache_read_input_tokens"] >= usages[0]["cache_creation_input_tokens"]
    # Turn n replays the first message (its timestamp) and each earlier "Step k?": the planner
    # sent those as a one-block list to carry a marker, the client re-sends a string:
    # 1 + 2 + 3 + 4 messages.
    assert proxy.sample("promptcache_replayed_messages_total", provider="anthropic") == 10


async def test_same_client_without_replay_misses(start_proxy: Any, sim: Sim, client: Client) -> None:
    """Control: the same re-rendering client, with replay's input removed (no session state)."""
    proxy = await start_proxy(upstream=sim.url, store="memory://")
    reads = []
    for n in range(3):
        messages = [
            first_message(f"2026-11-29T21:{n:02d}:13Z"),
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": f"Step {n}?"},
        ]
        status, response = await client.messages(
            proxy, body(messages), headers={"x-session-id": f"fresh-{n}"}
        )
        assert status == 200
        reads.append(usage(response)["cache_read_input_tokens"])
    assert reads == [0, 0, 0]


async def test_compaction_gives_one_divergence_then_reads(start_proxy: Any, sim: Sim, client: Client) -> None:
    proxy = await start_proxy(upstream=sim.url)
    reply = {"role": "assistant", "content": "Done."}
    history = [first_message("2026-11-29T20:00:00Z")]
    turns = []
    for n in range(3):
        turns.append(list(history))
        history = [*history, reply, {"role": "user", "content": f"Next step {n}"}]
    summary = {"role": "user", "content": "Summary of the conversation so far: " + CONTEXT[:5000]}
    compacted = [summary, reply, {"role": "user", "content": "Continue."}]
    turns.append(compacted)
    turns.append([*compacted, reply, {"role": "user", "content": "And then?"}])
    turns.append(
        [
            *compacted,
            reply,
            {"role": "user", "content": "And then?"},
            reply,
            {"role": "user", "content": "Last"},
        ]
    )
    usages = await converse(client, proxy, turns, SESSION)
    reads = [u["cache_read_input_tokens"] for u in usages]
    assert reads[0] == 0 and reads[1] > 0 and reads[2] > reads[1]
    assert reads[3] == 0 and usages[3]["cache_creation_input_tokens"] > 0  # the one divergence
    assert reads[4] > 0 and reads[5] > reads[4]  # reads again
    await client.settle(proxy)
    rewritten = proxy.sample(
        "promptcache_prefix_divergences_total",
        provider="anthropic",
        section="messages",
        cause="history_rewritten",
    )
    assert rewritten == 1


async def paced_conversation(start_proxy: Any, sim: Sim, client: Client, gap: float) -> list[dict[str, Any]]:
    proxy = await start_proxy(upstream=sim.url)
    proxy.services.sessions.clock = sim.clock.now
    history = [first_message("2026-11-29T20:00:00Z")]
    usages = []
    for n in range(4):
        status, response = await client.messages(proxy, body(history), headers=SESSION)
        assert status == 200, response
        usages.append(usage(response))
        history = [
            *history,
            {"role": "assistant", "content": response["content"]},
            {"role": "user", "content": f"q{n}"},
        ]
        await client.settle(proxy)
        await sim.advance(gap)
    return usages


async def test_twenty_minute_gaps_use_1h_markers_and_read(start_proxy: Any, sim: Sim, client: Client) -> None:
    usages = await paced_conversation(start_proxy, sim, client, 20 * 60)
    one_hour = [u["cache_creation"]["ephemeral_1h_input_tokens"] for u in usages]
    five_min = [u["cache_creation"]["ephemeral_5m_input_tokens"] for u in usages]
    reads = [u["cache_read_input_tokens"] for u in usages]
    assert one_hour[0] == 0 and five_min[0] > 0  # first request: no pacing yet, 5m
    assert reads[1] == 0 and one_hour[1] > 0  # the 5m entry expired after 20 min; now 1h
    assert reads[2] >= one_hour[1] and reads[3] > reads[2]  # 1h entries are read 20 min later
    assert all(n == 0 for n in five_min[1:])


async def test_three_second_gaps_use_5m_markers_and_read(start_proxy: Any, sim: Sim, client: Client) -> None:
    usages = await paced_conversation(start_proxy, sim, client, 3)
    assert all(u["cache_creation"]["ephemeral_1h_input_tokens"] == 0 for u in usages)
    assert usages[0]["cache_creation"]["ephemeral_5m_input_tokens"] > 0
    assert all(u["cache_read_input_tokens"] > 0 for u in usages[1:])


async def test_4xx_never_updates_state(start_proxy: Any, sim: Sim, client: Client) -> None:
    proxy = await start_proxy(upstream=sim.url)
    bad = {"model": MODEL, "system": SYSTEM, "messages": [first_message("2026-11-29T20:00:00Z")]}
    status, response = await client.messages(proxy, bad, headers=SESSION)
    assert status == 400 and "max_tokens" in response["error"]["message"]
    await client.settle(proxy)
    assert len(proxy.services.store.backend) == 0
    status, _ = await client.messages(proxy, body([first_message("2026-11-29T20:00:00Z")]), headers=SESSION)
    assert status == 200
    await client.settle(proxy)
    assert len(proxy.services.store.backend) == 2  # the session's record and the tenant's pacing
