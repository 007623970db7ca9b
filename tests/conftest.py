"""Shared fixtures: a recording fake upstream and a proxy in front of it, on real loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy.app import start_proxy
from proxy.settings import Settings
from tests.fakes.upstream import FakeUpstream


@pytest.fixture
async def fake_upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    await fake.start()
    yield fake
    await fake.stop()


class ProxyHandle:
    def __init__(self, url: str, registry: CollectorRegistry, runner: Any) -> None:
        self.url = url
        self.registry = registry
        self.runner = runner

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


@pytest.fixture
async def make_proxy() -> AsyncIterator[Callable[..., Any]]:
    runners = []

    async def factory(**settings: Any) -> ProxyHandle:
        settings.setdefault("port", 0)
        settings.setdefault("store", "memory://")
        registry = CollectorRegistry()
        runner, url = await start_proxy(Settings(**settings), registry)
        runners.append(runner)
        return ProxyHandle(url, registry, runner)

    yield factory
    for runner in runners:
        await runner.cleanup()
