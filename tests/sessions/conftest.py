"""Session test fixtures: proxies whose app state the test can reach, a real redis-server,
the simulator with a manual clock, and a small JSON client. Real HTTP on loopback only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.app import create_app
from proxy.appkeys import SERVICES
from proxy.services import Services
from proxy.settings import Settings
from proxy.sim.app import start_sim
from proxy.sim.clock import Clock
from tests.store.redis_server import RedisServer

ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}


@dataclass
class Proxy:
    url: str
    app: web.Application
    runner: web.AppRunner
    registry: CollectorRegistry
    is_running: bool = True

    @property
    def services(self) -> Services:
        return self.app[SERVICES]

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def stop(self) -> None:
        if self.is_running:
            self.is_running = False
            await self.runner.cleanup()


@dataclass
class Client:
    """Posts JSON bodies, returns `(status, parsed JSON)`. One keep-alive connection per proxy:
    aiohttp serves a connection's requests one after another, so `settle(proxy)` returns once
    the previous request's handler has finished and its background record write is done."""

    session: aiohttp.ClientSession
    sent: list[bytes] = field(default_factory=list)

    async def messages(
        self, proxy: Proxy, body: Any, *, key: str = "key-a", headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        raw = orjson.dumps(body)
        self.sent.append(raw)
        h = {**ANTHROPIC_HEADERS, "x-api-key": key, **(headers or {})}
        async with self.session.post(proxy.url + "/v1/messages", data=raw, headers=h) as response:
            return response.status, orjson.loads(await response.read())

    async def settle(self, proxy: Proxy) -> None:
        async with self.session.get(proxy.url + "/healthz") as response:
            assert response.status == 200
        if proxy.services.store is not None:
            await proxy.services.store.flush()


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit_per_host=1)) as session:
        yield Client(session)


@pytest.fixture
async def start_proxy(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """`await start_proxy(**settings)`: a running proxy; `state_dir` defaults to a temp dir."""
    proxies: list[Proxy] = []

    async def factory(**settings: Any) -> Proxy:
        settings.setdefault("port", 0)
        settings.setdefault("store", "memory://")
        settings.setdefault("state_dir", tmp_path / "state")
        registry = CollectorRegistry()
        app = create_app(Settings(**settings), registry)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        proxy = Proxy(f"http://{host}:{port}", app, runner, registry)
        proxies.append(proxy)
        return proxy

    yield factory
    for proxy in proxies:
        await proxy.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server per test (tests stop and restart it)."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@dataclass
class Sim:
    url: str
    clock: Clock
    session: aiohttp.ClientSession

    async def advance(self, seconds: float) -> None:
        async with self.session.post(self.url + "/_sim/clock", json={"advance": seconds}) as response:
            assert response.status == 200, await response.text()


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    clock = Clock.manual_at()
    runner, url = await start_sim("127.0.0.1", 0, clock=clock)
    async with aiohttp.ClientSession() as session:
        yield Sim(url, clock, session)
    await runner.cleanup()
