"""Platform test fixtures: the simulator as a given platform, a proxy in front of it or of the
recording fake upstream, and a long system prompt (above every model's minimum)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from proxy.sim.app import start_sim

SYSTEM = " ".join(f"Rule {i}: keep the answer short and cite file {i}.py when relevant." for i in range(300))
"""About 5,100 tokens: above every minimum (docs/provider-rules.md 1.6)."""


@pytest.fixture
async def make_sim() -> AsyncIterator[Callable[..., Any]]:
    runners = []

    async def factory(platform: str = "direct", openai_platform: str = "direct") -> str:
        runner, url = await start_sim(anthropic_platform=platform, openai_platform=openai_platform)
        runners.append(runner)
        return url

    yield factory
    for runner in runners:
        await runner.cleanup()
