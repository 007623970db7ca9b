"""Forwarding behaviour of the drop-in proxy against a recording fake upstream (issue 2)."""

from __future__ import annotations

import asyncio
import gzip
import io
import logging
import socket
import zlib

import aiohttp
import anthropic
import orjson
import pytest
import yarl
from aiohttp.base_protocol import BaseProtocol
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy.handlers import read_body
from tests.fakes.upstream import ANTHROPIC_MESSAGE, FakeUpstream

BODY = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {"x-api-key": "sk-ant-secret-value-123", "anthropic-version": "2023-06-01"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_usage_reaches_metrics_with_exact_values(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    async with aiohttp.ClientSession() as http:
        for stream in (False, True):
            body = {**BODY, "stream": stream}
            async with http.post(proxy.url + "/v1/messages", json=body, headers=HEADERS) as r:
                assert r.status == 200
                await r.read()
        chat = {"model": "gpt-5.1", "messages": [{"role": "user", "content": "hi"}]}
        openai_headers = {"Authorization": "Bearer sk-openai"}
        async with http.post(proxy.url + "/v1/chat/completions", json=chat, headers=openai_headers) as r:
            await r.read()
        streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        async with http.post(proxy.url + "/openai/v1/chat/completions", json=streamed, headers=openai_headers) as r:
            await r.read()
        async with http.post(proxy.url + "/v1/responses", json={"model": "gpt-5.1", "input": "x"}) as r:
            await r.read()
        async with http.get(proxy.url + "/metrics") as r:
            text = await r.text()
    # Two Anthropic responses, each: 21 none, 1500 write (1000 5m + 500 1h), 3000 read, 7 out.
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="none") == 42
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="write") == 3000
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == 6000
    assert proxy.sample("promptcache_output_tokens_total", provider="anthropic") == 14
    # Chat twice (2048 prompt, 1920 cached, 5 out) + Responses once (4096 input, 3968 cached, 9 out).
    assert proxy.sample("promptcache_input_tokens_total", provider="openai", cache="read") == 1920 * 2 + 3968
    assert proxy.sample("promptcache_input_tokens_total", provider="openai", cache="none") == 128 * 2 + 128
    assert proxy.sample("promptcache_output_tokens_total", provider="openai") == 5 * 2 + 9
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="ok") == 2
    assert proxy.sample("promptcache_requests_total", provider="openai", outcome="ok") == 3
    assert 'promptcache_input_tokens_total{cache="read",provider="anthropic"} 6000.0' in text


async def test_upstream_down_gives_502_in_provider_shape(make_proxy) -> None:
    port = _free_port()
    proxy = await make_proxy(upstream=f"http://127.0.0.1:{port}")
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/messages", json=BODY, headers=HEADERS) as r:
            assert r.status == 502
            body = await r.json()
        async with http.post(proxy.url + "/v1/chat/completions", json={"model": "gpt-5.1", "messages": []}) as r:
            assert r.status == 502
            openai_body = await r.json()
    message = f"promptcache could not reach the upstream 127.0.0.1:{port} (ClientConnectorError)"
    assert body == {"type": "error", "error": {"type": "api_error", "message": message}}
    # `server_error` is the type OpenAI's own 5xx answers carry (the SDKs map it to APIError).
    assert openai_body == {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="upstream_error") == 1


async def test_upstream_stall_gives_504(fake_upstream: FakeUpstream, make_proxy) -> None:
    fake_upstream.mode = "stall"
    proxy = await make_proxy(upstream=fake_upstream.url, read_timeout=0.2)
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/messages", json=BODY, headers=HEADERS) as r:
            assert r.status == 504
            body = await r.json()
    assert body == {
        "type": "error",
        "error": {
            "type": "timeout_error",
            "message": f"the upstream {fake_upstream.url.removeprefix('http://')} did not answer within 0.2 s",
        },
    }


async def test_client_disconnect_closes_upstream(fake_upstream: FakeUpstream, make_proxy) -> None:
    fake_upstream.mode = "hang_stream"
    proxy = await make_proxy(upstream=fake_upstream.url)
    async with aiohttp.ClientSession() as http:
        response = await http.post(proxy.url + "/v1/messages", json={**BODY, "stream": True}, headers=HEADERS)
        first = await response.content.readuntil(b"\n\n")
        assert first.startswith(b"event: message_start")
        response.close()
    await asyncio.wait_for(fake_upstream.client_gone.wait(), timeout=5)
    assert fake_upstream.client_gone.is_set()
    # The handler's own unwinding runs on this loop: yield to it (no timed sleep).
    for _ in range(1000):
        if proxy.sample("promptcache_requests_in_flight", provider="anthropic") == 0:
            break
        await asyncio.sleep(0)
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="client_error") == 1
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="proxy_error") == 0
    # message_start already carried the usage the upstream bills: it is counted.
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == 3000
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="none") == 21


async def test_gzip_response_reaches_sdk_intact(fake_upstream: FakeUpstream, make_proxy) -> None:
    fake_upstream.mode = "gzip"
    proxy = await make_proxy(upstream=fake_upstream.url)
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(
            proxy.url + "/v1/messages", json=BODY, headers={**HEADERS, "Accept-Encoding": "gzip"}
        ) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            raw = await r.read()
    assert gzip.decompress(raw) == orjson.dumps(ANTHROPIC_MESSAGE)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-ant-x", max_retries=0)
    async with client:
        message = await client.messages.create(**BODY)
    assert message.content[0].text == "Hello there"
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == 6000


async def test_body_over_limit_gives_413(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, max_body_bytes=2048)
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 4096}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/messages", json=big, headers=HEADERS) as r:
            assert r.status == 413
            body = await r.json()
    assert body == {
        "type": "error",
        "error": {"type": "request_too_large", "message": "request body exceeds the limit of 2048 bytes"},
    }
    assert fake_upstream.received == []


async def test_other_paths_are_reverse_proxied(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.url + "/v1/models?limit=5", headers=HEADERS) as r:
            assert r.status == 200
            assert await r.json() == {"data": [{"id": "claude-sonnet-4-6", "type": "model"}], "has_more": False}
        async with http.post(proxy.url + "/anthropic/v1/messages/count_tokens", data=b'{"a":1}') as r:
            assert r.status == 404
    assert [(x.method, x.path, x.query) for x in fake_upstream.received] == [
        ("GET", "/v1/models", "limit=5"),
        ("POST", "/v1/messages/count_tokens", ""),
    ]
    assert fake_upstream.received[1].body == b'{"a":1}'


async def test_api_key_never_logged(fake_upstream: FakeUpstream, make_proxy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = await make_proxy(upstream=fake_upstream.url)
    down = await make_proxy(upstream=f"http://127.0.0.1:{_free_port()}")
    async with aiohttp.ClientSession() as http:
        for url in (proxy.url, down.url):
            async with http.post(url + "/v1/messages?key=sk-ant-secret-value-123", json=BODY, headers=HEADERS) as r:
                await r.read()
            async with http.get(url + "/v1/models", headers={"Authorization": "Bearer sk-ant-secret-value-123"}) as r:
                await r.read()
    assert len(caplog.records) >= 4
    for record in caplog.records:
        assert "sk-ant-secret-value-123" not in record.getMessage()


async def test_record_writes_a_workload_trace_without_credentials(
    fake_upstream: FakeUpstream, make_proxy, tmp_path
) -> None:
    trace = tmp_path / "trace.jsonl"
    proxy = await make_proxy(upstream=fake_upstream.url, record=trace)
    async with aiohttp.ClientSession() as http:
        for turn in range(2):
            headers = {**HEADERS, "x-claude-code-session-id": "s-1"}
            async with http.post(proxy.url + "/v1/messages", json={**BODY, "max_tokens": turn}, headers=headers) as r:
                await r.read()
    await proxy.runner.cleanup()
    lines = [orjson.loads(line) for line in trace.read_bytes().splitlines()]
    kept = {"x-claude-code-session-id": "s-1", "anthropic-version": "2023-06-01"}
    assert [(x["path"], x["headers"], x["body"]["max_tokens"]) for x in lines] == [
        ("/v1/messages", kept, 0),
        ("/v1/messages", kept, 1),
    ]
    assert lines[0]["gap"] == 0.0 and lines[1]["gap"] >= 0.0
    assert b"sk-ant-secret-value-123" not in trace.read_bytes()


async def test_a_chunked_upload_in_many_pieces_reaches_the_upstream_byte_identical(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, mode="observe")
    raw = orjson.dumps({**BODY, "messages": [{"role": "user", "content": "y" * 300_000}]})
    pieces = [raw[i : i + 7_000] for i in range(0, len(raw), 7_000)]

    async def chunked():  # one HTTP chunk per piece (no Content-Length)
        for piece in pieces:
            yield piece

    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/messages", data=chunked(), headers=HEADERS) as r:
            assert r.status == 200
            await r.read()
    assert len(pieces) == 43
    assert [x.body == raw for x in fake_upstream.received] == [True]


async def test_a_chunked_upload_over_the_limit_gives_413_and_one_at_the_limit_passes(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, mode="observe", max_body_bytes=4096)
    head = orjson.dumps({**BODY, "messages": [{"role": "user", "content": ""}]})
    at_limit = head.replace(b'"content":""', b'"content":"' + b"z" * (4096 - len(head)) + b'"')
    assert len(at_limit) == 4096

    def chunked(raw: bytes):  # no Content-Length: the limit is met while reading
        async def pieces():
            for i in range(0, len(raw), 1000):
                yield raw[i : i + 1000]

        return pieces()

    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/messages", data=chunked(at_limit + b" "), headers=HEADERS) as r:
            assert r.status == 413
            assert (await r.json())["error"]["message"] == "request body exceeds the limit of 4096 bytes"
        async with http.post(proxy.url + "/v1/messages", data=chunked(at_limit), headers=HEADERS) as r:
            assert r.status == 200
            await r.read()
    assert [x.body == at_limit for x in fake_upstream.received] == [True]


async def test_read_body_returns_a_body_that_arrived_in_one_chunk_without_a_copy() -> None:
    loop = asyncio.get_running_loop()
    protocol = BaseProtocol(loop)
    payload = StreamReader(protocol, 2**16, loop=loop)
    raw = orjson.dumps(BODY)
    payload.feed_data(raw)
    payload.feed_eof()
    request = make_mocked_request("POST", "/v1/messages", payload=payload)
    assert await read_body(request, 1 << 20) is raw


async def test_gzip_request_body_is_forwarded_inflated(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    raw = orjson.dumps(BODY)
    async with aiohttp.ClientSession() as http:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            headers = {**HEADERS, "Content-Encoding": "gzip", "Content-Type": "application/json"}
            async with http.post(proxy.url + path, data=gzip.compress(raw), headers=headers) as r:
                assert r.status in (200, 404)
                await r.read()
    assert [(x.path, "content-encoding" in x.headers) for x in fake_upstream.received] == [
        ("/v1/messages", False),
        ("/v1/messages/count_tokens", False),
    ]
    assert orjson.loads(fake_upstream.received[0].body)["messages"] == BODY["messages"]
    assert fake_upstream.received[1].body == raw


async def test_a_query_string_reaches_the_upstream_as_the_client_encoded_it(make_proxy) -> None:
    """A pipeline request's query goes upstream still percent-encoded: `%0D%0A` in it can never
    become a line break in the upstream request (a header or a second, smuggled request)."""
    lines: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines.append(head.split(b"\r\n")[0])
        length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        answer = orjson.dumps(ANTHROPIC_MESSAGE)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer))
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        proxy = await make_proxy(upstream=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        query = "beta=true%0D%0AX-Injected:%20yes%2Bno+caf%C3%A9"
        async with aiohttp.ClientSession() as http:
            url = yarl.URL(f"{proxy.url}/v1/messages?{query}", encoded=True)
            async with http.post(url, json=BODY, headers=HEADERS) as r:
                assert r.status == 200
                await r.read()
        assert lines == [f"POST /v1/messages?{query} HTTP/1.1".encode()]
    finally:
        server.close()


async def test_an_upstream_url_with_credentials_sends_them_as_basic_auth(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url.replace("http://", "http://user:pass@"))
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/messages", json=BODY, headers=HEADERS) as r:
            assert r.status == 200
            await r.read()
    assert [got.headers.get("Authorization") for got in fake_upstream.received] == ["Basic dXNlcjpwYXNz"]


async def test_a_corrupt_gzip_request_body_gets_400_in_the_provider_shape(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    """aiohttp fails the body read (`RequestPayloadError`); it was a plain-text 500."""
    proxy = await make_proxy(upstream=fake_upstream.url)
    corrupt = gzip.compress(orjson.dumps(BODY))[:10] + b"\xff" * 40  # the header, then no deflate stream
    headers = {**HEADERS, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/messages", data=corrupt, headers=headers) as r:
            assert r.status == 400
            assert await r.json() == {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "request body could not be decoded as its Content-Encoding says",
                },
            }
    assert fake_upstream.received == []


async def _post_encoded(proxy_url: str, data: bytes, encoding: str) -> tuple[int, object]:
    headers = {**HEADERS, "Content-Encoding": encoding, "Content-Type": "application/json"}
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(proxy_url + "/v1/messages", data=data, headers=headers) as r:
            return r.status, await r.json()


UNDECODABLE = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "request body could not be decoded as its Content-Encoding says",
    },
}


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    "encoding,data",
    [
        ("gzip", gzip.compress(orjson.dumps(BODY))[:-12]),  # truncated: the end of the stream is missing
        ("gzip", gzip.compress(orjson.dumps(BODY))[:-4]),  # truncated: its length trailer is missing
        ("deflate", zlib.compress(orjson.dumps(BODY))[:-6]),  # a zlib stream cut short
        ("deflate", _raw_deflate(orjson.dumps(BODY))),  # raw deflate: no zlib header
        ("deflate", zlib.compress(orjson.dumps(BODY)) + b"{}"),  # bytes after the stream's end
        ("gzip", gzip.compress(orjson.dumps(BODY)) + b"\x1f\x8b junk"),  # a second gzip member, corrupt
        ("br", orjson.dumps(BODY)),  # a coding the proxy cannot decode
    ],
    ids=["gzip-truncated", "gzip-no-trailer", "deflate-truncated", "raw-deflate", "deflate-then-bytes",
         "gzip-corrupt-member", "br"],
)
async def test_a_request_body_that_does_not_decode_whole_gets_400_and_nothing_goes_upstream(
    fake_upstream: FakeUpstream, make_proxy, encoding: str, data: bytes
) -> None:
    """Attack finding F2: aiohttp's decoder forwarded a truncated gzip body's inflated part, and
    a raw deflate body, and both got the upstream's 200 (aiohttp checks the end of the stream
    for `deflate` only)."""
    proxy = await make_proxy(upstream=fake_upstream.url)
    assert await _post_encoded(proxy.url, data, encoding) == (400, UNDECODABLE)
    assert fake_upstream.received == []


async def test_encoded_request_bodies_that_decode_whole_are_forwarded_inflated(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    """gzip (one member, two members), x-gzip and zlib deflate: the upstream gets the exact
    inflated bytes, identity-encoded; an inflated body over `max_body_bytes` is 413."""
    proxy = await make_proxy(upstream=fake_upstream.url, max_body_bytes=4096)
    raw = orjson.dumps(BODY)
    half = len(raw) // 2
    bodies = [
        ("gzip", gzip.compress(raw)),
        ("gzip", gzip.compress(raw[:half]) + gzip.compress(raw[half:])),
        ("x-gzip", gzip.compress(raw)),
        ("Deflate", zlib.compress(raw)),
    ]
    for encoding, data in bodies:
        status, _ = await _post_encoded(proxy.url, data, encoding)
        assert status == 200
    assert [(x.body, "content-encoding" in x.headers) for x in fake_upstream.received] == [(raw, False)] * 4
    padded = orjson.dumps({**BODY, "metadata": {"user_id": "x" * 5000}})
    status, answer = await _post_encoded(proxy.url, gzip.compress(padded), "gzip")
    assert (status, len(fake_upstream.received)) == (413, 4)


async def test_a_streamed_body_that_does_not_decode_gets_400_not_an_upstream_failure(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    """Attack finding (session 8): on a path outside the pipeline, the body inflated as it
    streams; when it failed to decode the upstream client reported a connection error, answered
    502 "the request to the upstream ... failed" and counted as an upstream error."""
    proxy = await make_proxy(upstream=fake_upstream.url)
    headers = {**HEADERS, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    truncated = gzip.compress(b'{"model":"claude-sonnet-4-6","messages":[]}' * 50)[:-12]
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(proxy.url + "/v1/messages/count_tokens", data=truncated, headers=headers) as r:
            assert (r.status, await r.json()) == (400, UNDECODABLE)
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="upstream_error") == 0
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="client_error") == 1



TOO_LARGE_1MIB = {
    "type": "error",
    "error": {"type": "request_too_large", "message": "request body exceeds the limit of 1048576 bytes"},
}


async def _post_through(proxy_url: str, data: object, headers: object) -> tuple[int, object]:
    """POST to `count_tokens`, a path outside the pipeline (its body streams through)."""
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(proxy_url + "/v1/messages/count_tokens", data=data, headers=headers) as r:
            return r.status, await r.json()


async def test_a_gzip_bomb_streamed_through_is_413_at_the_limit_of_its_inflated_bytes(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    """Attack finding F5: on a path outside the pipeline the body was inflated as it streamed
    with no limit: a 4 KB gzip body became 4 MiB upstream (max_body_bytes 1 MiB). Now the
    piece that would pass the limit is not sent and the client gets the 413."""
    proxy = await make_proxy(upstream=fake_upstream.url, max_body_bytes=1024 * 1024)
    bomb = gzip.compress(b'{"model":"claude-sonnet-4-6","messages":[],"x":"' + b"a" * (4 * 1024 * 1024) + b'"}')
    assert len(bomb) < 8 * 1024
    headers = {**HEADERS, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    assert await _post_through(proxy.url, bomb, headers) == (413, TOO_LARGE_1MIB)
    assert [len(x.body) for x in fake_upstream.received] == []
    assert proxy.sample("promptcache_request_body_too_large_total", provider="anthropic") == 1
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="client_error") == 1
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="upstream_error") == 0
    # at the limit it passes, inflated
    at_limit = b'{"x":"' + b"b" * (1024 * 1024 - 8) + b'"}'
    assert len(at_limit) == 1024 * 1024
    status, _ = await _post_through(proxy.url, gzip.compress(at_limit), headers)
    assert status == 404  # the fake upstream's own answer: it serves no count_tokens
    assert [(x.body == at_limit, "content-encoding" in x.headers) for x in fake_upstream.received] == [(True, False)]


async def test_an_identity_body_streamed_through_is_not_bounded(fake_upstream: FakeUpstream, make_proxy) -> None:
    """A body outside the pipeline that is not compressed streams as received whatever its
    size, with or without its length (a file upload: the Files APIs take hundreds of MB, and
    nothing is held here): only what inflating makes is bounded by `max_body_bytes`."""
    proxy = await make_proxy(upstream=fake_upstream.url, max_body_bytes=1024 * 1024)
    over = b'{"x":"' + b"c" * (1024 * 1024) + b'"}'

    async def chunked():  # no Content-Length
        for i in range(0, len(over), 64 * 1024):
            yield over[i : i + 64 * 1024]

    assert (await _post_through(proxy.url, io.BytesIO(over), HEADERS))[0] == 404  # the fake upstream's answer
    assert (await _post_through(proxy.url, chunked(), HEADERS))[0] == 404
    assert [x.body == over for x in fake_upstream.received] == [True, True]
    assert proxy.sample("promptcache_request_body_too_large_total", provider="anthropic") == 0


async def test_a_gzip_body_with_trailing_zero_padding_decodes(fake_upstream: FakeUpstream, make_proxy) -> None:
    """Attack finding F6: zero bytes after a gzip member's trailer (padding `gzip -d` and Python's
    `gzip` skip) were a 400; now they are skipped, in the pipeline and on a pass-through path.
    A non-zero byte after the padding still has to start a member."""
    proxy = await make_proxy(upstream=fake_upstream.url)
    raw = orjson.dumps(BODY)
    padded = gzip.compress(raw) + b"\x00" * 512
    assert gzip.decompress(padded) == raw
    assert await _post_encoded(proxy.url, padded, "gzip") == (200, ANTHROPIC_MESSAGE)
    headers = {**HEADERS, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    status, _ = await _post_through(proxy.url, padded, headers)
    assert status == 404  # the fake upstream's own answer: it serves no count_tokens
    assert [(x.body, "content-encoding" in x.headers) for x in fake_upstream.received] == [(raw, False)] * 2
    assert await _post_encoded(proxy.url, padded + b"junk", "gzip") == (400, UNDECODABLE)
    assert len(fake_upstream.received) == 2


STACKED = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "request body has 2 content codings (gzip, gzip); promptcache decodes one (gzip or deflate)",
    },
}


async def test_stacked_content_codings_get_a_400_that_names_them(fake_upstream: FakeUpstream, make_proxy) -> None:
    """F6: `gzip, gzip` (or two `Content-Encoding` lines, one list by RFC 9110 5.3) got the
    generic "could not be decoded" 400, and two lines were read as their first only. The
    pipeline now names the codings; a pass-through path forwards them as sent, in one line."""
    proxy = await make_proxy(upstream=fake_upstream.url)
    twice = gzip.compress(gzip.compress(orjson.dumps(BODY)))
    assert await _post_encoded(proxy.url, twice, "gzip, gzip") == (400, STACKED)
    assert await _post_encoded(proxy.url, twice, "gzip, identity, GZIP") == (400, STACKED)
    lines = CIMultiDict([*HEADERS.items(), ("Content-Type", "application/json")])
    lines.add("Content-Encoding", "gzip")
    lines.add("Content-Encoding", "gzip")
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(proxy.url + "/v1/messages", data=twice, headers=lines) as r:
            assert (r.status, await r.json()) == (400, STACKED)
    assert fake_upstream.received == []
    async with aiohttp.ClientSession(auto_decompress=False) as http:  # (the fake cannot read it: its 500)
        async with http.post(proxy.url + "/v1/messages/count_tokens", data=twice, headers=lines) as r:
            await r.read()
    assert [(x.body, x.headers.getall("content-encoding")) for x in fake_upstream.received] == [(twice, ["gzip, gzip"])]
