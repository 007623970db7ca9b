"""The recorder never fails a request (issue 11, item 6): a body nested deeper than orjson can
encode, and a trace path that cannot be written, are skipped and counted; the client gets the
upstream's answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.fakes.upstream import FakeUpstream

HEADERS = {"x-api-key": "key-r", "anthropic-version": "2023-06-01", "content-type": "application/json"}


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def body(extra: Any) -> bytes:
    return (
        orjson.dumps({"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})[
            :-1
        ]
        + b',"metadata_extra":'
        + extra
        + b"}"
    )


async def test_unencodable_body_and_unwritable_trace_are_counted_not_failed(
    fake_upstream: FakeUpstream, make_proxy: Any, tmp_path: Path
) -> None:
    # orjson encodes at most 254 levels; 300 parse fine (orjson reads up to 1024).
    deep = b'{"k":' * 300 + b'"leaf"' + b"}" * 300
    trace = tmp_path / "trace.jsonl"
    proxy = await make_proxy(upstream=fake_upstream.url, record=trace)
    async with aiohttp.ClientSession() as http:
        for raw in (body(deep), body(b"1")):
            async with http.post(proxy.url + "/v1/messages", data=raw, headers=HEADERS) as r:
                assert r.status == 200
                await r.read()
    await proxy.runner.cleanup()
    assert proxy.sample("promptcache_record_errors_total") == 1
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="ok") == 2
    assert [orjson.loads(line)["body"]["metadata_extra"] for line in trace.read_bytes().splitlines()] == [1]
    assert fake_upstream.received[0].body == body(deep)  # fail open: the client's bytes went upstream

    unwritable = await make_proxy(upstream=fake_upstream.url, record=tmp_path)  # a directory
    async with aiohttp.ClientSession() as http:
        async with http.post(unwritable.url + "/v1/messages", data=body(b"2"), headers=HEADERS) as r:
            assert r.status == 200
    await unwritable.runner.cleanup()
    assert unwritable.sample("promptcache_record_errors_total") == 1


async def test_a_key_in_a_session_header_is_not_recorded(
    fake_upstream: FakeUpstream, make_proxy: Any, tmp_path: Path
) -> None:
    """Review finding (session 4): a key-shaped `x-session-id` went into the trace verbatim."""
    key = "sk-ant-api03-" + "Q7w" * 12
    trace = tmp_path / "trace.jsonl"
    proxy = await make_proxy(upstream=fake_upstream.url, record=trace)
    async with aiohttp.ClientSession() as http:
        for session in (key, "plain-session-1"):
            headers = {**HEADERS, "x-session-id": session}
            async with http.post(proxy.url + "/v1/messages", data=body(b"1"), headers=headers) as r:
                assert r.status == 200
    await proxy.runner.cleanup()
    lines = [orjson.loads(line) for line in trace.read_bytes().splitlines()]
    assert [line["headers"]["x-session-id"] for line in lines] == ["[redacted]", "plain-session-1"]
    assert key.encode() not in trace.read_bytes()
