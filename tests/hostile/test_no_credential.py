"""No credential, no state (issue 11, item 10): a request without any credential header is
forwarded exactly as sent (the upstream answers 401 as it would), nothing is stored for it, and
`/debug` answers such a caller nothing."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from tests.fakes.upstream import FakeUpstream

SYSTEM = "You are a careful assistant. " * 200
HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json", "x-session-id": "shared-1"}


def turn(n: int) -> bytes:
    messages: list[dict[str, Any]] = []
    for i in range(n):
        messages += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    messages.append({"role": "user", "content": f"q{n}"})
    return orjson.dumps({"model": "claude-sonnet-4-6", "max_tokens": 8, "system": SYSTEM, "messages": messages})


async def test_requests_without_credential_are_observe_only(fake_upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    async with aiohttp.ClientSession() as http:
        for n in range(3):
            async with http.post(proxy.url + "/v1/messages", data=turn(n), headers=HEADERS) as r:
                await r.read()
        async with http.get(proxy.url + "/debug/sessions/shared-1") as r:
            assert r.status == 404
        async with http.get(proxy.url + "/debug/sessions") as r:
            assert (await r.json()) == {"sessions": []}
        gets = proxy.sample(
            "promptcache_session_store_operation_duration_seconds_count", backend="memory", operation="get"
        )
        assert gets == 0  # no store read for a caller without credential
        # A client with a key gets the pipeline (markers injected) and its own state.
        keyed = {**HEADERS, "x-api-key": "key-n"}
        async with http.post(proxy.url + "/v1/messages", data=turn(0), headers=keyed) as r:
            await r.read()
        async with http.get(proxy.url + "/debug/sessions/shared-1", headers=keyed) as r:
            assert r.status == 200
    assert [fake_upstream.received[i].body for i in range(3)] == [turn(n) for n in range(3)]
    assert fake_upstream.received[3].body != turn(0)
