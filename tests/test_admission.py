"""`BodyGate`: requests enter the request stages while the bodies inside stay within the byte
limit, in arrival order; nothing is refused; a cancelled waiter gives up its place."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from proxy.admission import BodyGate
from proxy.appkeys import SERVICES
from proxy.store.memory import MemoryStore

ANTHROPIC = {"x-api-key": "sk-ant-gate", "anthropic-version": "2023-06-01"}


async def _settle() -> None:
    """Let every ready task run (no timer involved)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_requests_enter_in_order_within_the_limit() -> None:
    waits: list[int] = []
    gate = BodyGate(1000, lambda: waits.append(1))
    entered: list[str] = []
    leave = {name: asyncio.Event() for name in "abcd"}

    async def request(name: str, size: int) -> None:
        async with gate.admit(size):
            entered.append(name)
            await leave[name].wait()

    tasks = [asyncio.ensure_future(request(n, s)) for n, s in (("a", 600), ("b", 300), ("c", 600), ("d", 50))]  # noqa: TID251
    await _settle()
    # c does not fit beside a and b; d fits but waits behind c (arrival order)
    assert (entered, gate.held, gate.inside, gate.waiting, len(waits)) == (["a", "b"], 900, 2, 2, 2)
    assert gate.waiting_bytes == 650  # c's and d's bodies, held while they wait
    leave["a"].set()
    await _settle()
    assert (entered, gate.held, gate.waiting, gate.waiting_bytes) == (["a", "b", "c", "d"], 950, 0, 0)
    for event in leave.values():
        event.set()
    await asyncio.gather(*tasks)
    assert (gate.held, gate.inside, gate.waiting, len(waits)) == (0, 0, 0, 2)


async def test_a_body_larger_than_the_limit_runs_alone() -> None:
    gate = BodyGate(100)
    inside: list[int] = []
    release = asyncio.Event()

    async def request(size: int) -> None:
        async with gate.admit(size):
            inside.append(gate.inside)
            await release.wait()

    big = asyncio.ensure_future(request(5000))  # noqa: TID251
    small = asyncio.ensure_future(request(10))  # noqa: TID251
    await _settle()
    assert (inside, gate.waiting) == ([1], 1)
    release.set()
    await asyncio.gather(big, small)
    assert (inside, gate.held) == ([1, 1], 0)


async def test_a_cancelled_waiter_gives_up_its_place_and_an_error_gives_back_the_bytes() -> None:
    gate = BodyGate(100)
    release = asyncio.Event()

    async def hold(size: int) -> None:
        async with gate.admit(size):
            await release.wait()

    async def fail(size: int) -> None:
        async with gate.admit(size):
            raise ValueError("stage failed")

    first = asyncio.ensure_future(hold(80))  # noqa: TID251
    cancelled = asyncio.ensure_future(hold(80))  # noqa: TID251
    failing = asyncio.ensure_future(fail(20))  # noqa: TID251
    await _settle()
    assert (gate.inside, gate.waiting) == (1, 2)
    cancelled.cancel()
    await _settle()
    # its place given up, the 20-byte request fits beside the first one: it ran and failed
    assert (gate.inside, gate.waiting, failing.done()) == (1, 0, True)
    release.set()
    await first
    results = await asyncio.gather(cancelled, failing, return_exceptions=True)
    assert [type(r).__name__ for r in results] == ["CancelledError", "ValueError"]
    assert (gate.held, gate.inside, gate.waiting) == (0, 0, 0)


async def test_try_enter_takes_bytes_only_when_no_one_waits_and_leave_lets_the_next_in() -> None:
    gate = BodyGate(100)
    assert gate.try_enter(70) is True
    assert (gate.held, gate.inside) == (70, 1)
    assert gate.try_enter(40) is False  # does not fit beside the first: nothing taken
    assert (gate.held, gate.inside, gate.waiting) == (70, 1, 0)
    entered: list[int] = []

    async def request(size: int) -> None:
        async with gate.admit(size):
            entered.append(size)

    waiter = asyncio.ensure_future(request(40))  # noqa: TID251
    await _settle()
    assert (entered, gate.waiting) == ([], 1)
    assert gate.try_enter(10) is False  # fits, but someone waits: arrival order holds
    gate.leave(70)
    await waiter
    assert (entered, gate.held, gate.inside, gate.waiting) == ([40], 0, 0, 0)


class HeldStore(MemoryStore):
    """A memory backend whose reads wait until `release` is set (a store that is slow to answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.reads = 0

    async def get(self, tenant: str, session: str) -> bytes | None:
        self.reads += 1
        await self.release.wait()
        return await super().get(tenant, session)


async def test_the_proxy_holds_requests_beyond_the_limit_until_the_stages_are_free(
    make_proxy: Any, fake_upstream: Any
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, pipeline_inflight_bytes=150_000)
    services = proxy.runner.app[SERVICES]
    store = HeldStore()
    services.store.backend = store
    text = "x" * 100_000

    async def ask(http: aiohttp.ClientSession, n: int) -> int:
        body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": f"{n} {text}"}]}
        headers = {**ANTHROPIC, "x-session-id": f"gate-{n}"}
        async with http.post(proxy.url + "/v1/messages", json=body, headers=headers) as r:
            await r.read()
            return r.status

    async with aiohttp.ClientSession() as http:
        first = asyncio.ensure_future(ask(http, 1))  # noqa: TID251
        while store.reads < 1:  # the first request is inside, waiting for its record
            await asyncio.sleep(0)
        others = [asyncio.ensure_future(ask(http, n)) for n in (2, 3)]  # noqa: TID251
        while services.gate.waiting < 2:
            await asyncio.sleep(0)
        assert (store.reads, services.gate.inside, len(fake_upstream.received)) == (1, 1, 0)
        store.release.set()
        assert await asyncio.gather(first, *others) == [200, 200, 200]
    assert proxy.sample("promptcache_pipeline_admission_waits_total") == 2
    assert (services.gate.held, services.gate.inside, len(fake_upstream.received)) == (0, 0, 3)
