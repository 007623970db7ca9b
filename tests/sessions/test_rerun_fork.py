"""A header-less re-run of a conversation (same tools, system and first message; only the
replies differ: an eval or agent re-run) against the simulator: its turns are one fork
session, compared with its own previous request, and cache like the same run sent with a
session id of its own (not as a rewrite of the first run's history)."""

from __future__ import annotations

from typing import Any

import orjson

from tests.sessions.conftest import Client, Proxy, Sim

MODEL = "claude-sonnet-4-5"
SYSTEM = "You are a careful agent. " * 300
OPENING = "Fix the failing test in the repo. " * 30
RUNS = ("alpha", "beta", "gamma")
TURNS = 4


def divergences(proxy: Proxy) -> dict[tuple[str, str], float]:
    """`(section, cause)` -> requests, the non-zero samples of the divergence counter."""
    out = {}
    for metric in proxy.registry.collect():
        for s in metric.samples:
            if s.name == "promptcache_prefix_divergences_total" and s.value:
                out[(s.labels["section"], s.labels["cause"])] = s.value
    return out


async def anthropic_runs(
    client: Client, proxy: Proxy, runs: tuple[str, ...], *, with_ids: bool
) -> list[list[tuple[int, int, int]]]:
    """`(read, written, uncached)` tokens per turn, per run (`runs`: the replies' words)."""
    out = []
    for run in runs:
        messages: list[dict[str, Any]] = [{"role": "user", "content": OPENING}]
        usages = []
        for t in range(TURNS):
            headers = {"x-sim-reply": f"{run} reply {t}"}
            if with_ids:
                headers["x-session-id"] = f"run-{run}"
            body = {"model": MODEL, "max_tokens": 100, "system": SYSTEM, "messages": messages}
            status, response = await client.messages(proxy, body, headers=headers)
            assert status == 200, response
            u = response["usage"]
            usages.append((u["cache_read_input_tokens"], u["cache_creation_input_tokens"], u["input_tokens"]))
            messages += [
                {"role": "assistant", "content": response["content"]},
                {"role": "user", "content": f"ok continue {t} " * 20},
            ]
        out.append(usages)
    return out


# one run of four turns: the opening written, then each turn reads the last and writes its own tail
FRESH = [(0, 2045, 0), (2045, 91, 0), (2136, 91, 0), (2227, 91, 0)]
RERUN = [(2045, 0, 0), (2045, 91, 0), (2136, 91, 0), (2227, 91, 0)]


async def test_runs_with_their_own_session_ids(start_proxy: Any, sim: Sim, client: Client) -> None:
    """The reference: each run names its session."""
    proxy = await start_proxy(upstream=sim.url)
    assert await anthropic_runs(client, proxy, RUNS, with_ids=True) == [FRESH, RERUN, RERUN]
    await client.settle(proxy)
    assert divergences(proxy) == {("none", "first_request"): 3, ("none", "none"): 9}


async def test_header_less_reruns_cache_like_runs_with_their_own_session_ids(
    start_proxy: Any, sim: Sim, client: Client
) -> None:
    proxy = await start_proxy(upstream=sim.url)
    assert await anthropic_runs(client, proxy, RUNS, with_ids=False) == [FRESH, RERUN, RERUN]
    await client.settle(proxy)
    # a re-run's first request is a shorter fork of the run before it (it shares all of it),
    # its next turns append to that fork: no history was rewritten
    assert divergences(proxy) == {("none", "first_request"): 1, ("none", "none"): 11}


async def test_header_less_chat_reruns_are_not_history_rewrites(start_proxy: Any, sim: Sim, client: Client) -> None:
    proxy = await start_proxy(upstream=sim.url)
    cached = []
    for run in RUNS:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": OPENING},
        ]
        for t in range(TURNS):
            headers = {
                "authorization": "Bearer key-chat",
                "content-type": "application/json",
                "x-sim-reply": f"{run} reply {t}",
            }
            raw = orjson.dumps({"model": "gpt-5.1", "messages": messages})
            async with client.session.post(proxy.url + "/v1/chat/completions", data=raw, headers=headers) as response:
                assert response.status == 200
                reply = orjson.loads(await response.read())
            cached.append(reply["usage"]["prompt_tokens_details"]["cached_tokens"])
            messages += [
                {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"ok continue {t} " * 20},
            ]
    assert cached == [0, 2048, 2048, 2176] + [2048, 2048, 2048, 2176] * 2
    await client.settle(proxy)
    assert divergences(proxy) == {("none", "first_request"): 1, ("none", "none"): 11}
