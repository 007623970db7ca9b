"""Upstream affinity: several base URLs per upstream, one per session by rendezvous hashing,
moved only on a connect error, 5xx or 429 (each move counted: a cold write on the new URL)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import pytest

from proxy.affinity import Affinity, base_urls, is_failure, ranking
from tests.fakes.upstream import FakeUpstream

URLS = ("http://a.example", "http://b.example", "http://c.example")


def test_ranking_is_stable_and_adding_a_url_moves_only_its_winners() -> None:
    keys = [f"session-{i}" for i in range(300)]
    before = {k: ranking(k, URLS)[0] for k in keys}
    assert before == {k: ranking(k, URLS)[0] for k in keys}
    assert set(before.values()) == set(URLS)
    more = (*URLS, "http://d.example")
    after = {k: ranking(k, more)[0] for k in keys}
    assert all(after[k] in (before[k], "http://d.example") for k in keys)


def test_a_session_moves_only_after_a_failure_of_its_own_url() -> None:
    pool = Affinity(URLS)
    first = pool.pick("s1")
    assert pool.failed("s1", "http://nowhere") is False and pool.pick("s1") == first
    assert pool.failed("s1", first) is True
    second = pool.pick("s1")
    assert second == ranking("s1", URLS)[1]
    assert pool.failed("s1", first) is False  # a late failure of the old URL moves nothing
    assert pool.pick(None) == URLS[0] and Affinity(URLS[:1]).failed("s1", URLS[0]) is False
    assert [is_failure(s) for s in (200, 400, 429, 500, 502, 503)] == [False, False, True, True, True, True]
    assert base_urls(" http://a/, http://b ") == ("http://a", "http://b")


@pytest.fixture
async def fakes() -> AsyncIterator[list[FakeUpstream]]:
    started = [FakeUpstream(), FakeUpstream()]
    for fake in started:
        await fake.start()
    yield started
    for fake in started:
        await fake.stop()


async def _ask(url: str, session: str) -> anthropic.types.Message:
    async with anthropic.AsyncAnthropic(base_url=url, api_key="sk-aff", max_retries=0) as client:
        return await client.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-session-id": session},
        )


def _counts(fakes: list[FakeUpstream]) -> list[int]:
    return [len(f.received) for f in fakes]


async def test_sessions_stick_and_move_on_429_and_on_connect_error(fakes: list[FakeUpstream], make_proxy) -> None:
    proxy = await make_proxy(upstream="real", anthropic_upstream=",".join(f.url for f in fakes))
    for _ in range(3):
        await _ask(proxy.url, "sess-1")
    counts = _counts(fakes)
    assert sorted(counts) == [0, 3]  # every request of the session on one URL
    home = counts.index(3)
    fakes[home].mode = "overloaded"
    with pytest.raises(anthropic.RateLimitError):
        await _ask(proxy.url, "sess-1")  # a 429 goes back to the client: it was answered
    await _ask(proxy.url, "sess-1")
    assert _counts(fakes)[1 - home] == 1  # moved
    assert proxy.sample("promptcache_upstream_moves_total", provider="anthropic") == 1
    await fakes[1 - home].stop()  # connect error: nothing was sent, so the request goes on
    fakes[home].mode = "normal"
    reply = await _ask(proxy.url, "sess-1")
    assert reply.content[0].text == "Hello there"
    assert _counts(fakes)[home] == 5
    assert proxy.sample("promptcache_upstream_moves_total", provider="anthropic") == 2
