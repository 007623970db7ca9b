"""Through the simulator: client faults it rejects, and a per-turn timestamp in the system prompt.

Every client fault of tests/pipeline/test_client_faults.py is answered 400 by the simulator as
sent, and 200 after the pipeline.

Ten turns of one conversation. Without promptcache the first system line changes every turn, so
nothing is ever read. With promptcache (the packaged rules: the timestamp rule is `move_to_user`)
the timestamp goes onto the newest user message, the system prompt is byte-stable, the replay stage
sends the earlier user message exactly as sent before (timestamp included), and every turn
after the first reads the whole previous request. Expected token counts come from the
simulator's own `count_tokens` on the bodies it actually received (a recording relay sits
between proxy and simulator).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.providers import ANTHROPIC
from tests.pipeline.helpers import optimise

sim_app = pytest.importorskip("proxy.sim.app")
sim_clock = pytest.importorskip("proxy.sim.clock")

MODEL = "claude-sonnet-4-6"
HEADERS = {
    "x-api-key": "sk-ant-sim-test",
    "anthropic-version": "2023-06-01",
    "content-type": "application/json",
}
GUIDE = "\n".join(
    f"Rule {i}: when the task touches module {i}, read its tests first, keep functions small, "
    f"and explain the change to the reviewer in one sentence."
    for i in range(60)
)
PROBE = {"role": "user", "content": "probe"}


class Relay:
    """Forwards every request to `target` and records the JSON bodies it passed on."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.bodies: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def _forward(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.bodies.append(orjson.loads(raw))
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("x-api-key", "anthropic-version", "anthropic-beta", "authorization")
        }
        headers["content-type"] = "application/json"
        async with aiohttp.ClientSession() as client:
            async with client.post(self.target + request.path, data=raw, headers=headers) as resp:
                return web.Response(
                    body=await resp.read(), status=resp.status, content_type="application/json"
                )


def _system(turn: int) -> str:
    return f"Current time: 2026-11-29T20:{turn:02d}:00Z\n{GUIDE}"


def _client_body(turn: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client sends: its own marker on the system prompt and on the last message."""
    question = {
        "role": "user",
        "content": [
            {"type": "text", "text": f"Question {turn}: what next?", "cache_control": {"type": "ephemeral"}}
        ],
    }
    return {
        "model": MODEL,
        "max_tokens": 64,
        "system": [{"type": "text", "text": _system(turn), "cache_control": {"type": "ephemeral"}}],
        "messages": [*history, question],
    }


def _unmarked(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, list):
        content = [{k: v for k, v in block.items() if k != "cache_control"} for block in content]
    return {**message, "content": content}


async def _converse(base: str, sim: str, turns: int = 10) -> list[dict[str, int]]:
    usages = []
    history: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as client:
        for turn in range(turns):
            body = _client_body(turn, history)
            async with client.post(f"{base}/v1/messages", data=orjson.dumps(body), headers=HEADERS) as resp:
                assert resp.status == 200, await resp.text()
                reply = await resp.json()
            usages.append(reply["usage"])
            history = [
                *(_unmarked(m) for m in body["messages"]),
                {"role": "assistant", "content": reply["content"]},
            ]
            async with client.post(f"{sim}/_sim/clock", json={"advance": 30}) as resp:
                assert resp.status == 200
    return usages


async def _tokens(sim: str, body: dict[str, Any], messages: int) -> int:
    """Simulator tokens of `body`'s tools + system + first `messages` messages."""
    async with aiohttp.ClientSession() as client:

        async def count(payload: dict[str, Any]) -> int:
            async with client.post(
                f"{sim}/v1/messages/count_tokens", data=orjson.dumps(payload), headers=HEADERS
            ) as r:
                assert r.status == 200, await r.text()
                return (await r.json())["input_tokens"]

        prefix = {k: v for k, v in body.items() if k != "messages"}
        with_probe = await count({**prefix, "messages": [*body["messages"][:messages], PROBE]})
        return with_probe - await count({"model": MODEL, "messages": [PROBE]})


async def test_per_turn_timestamp_reads_nothing_without_and_everything_before_with(make_proxy) -> None:
    runner, sim = await sim_app.start_sim("127.0.0.1", 0, clock=sim_clock.Clock.manual_at())
    relay = Relay(sim)
    try:
        await relay.start()
        direct = await _converse(sim, sim)
        assert [u["cache_read_input_tokens"] for u in direct] == [0] * 10
        assert all(u["cache_creation_input_tokens"] > 0 for u in direct)

        proxy = await make_proxy(upstream=relay.url)
        usages = await _converse(proxy.url, sim)
        sent = relay.bodies
        assert len(sent) == 10
        # byte-stable apart from the markers' TTLs (5m on the first turn, 1h once paced: proxy.pacing)
        system = _unmarked({"content": sent[0]["system"]})
        assert all(_unmarked({"content": b["system"]}) == system for b in sent), "system prompt must be byte-stable"
        previous_total = 0
        for turn, (usage, body) in enumerate(zip(usages, sent, strict=True)):
            total = await _tokens(sim, body, len(body["messages"]))
            if turn:
                before = sent[turn - 1]["messages"]
                assert [_unmarked(m) for m in body["messages"][: len(before)]] == [
                    _unmarked(m) for m in before
                ]
            assert usage["cache_read_input_tokens"] == previous_total, f"turn {turn + 1}"
            assert usage["cache_creation_input_tokens"] == total - previous_total, f"turn {turn + 1}"
            assert usage["input_tokens"] == 0, f"turn {turn + 1}"
            previous_total = total
        assert sum(u["cache_read_input_tokens"] for u in usages) > 8 * 1024
    finally:
        if relay.runner is not None:
            await relay.runner.cleanup()
        await runner.cleanup()


EPH = {"type": "ephemeral"}


def _t(text: str, marker: dict | None = None) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"cache_control": marker} if marker else {})}


FAULTS = {
    "five markers": {
        "cache_control": EPH,
        "tools": [{"name": "r", "input_schema": {"type": "object"}, "cache_control": EPH}],
        "system": [_t("S", EPH)],
        "messages": [
            {"role": "user", "content": [_t("a", EPH)]},
            {"role": "assistant", "content": [_t("b", EPH)]},
            {"role": "user", "content": [_t("c")]},
        ],
    },
    "marker in tool_result.content": {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "r", "input": {}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": [_t("x", EPH)]}],
            },
        ]
    },
    "marker on empty text": {
        "messages": [{"role": "user", "content": [_t("hello"), _t("", {**EPH, "ttl": "1h"})]}]
    },
    "1h after 5m": {
        "system": [_t("S", EPH)],
        "messages": [{"role": "user", "content": [_t("a", {**EPH, "ttl": "1h"})]}],
    },
    "marker on thinking": {
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "x", "signature": "s", "cache_control": EPH}],
            },
            {"role": "user", "content": "ok"},
        ]
    },
}


async def test_client_faults_rejected_as_sent_are_accepted_after_the_pipeline() -> None:
    runner, sim = await sim_app.start_sim("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as client:
            for name, fault in FAULTS.items():
                body = {"model": MODEL, "max_tokens": 8, **fault}
                fixed, _ = optimise(ANTHROPIC, body, min_tokens=0)
                statuses = []
                for payload in (body, fixed):
                    async with client.post(
                        f"{sim}/v1/messages", data=orjson.dumps(payload), headers=HEADERS
                    ) as r:
                        statuses.append(r.status)
                assert statuses == [400, 200], name
    finally:
        await runner.cleanup()
