"""`/debug/sessions/{id}`: a live session's state, visible only with the same credential."""

from __future__ import annotations

import aiohttp

from tests.fakes.upstream import FakeUpstream

BODY = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


async def test_debug_session_shows_record_and_last_measurement(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    owner = {"x-api-key": "sk-tenant-a", "anthropic-version": "2023-06-01", "x-session-id": "conv-1"}
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(proxy.url + "/v1/messages", json=BODY, headers=owner) as r:
                assert r.status == 200
                await r.read()
        async with http.get(proxy.url + "/debug/sessions/conv-1", headers={"x-api-key": "sk-tenant-a"}) as r:
            assert r.status == 200
            seen = await r.json()
        # The same key as a bearer token is the same tenant.
        bearer = {"Authorization": "Bearer sk-tenant-a"}
        async with http.get(proxy.url + "/debug/sessions/conv-1", headers=bearer) as r:
            assert r.status == 200
        async with http.get(proxy.url + "/debug/sessions/conv-1", headers={"x-api-key": "sk-tenant-b"}) as r:
            assert r.status == 404
            assert await r.json() == {"error": "no such session for this credential"}
    assert seen["record"]["turns"] == 2
    assert seen["record"]["model"] == "claude-sonnet-4-6"
    assert seen["last_request"]["divergence"]["cause"] == "none"
    assert seen["last_request"]["usage"]["cache_read"] == 3000
