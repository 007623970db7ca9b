"""Fixtures for the simulator tests: a real server on 127.0.0.1:0 with a manual clock.

Tests run under uvloop (the loop `promptcache simulate` uses). Time moves only through
`POST /_sim/clock`; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
import uvloop

from proxy.sim.app import start_sim
from proxy.sim.clock import Clock
from proxy.sim.config import SimConfig

ANTHROPIC_VERSION = {"anthropic-version": "2023-06-01"}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], Any]]:
    return {"uvloop": uvloop.new_event_loop}


@dataclass
class Sim:
    url: str
    session: aiohttp.ClientSession
    clock: Clock

    async def post(
        self, path: str, body: Any, *, key: str | None = "tenant-a", headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        h = dict(headers or {})
        if key is not None:
            h.setdefault("Authorization", f"Bearer {key}")
        async with self.session.post(self.url + path, data=orjson.dumps(body), headers=h) as r:
            return r.status, orjson.loads(await r.read())

    async def raw(
        self, path: str, body: Any, *, key: str | None = "tenant-a", headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        h = dict(headers or {})
        if key is not None:
            h.setdefault("Authorization", f"Bearer {key}")
        async with self.session.post(self.url + path, data=orjson.dumps(body), headers=h) as r:
            return r.status, await r.read()

    async def messages(
        self, body: Any, *, key: str | None = "tenant-a", headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        h = {**ANTHROPIC_VERSION, **(headers or {})}
        if key is not None:
            h["x-api-key"] = key
        return await self.post("/v1/messages", body, key=None, headers=h)

    async def usage(
        self, body: Any, *, key: str = "tenant-a", headers: Mapping[str, str] | None = None
    ) -> dict:
        """Anthropic usage of a successful non-streamed request."""
        status, data = await self.messages(body, key=key, headers=headers)
        assert status == 200, data
        return data["usage"]

    async def messages_stream(
        self, body: Any, *, key: str = "tenant-a", headers: Mapping[str, str] | None = None
    ) -> list[tuple[str, Any]]:
        """(event, data) pairs of a streamed Messages request."""
        h = {**ANTHROPIC_VERSION, "x-api-key": key, **(headers or {})}
        status, raw = await self.raw("/v1/messages", {**body, "stream": True}, key=None, headers=h)
        assert status == 200, raw
        return parse_sse(raw)

    async def stream(
        self, path: str, body: Any, *, key: str = "tenant-a", headers: Mapping[str, str] | None = None
    ) -> list[tuple[str, Any]]:
        """(event, data) pairs of a streamed OpenAI request."""
        status, raw = await self.raw(path, {**body, "stream": True}, key=key, headers=headers)
        assert status == 200, raw
        return parse_sse(raw)

    async def advance(self, seconds: float) -> None:
        async with self.session.post(self.url + "/_sim/clock", json={"advance": seconds}) as r:
            assert r.status == 200, await r.text()


def parse_sse(raw: bytes) -> list[tuple[str, Any]]:
    """Split an SSE body into (event name or '', parsed data or the raw string) pairs."""
    out: list[tuple[str, Any]] = []
    for frame in raw.decode().split("\n\n"):
        if not frame.strip():
            continue
        event, data = "", ""
        for line in frame.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((event, data if data == "[DONE]" else orjson.loads(data)))
    return out


@pytest.fixture(scope="session")
def sim_config() -> SimConfig:
    return SimConfig.load()


@pytest.fixture
async def sim(sim_config: SimConfig) -> AsyncIterator[Sim]:
    clock = Clock.manual_at()
    runner, url = await start_sim(config=sim_config, clock=clock)
    try:
        async with aiohttp.ClientSession() as session:
            yield Sim(url, session, clock)
    finally:
        await runner.cleanup()
