"""The `o200k_base` counter is built on the first request whose adapter counts tokens (OpenAI),
once per process: a process serving only Anthropic traffic never holds it (`proxy.tokenizer`)."""

from __future__ import annotations

import asyncio
import io
import threading
from typing import Any

import aiohttp
import orjson

from proxy.appkeys import SERVICES
from proxy.sim.tokens import TokenCounter, load_o200k

ANTHROPIC = {"x-api-key": "sk-ant-lazy", "anthropic-version": "2023-06-01"}
OPENAI = {"authorization": "Bearer sk-openai-lazy", "content-type": "application/json"}


async def test_only_a_request_that_counts_tokens_builds_the_counter(make_proxy: Any, fake_upstream: Any) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    services = proxy.runner.app[SERVICES]
    body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(proxy.url + "/v1/messages", json=body, headers=ANTHROPIC) as r:
                assert r.status == 200
        assert (services.tokens, services.tokenizer.loads) == (None, 0)

        chat = {"model": "gpt-5.1", "messages": [{"role": "user", "content": "hello " * 300}]}

        async def ask(n: int) -> int:
            headers = {**OPENAI, "x-session-id": f"lazy-{n}"}
            async with http.post(proxy.url + "/v1/chat/completions", json=chat, headers=headers) as r:
                await r.read()
                return r.status

        assert await asyncio.gather(*(ask(n) for n in range(4))) == [200] * 4  # concurrent first requests
        assert services.tokens is not None and services.tokenizer.loads == 1
        assert await ask(9) == 200
        assert services.tokenizer.loads == 1
    assert proxy.sample("promptcache_stage_errors_total", stage="observe") == 0


GATE = "gate-7f3a"
OUTER = 10  # seconds: the gate's bound (a loop it blocks is released after this, and the test fails)


class GatedEncoding:
    """`o200k_base` whose encoding of a text holding `GATE` sets `entered`, then waits for
    `release` (at most `OUTER` s) before counting: it holds whichever thread counts it."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.entered = threading.Event()
        self.release = threading.Event()
        self.gated = 0

    def encode_ordinary(self, text: str) -> list[int]:
        if GATE in text:
            self.gated += 1
            self.entered.set()
            self.release.wait(OUTER)
        return self.real.encode_ordinary(text)


async def test_a_big_prediction_is_counted_off_the_loop(make_proxy: Any, fake_upstream: Any) -> None:
    """Leftover of session 9's attack pass: the `o200k_base` count of an OpenAI prediction ran
    on the event loop (a 2 MiB text ~0.3 s, every tenant waiting). A body of
    `OFFLOOP_BODY_BYTES` or more is now counted on a worker thread before it goes upstream: a
    request sent while that count is held completes first, and the measurement finds the count
    made (the big text is encoded once)."""
    proxy = await make_proxy(upstream=fake_upstream.url)
    services = proxy.runner.app[SERVICES]
    encoding = GatedEncoding(load_o200k())
    services.tokens = TokenCounter(encoding)
    big = (f"{GATE} " + "lorem ipsum dolor sit amet " * 80_000).strip()
    assert len(big) > 2 * 1024 * 1024
    first = [{"role": "user", "content": "hello " * 300}]
    second = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": big}]
    headers = {**OPENAI, "x-session-id": "offloop"}
    async with aiohttp.ClientSession() as http:

        async def ask(messages: list[dict[str, str]], session: str = "offloop") -> int:
            body = io.BytesIO(orjson.dumps({"model": "gpt-5.1", "messages": messages}))
            async with http.post(
                proxy.url + "/v1/chat/completions", data=body, headers={**headers, "x-session-id": session}
            ) as r:
                await r.read()
                return r.status

        assert await ask(first) == 200
        big_turn = asyncio.ensure_future(ask(second))
        try:
            assert await asyncio.to_thread(encoding.entered.wait, OUTER)
            assert not big_turn.done()
            assert await ask(first, session="other") == 200  # served while the count is held
            assert not big_turn.done()
        finally:
            encoding.release.set()
        assert await big_turn == 200
    assert services.tokens.holds(big) and encoding.gated == 1 and services.tokenizer.counted_ahead == 1
    assert proxy.sample("promptcache_stage_errors_total", stage="observe") == 0


class ThreadCountingEncoding(GatedEncoding):
    """`GatedEncoding` that also keeps the most encodings it saw at once on worker threads
    (the event loop's own counts, on the main thread, are not counted)."""

    def __init__(self, real: Any) -> None:
        super().__init__(real)
        self._lock = threading.Lock()
        self._active = 0
        self.most = 0

    def encode_ordinary(self, text: str) -> list[int]:
        if threading.current_thread() is threading.main_thread():
            return super().encode_ordinary(text)
        with self._lock:
            self._active += 1
            self.most = max(self.most, self._active)
        try:
            return super().encode_ordinary(text)
        finally:
            with self._lock:
                self._active -= 1


async def test_a_count_whose_client_left_keeps_its_place_and_its_counts(make_proxy: Any, fake_upstream: Any) -> None:
    """Leftover of session 10's attack pass: a client hanging up while its big prediction was
    counted on a thread freed the one place for counting (the thread ran on): the next big
    request started a second thread beside it, both cores taken from the loop, and the first
    count was thrown away. Now the count holds its place until its thread is done, the next
    waits for it, and the counts made for the client that left are kept."""
    proxy = await make_proxy(upstream=fake_upstream.url)
    services = proxy.runner.app[SERVICES]
    encoding = ThreadCountingEncoding(load_o200k())
    services.tokens = TokenCounter(encoding)
    gone = (f"{GATE} " + "lorem ipsum dolor sit amet " * 4_000).strip()
    other = " ".join(["consectetur adipiscing elit"] * 4_000)
    first = [{"role": "user", "content": "hello " * 300}]

    def turn(big: str) -> list[dict[str, str]]:
        return [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": big}]

    async def in_flight() -> float:
        return proxy.sample("promptcache_requests_in_flight", provider="openai")

    async with aiohttp.ClientSession() as http, aiohttp.ClientSession() as leaving:

        async def ask(client: aiohttp.ClientSession, messages: list[dict[str, str]], session: str) -> int:
            body = io.BytesIO(orjson.dumps({"model": "gpt-5.1", "messages": messages}))
            async with client.post(
                proxy.url + "/v1/chat/completions", data=body, headers={**OPENAI, "x-session-id": session}
            ) as r:
                await r.read()
                return r.status

        assert await ask(leaving, first, "gone") == 200
        assert await ask(http, first, "other") == 200
        left = asyncio.ensure_future(ask(leaving, turn(gone), "gone"))
        try:
            assert await asyncio.to_thread(encoding.entered.wait, OUTER)
            left.cancel()
            await leaving.close()  # the client hangs up while its count runs
            async with asyncio.timeout(OUTER):
                while await in_flight() != 0:  # its handler unwinds on this loop: yield to it
                    await asyncio.sleep(0)
            waiting = asyncio.ensure_future(ask(http, turn(other), "other"))
            async with asyncio.timeout(OUTER):  # its count waits for the place, or (as before) runs
                while services.tokenizer.waiting_ahead == 0 and encoding.most == 1 and not waiting.done():
                    await asyncio.sleep(0)
            assert (services.tokenizer.waiting_ahead, encoding.most, waiting.done()) == (1, 1, False)
        finally:
            encoding.release.set()
        assert await waiting == 200
    assert encoding.most == 1
    assert services.tokens.holds(gone) and services.tokens.holds(other)
    assert encoding.gated == 1 and services.tokenizer.counted_ahead == 2
    assert proxy.sample("promptcache_stage_errors_total", stage="observe") == 0
