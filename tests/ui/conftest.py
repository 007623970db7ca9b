"""Fixtures of the forensic-map tests: a proxy with its admin listener in front of the simulator
(manual clock), a session driven through it, and a headless chromium over CDP.

The browser tests skip only when no chromium can be found and not in CI; with `CI=true` a
missing chromium fails them (scripts/install installs Debian's `chromium`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry

from proxy.app import start_admin, start_proxy
from proxy.services import Services
from proxy.settings import Settings
from proxy.sim.app import start_sim
from proxy.sim.clock import Clock
from tests.ui.cdp import Browser, find_chromium

TOKEN = "test-admin-token-0123456789"
MODEL = "claude-sonnet-4-6"
KEY = "sk-ant-ui-test-secret-key-77"
SESSION = "ui-conv-1"
SYSTEM = " ".join(f"Rule {i}: keep answers short, cite files by path and never guess." for i in range(160))


@dataclass
class AdminProxy:
    url: str
    admin_url: str
    sim_url: str
    services: Services


@pytest.fixture
async def admin_proxy() -> AsyncIterator[Any]:
    cleanups: list[Any] = []

    async def factory(**settings: Any) -> AdminProxy:
        sim_runner, sim_url = await start_sim("127.0.0.1", 0, clock=Clock.manual_at())
        cleanups.append(sim_runner)
        settings = {"port": 0, "store": "memory://", "upstream": sim_url, "admin_port": 0, **settings}
        runner, url = await start_proxy(Settings(**settings), CollectorRegistry())
        cleanups.append(runner)
        admin, admin_url = await start_admin(runner.app, "127.0.0.1", 0)
        cleanups.append(admin)
        from proxy.appkeys import SERVICES

        return AdminProxy(url, admin_url, sim_url, runner.app[SERVICES])

    yield factory
    for item in reversed(cleanups):
        await item.cleanup()


def system_for(turn: int) -> list[dict[str, Any]]:
    """A long stable rule block with a marker, then a timestamp line that changes every turn."""
    return [
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": f"Current time: 2026-12-01T09:0{turn}:00Z"},
    ]


async def drive_session(
    proxy_url: str, turns: int = 4, *, key: str = KEY, session: str = SESSION
) -> list[dict[str, Any]]:
    """`turns` requests of one growing conversation through the proxy; the usages it answered."""
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01", "x-session-id": session}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What does main.py do?"}]
    usages = []
    async with aiohttp.ClientSession() as http:
        for turn in range(turns):
            body = {"model": MODEL, "max_tokens": 32, "system": system_for(turn), "messages": messages}
            async with http.post(proxy_url + "/v1/messages", data=orjson.dumps(body), headers=headers) as r:
                assert r.status == 200, await r.text()
                answer = orjson.loads(await r.read())
            usages.append(answer["usage"])
            messages = [
                *messages,
                {"role": "assistant", "content": answer["content"]},
                {"role": "user", "content": f"And then? ({turn})"},
            ]
    return usages


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = find_chromium()
    if executable is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium not found and CI=true: scripts/install must install Debian's chromium")
        pytest.skip("chromium not found (scripts/install installs it)")
    started = await Browser.start(executable)
    try:
        yield started
    finally:
        await started.close()
