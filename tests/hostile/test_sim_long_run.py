"""A long run without whitespace (attack finding F4): tiktoken's merge is superlinear in one
pre-token piece, so 2 MiB of `a` took ~1.4 s to count, on the simulator's event loop, stalling
every tenant's requests. Runs are now cut every `MAX_RUN` characters, and a body of
`OFFLOOP_BODY_BYTES` or more is rendered on a worker thread with its own counter."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sim.app import OFFLOOP_BODY_BYTES, STATE, create_sim_app
from proxy.sim.clock import Clock
from proxy.sim.tokens import _LONG_RUN, MAX_RUN, TokenCounter, _has_long_run, _pieces, encode_bounded, load_o200k

ENCODING = load_o200k()
HEADERS = {"x-api-key": "key-long", "anthropic-version": "2023-06-01"}
RUN = "a" * (2 * 1024 * 1024)


def test_a_2_mib_run_counts_as_tiktoken_counts_it_whole() -> None:
    # `a` repeated merges into 8-character tokens and MAX_RUN is a multiple of 8: no deviation.
    assert MAX_RUN % 8 == 0
    counter = TokenCounter(ENCODING)
    assert counter.count(RUN) == 262_144
    assert len(counter.encode(RUN)) == 262_144


def test_a_cut_run_may_count_a_token_more_than_whole() -> None:
    # The documented deviation: `x` + 2 MiB of `a` is 262,145 tokens whole; cut every MAX_RUN
    # characters, the last 1-character piece and the first piece's odd length cost two more.
    assert len(ENCODING.encode_ordinary("x" + RUN)) == 262_145
    assert TokenCounter(ENCODING).count("x" + RUN) == 262_147


def test_prose_counts_exactly_as_tiktoken() -> None:
    text = "The cache holds the exact bytes of each earlier turn.\n" * 2_000
    assert not _has_long_run(text)
    assert encode_bounded(ENCODING, text) == ENCODING.encode_ordinary(text)
    assert TokenCounter(ENCODING).count(text) == 22_000


RUNS = st.lists(
    st.tuples(st.sampled_from(["a", "b", " ", "\n", "é", "7", "."]), st.integers(1, 3 * MAX_RUN)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(RUNS)
def test_pieces_join_to_the_text_and_bound_every_run(runs: list[tuple[str, int]]) -> None:
    text = "".join(ch * n for ch, n in runs)
    pieces = list(_pieces(text, _LONG_RUN))
    assert "".join(pieces) == text
    for piece in pieces:
        assert all(len(word) <= MAX_RUN for word in piece.split())


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.text("abc.7é", min_size=1, max_size=MAX_RUN // 2), min_size=1, max_size=6),
    st.sampled_from([" ", "\n", "  "]),
)
def test_text_without_a_long_run_counts_exactly(words: list[str], sep: str) -> None:
    text = sep.join(words * 3)
    if _has_long_run(text):  # a window can still fall inside one word when words are long
        return
    assert encode_bounded(ENCODING, text) == ENCODING.encode_ordinary(text)


class GateExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, holding each job until the test releases it: the test sees
    the job submitted (so the count is off the loop) while the loop serves other requests."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(max_workers=2)
        self.loop = loop
        self.submitted = asyncio.Event()
        self.release = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        def held() -> Any:
            self.loop.call_soon_threadsafe(self.submitted.set)
            self.release.wait()
            return fn(*args, **kwargs)

        return super().submit(held)


@pytest.fixture
async def started() -> AsyncIterator[tuple[str, aiohttp.web.Application]]:
    app = create_sim_app(clock=Clock.manual_at())
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", app
    await runner.cleanup()


async def test_a_2_mib_run_is_counted_while_the_simulator_answers(
    started: tuple[str, aiohttp.web.Application],
) -> None:
    url, app = started
    loop = asyncio.get_running_loop()
    gate = GateExecutor(loop)
    loop.set_default_executor(gate)
    body = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": RUN}]}
    assert len(RUN) > OFFLOOP_BODY_BYTES
    async with aiohttp.ClientSession() as session:

        async def count() -> tuple[int, Any]:
            data = io.BytesIO(orjson.dumps(body))  # aiohttp warns of a large `json=` body
            headers = {**HEADERS, "content-type": "application/json"}
            async with session.post(url + "/v1/messages/count_tokens", data=data, headers=headers) as r:
                return r.status, await r.json()

        big = asyncio.ensure_future(count())
        try:
            await asyncio.wait_for(gate.submitted.wait(), 60)
            # The count is on the worker thread (held there): the loop still answers.
            async with session.get(url + "/_sim/clock") as r:
                assert r.status == 200
            assert not big.done()
            assert app[STATE].offloop_lock.locked()
        finally:
            gate.release.set()
        # 262,144 tokens of text and the user turn's 3 structural tokens.
        assert await big == (200, {"input_tokens": 262_147})
        # A small body is counted on the loop, by the loop's counter.
        small = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "a" * 8}]}
        async with session.post(url + "/v1/messages/count_tokens", json=small, headers=HEADERS) as r:
            assert (r.status, await r.json()) == (200, {"input_tokens": 4})
    assert app[STATE].offloop is not None and app[STATE].offloop.holds(RUN)
    assert app[STATE].counter is not None and not app[STATE].counter.holds(RUN)
    gate.shutdown()
