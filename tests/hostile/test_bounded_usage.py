"""Bounded usage reading (issue 11, item 8): a large JSON response passes through chunk by
chunk and its usage is read without holding the whole body (memory O(chunk))."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.forward import JSON_HEAD_BYTES, JSON_TAIL_BYTES, WHOLE_JSON_BYTES, UsageTee
from proxy.providers import ANTHROPIC

USAGE = {"input_tokens": 11, "cache_read_input_tokens": 4000, "cache_creation_input_tokens": 300, "output_tokens": 9}


def big_message(text_bytes: int) -> bytes:
    text = 'line with "quotes" and "usage": {"input_tokens": 1} inside\n' * (text_bytes // 60)
    return orjson.dumps(
        {
            "id": "msg_big",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-6",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": USAGE,
        }
    )


def test_tee_holds_head_and_tail_only() -> None:
    body = big_message(8 * 1024 * 1024)
    tee = UsageTee(ANTHROPIC.usage_reader(), "application/json", "")
    most = most_after = 0
    for i in range(0, len(body), 65536):
        tee.feed(body[i : i + 65536])
        most = max(most, tee.buffered_bytes)
        if i > 2 * WHOLE_JSON_BYTES:
            most_after = max(most_after, tee.buffered_bytes)
    tee.finish()
    # At most the whole-parse limit plus a chunk, then the head and the tail only.
    assert most <= WHOLE_JSON_BYTES + 65536
    assert most_after <= JSON_HEAD_BYTES + JSON_TAIL_BYTES + 65536
    usage = tee.reader.result()
    assert (usage.input_none, usage.cache_read, usage.cache_write, usage.output) == (11, 4000, 300, 9)
    assert usage.response_id == "msg_big"


async def test_large_json_response_usage_counted_through_the_proxy(make_proxy: Any) -> None:
    body = big_message(6 * 1024 * 1024)

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for i in range(0, len(body), 65536):
            await response.write(body[i : i + 65536])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/messages", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        proxy = await make_proxy(upstream=f"http://127.0.0.1:{port}")
        request = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"x-api-key": "key-b", "anthropic-version": "2023-06-01"}
        async with aiohttp.ClientSession() as http:
            async with http.post(proxy.url + "/v1/messages", json=request, headers=headers) as r:
                assert r.status == 200
                assert await r.read() == body
        assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == 4000
        assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="none") == 11
        assert proxy.sample("promptcache_output_tokens_total", provider="anthropic") == 9
    finally:
        await runner.cleanup()
