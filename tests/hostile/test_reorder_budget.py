"""Per-request classification budget (issue 11): distinct long lines in system blocks cost the
reorder rules their length each; past `reorder_budget_chars` the system prompt goes upstream as
sent (fail open, counted in `promptcache_rules_budget_exceeded_total{stage="reorder"}`), and
the proxy keeps serving meanwhile: `/healthz` is answered while that request is in flight."""

from __future__ import annotations

import asyncio
import random
import string
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.pipeline.segments import BudgetSpent, Classifier, Segment
from proxy.rules import Budget
from tests.fakes.upstream import ANTHROPIC_MESSAGE
from tests.pipeline.helpers import RULES

HEADERS = {"x-api-key": "key-b", "anthropic-version": "2023-06-01", "content-type": "application/json"}
BUDGETS = "promptcache_rules_budget_exceeded_total"
CLOCK_LINE = "Current time: 2026-11-29T20:07:13Z"
"""A volatile line the packaged rules move to the user message (when they get to classify it)."""


def system_text(lines: int, width: int = 16_000, seed: int = 1) -> str:
    """The clock line, then `lines` distinct lines of `width` characters (each a new line to
    the classifier: nothing cached helps)."""
    rnd = random.Random(seed)
    body = ["".join(rnd.choices(string.ascii_letters + " ", k=width)) for _ in range(lines)]
    return "\n".join([CLOCK_LINE, *body]) + "\n"


def request(text: str) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 8,
        "system": [{"type": "text", "text": text}],
        "messages": [{"role": "user", "content": "hello"}],
    }


@dataclass
class GatedUpstream:
    """An Anthropic upstream that holds each request until `release` is set."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    bodies: list[Any] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(orjson.loads(await request.read()))
        self.arrived.set()
        await self.release.wait()
        return web.json_response(ANTHROPIC_MESSAGE)


@pytest.fixture
async def gated() -> AsyncIterator[GatedUpstream]:
    upstream = GatedUpstream()
    upstream.release.set()
    app = web.Application(client_max_size=1 << 28)
    app.router.add_post("/v1/messages", upstream.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    upstream.url = f"http://{host}:{port}"
    yield upstream
    upstream.release.set()
    await runner.cleanup()


async def test_past_the_budget_the_system_prompt_goes_as_sent_counted_and_healthz_is_served(
    gated: GatedUpstream, make_proxy: Any
) -> None:
    proxy = await make_proxy(upstream=gated.url, reorder_budget_chars=64 * 1024)
    sent = request(system_text(20))  # 320,000 characters of new lines, 5x the budget
    events: list[str] = []
    gated.release.clear()
    async with aiohttp.ClientSession() as http:

        async def hostile() -> int:
            async with http.post(proxy.url + "/v1/messages", data=orjson.dumps(sent), headers=HEADERS) as r:
                await r.read()
                events.append("hostile answered")
                return r.status

        task = asyncio.ensure_future(hostile())
        async with asyncio.timeout(60):  # an outer bound, not a synchronisation
            await gated.arrived.wait()
        events.append("upstream has it")
        async with http.get(proxy.url + "/healthz") as r:
            assert r.status == 200
            events.append("healthz answered")
        gated.release.set()
        assert await task == 200
    assert events == ["upstream has it", "healthz answered", "hostile answered"]
    # not reordered, the clock line not moved (breakpoints still placed their marker)
    assert [b["text"] for b in gated.bodies[0]["system"]] == [sent["system"][0]["text"]]
    assert [b["text"] for b in gated.bodies[0]["messages"][0]["content"]] == ["hello"]
    assert proxy.sample(BUDGETS, stage="reorder") == 1
    assert proxy.sample(BUDGETS, stage="session") == 0


async def test_within_the_budget_the_same_prompt_is_reordered(gated: GatedUpstream, make_proxy: Any) -> None:
    proxy = await make_proxy(upstream=gated.url, reorder_budget_chars=1024 * 1024)
    sent = request(system_text(20))
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/messages", data=orjson.dumps(sent), headers=HEADERS) as r:
            assert r.status == 200
    received = gated.bodies[0]
    assert CLOCK_LINE not in received["system"][0]["text"]
    assert CLOCK_LINE in orjson.dumps(received["messages"]).decode()
    assert proxy.sample(BUDGETS, stage="reorder") == 0


def test_lines_classified_before_the_budget_ran_out_are_kept_for_the_next_request() -> None:
    text = system_text(8, width=1_000)
    classifier = Classifier(RULES)
    budget = Budget(3_000)  # room for the clock line and two long lines
    with pytest.raises(BudgetSpent):
        classifier.segments(text, budget)
    assert budget.is_spent
    lines = text.count("\n") + 1  # every line of a new text costs 1 up front (10 here)
    assert budget.left == 3_000 - lines - (len(CLOCK_LINE) + 64) - 2 * (1_000 + 64)
    second = Budget(lines + 6 * (1_000 + 64))  # exactly the six lines left
    assert classifier.segments(text, second) == Classifier(RULES).segments(text)
    assert second.left == 0 and not second.is_spent
    assert classifier.segments(text, Budget(0)) == Classifier(RULES).segments(text)  # cached: free


def test_a_text_of_remembered_lines_still_costs_one_per_line() -> None:
    """A million empty lines: each is remembered after the first, but walking them held the
    loop for seconds (ten million: 8.9 s of `/healthz` stall); refused up front now."""
    classifier = Classifier(RULES)
    assert classifier.segments("\n", Budget(100)) == (Segment("\n"),)
    budget = Budget(512 * 1024)
    with pytest.raises(BudgetSpent):
        classifier.segments("\n" * 1_000_000, budget)
    assert (budget.left, budget.is_spent) == (512 * 1024, True)
    small = Budget(512 * 1024)
    assert classifier.segments("\n" * 1_000, small) == (Segment("\n" * 1_000),)
    assert small.left == 512 * 1024 - 1_001
