"""The `o200k_base` counter is built on the first request whose adapter counts tokens (OpenAI),
once per process: a process serving only Anthropic traffic never holds it (`proxy.tokenizer`)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from proxy.appkeys import SERVICES

ANTHROPIC = {"x-api-key": "sk-ant-lazy", "anthropic-version": "2023-06-01"}
OPENAI = {"authorization": "Bearer sk-openai-lazy"}


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
