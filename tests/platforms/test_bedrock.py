"""Bedrock InvokeModel: `AnthropicBedrock` with an API key (optimised) and with SigV4
(byte-identical, measured only), the event-stream usage tee, the simulator's rejections."""

from __future__ import annotations

import gzip
import logging

import aiohttp
import anthropic
import httpx2
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.eventstream import EventStreamDecoder, bedrock_chunk
from proxy.sim.eventstream import chunk_event, encode_message
from tests.fakes.upstream import ANTHROPIC_USAGE, FakeUpstream
from tests.platforms.conftest import SYSTEM

MODEL_ID = "us.anthropic.claude-sonnet-4-6-v1:0"
SCOPED = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "scope": "global"}}]
SCOPE_BETA = "prompt-caching-scope-2026-01-05"


def _bedrock(url: str, **auth) -> anthropic.AsyncAnthropicBedrock:
    return anthropic.AsyncAnthropicBedrock(aws_region="us-east-1", base_url=url, max_retries=0, **auth)


# --- event-stream framing ------------------------------------------------------------------

EVENTS = [{"type": "message_start", "message": {"usage": {"input_tokens": 3}}}, {"type": "message_stop"}]


@given(st.lists(st.integers(min_value=1, max_value=40), max_size=30))
def test_decoder_gives_the_same_messages_however_the_bytes_are_cut(cuts: list[int]) -> None:
    stream = b"".join(chunk_event(e) for e in EVENTS) + encode_message(
        {":message-type": "event", ":event-type": "metadata"}, b"{}"
    )
    decoder, messages, at = EventStreamDecoder(), [], 0
    for size in cuts:
        messages += decoder.decode(stream[at : at + size])
        at += size
    messages += decoder.decode(stream[at:])
    assert [bedrock_chunk(m) for m in messages] == [*EVENTS, None]
    assert messages[2].headers == {":message-type": "event", ":event-type": "metadata"}


def test_decoder_refuses_a_corrupted_message() -> None:
    frame = bytearray(chunk_event(EVENTS[0]))
    frame[-5] ^= 1
    with pytest.raises(ValueError, match="message CRC mismatch"):
        EventStreamDecoder().decode(bytes(frame))
    frame = bytearray(chunk_event(EVENTS[0]))
    frame[1] ^= 1
    with pytest.raises(ValueError, match="prelude CRC mismatch"):
        EventStreamDecoder().decode(bytes(frame))


# --- through promptcache ----------------------------------------------------------------------


async def _turns(client, n: int, stream: bool) -> list:
    messages: list[dict] = [{"role": "user", "content": "hello"}]
    usages = []
    for turn in range(n):
        kwargs = {"model": MODEL_ID, "max_tokens": 32, "system": SCOPED, "messages": messages}
        kwargs["extra_headers"] = {"anthropic-beta": SCOPE_BETA}
        if stream:
            async with client.messages.stream(**kwargs) as s:
                reply = await s.get_final_message()
        else:
            reply = await client.messages.create(**kwargs)
        usages.append(reply.usage)
        messages = [*messages, {"role": "assistant", "content": reply.content}, {"role": "user", "content": f"n{turn}"}]
    return usages


@pytest.mark.parametrize("stream", [False, True])
async def test_api_key_requests_are_optimised_and_read_on_the_simulator(make_sim, make_proxy, stream: bool) -> None:
    sim = await make_sim()
    proxy = await make_proxy(upstream=sim)
    async with _bedrock(proxy.url, api_key="bedrock-api-key") as client:
        usages = await _turns(client, 3, stream)
    reads = [u.cache_read_input_tokens for u in usages]
    writes = [u.cache_creation_input_tokens for u in usages]
    # each turn reads everything the turns before it wrote: the system prompt, then the tail
    assert writes[0] == 5104 and reads == [0, writes[0], writes[0] + writes[1]]
    # the usage tee read the event-stream (or JSON) answers
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == sum(reads)
    assert proxy.sample("promptcache_signed_requests_total", provider="anthropic") == 0


async def test_api_key_body_on_the_fake_has_no_scope_and_no_rejected_beta(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    async with _bedrock(proxy.url, api_key="bedrock-api-key") as client:
        async with client.messages.stream(
            model=MODEL_ID,
            max_tokens=8,
            system=SCOPED,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"anthropic-beta": f"{SCOPE_BETA},context-1m-2025-08-07"},
        ) as s:
            final = await s.get_final_message()
    assert final.content[0].text == "Hello there"
    received = fake_upstream.received[-1]
    assert received.path == f"/model/{MODEL_ID}/invoke-with-response-stream"
    body = orjson.loads(received.body)
    assert body["anthropic_beta"] == ["context-1m-2025-08-07"]
    assert received.headers.getall("anthropic-beta") == ["context-1m-2025-08-07"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert (
        proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read")
        == (ANTHROPIC_USAGE["cache_read_input_tokens"])
    )


async def test_sigv4_requests_are_forwarded_byte_identical_and_measured(
    fake_upstream: FakeUpstream, make_proxy, caplog
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    sent: list[bytes] = []

    async def keep(request: httpx2.Request) -> None:
        sent.append(await request.aread())

    creds = {"aws_access_key": "AKIDEXAMPLE", "aws_secret_key": "secret-example"}
    http = httpx2.AsyncClient(event_hooks={"request": [keep]})
    caplog.set_level(logging.INFO, logger="promptcache.access")
    async with _bedrock(proxy.url, http_client=http, **creds) as client:
        reply = await client.messages.create(
            model=MODEL_ID, max_tokens=8, system=SCOPED, messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.usage.cache_read_input_tokens == 3000
    received = fake_upstream.received[-1]
    assert received.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert received.body == sent[-1]  # byte-identical: the signature covers it
    assert orjson.loads(received.body)["system"][0]["cache_control"]["scope"] == "global"
    assert proxy.sample("promptcache_signed_requests_total", provider="anthropic") == 1
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == 3000
    assert any("signed request (AWS4-HMAC-SHA256 covers the body)" in r.getMessage() for r in caplog.records)


async def test_simulated_bedrock_rejections(make_sim) -> None:
    sim = await make_sim()
    base = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": "Bearer k"}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim + f"/model/{MODEL_ID}/invoke", json={**base, "system": SCOPED}, headers=headers) as r:
            assert (r.status, await r.json()) == (
                400,
                {"message": "system.0.cache_control.ephemeral.scope: Extra inputs are not permitted"},
            )
            assert r.headers["x-amzn-ErrorType"] == "ValidationException"
        old = "anthropic.claude-3-opus-20240229-v1:0"
        marked = [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]
        async with http.post(sim + f"/model/{old}/invoke", json={**base, "system": marked}, headers=headers) as r:
            assert (r.status, await r.json()) == (
                403,
                {"message": "You invoked an unsupported model or your request did not allow prompt caching."},
            )
            assert r.headers["x-amzn-ErrorType"] == "AccessDeniedException"
        async with http.post(
            sim + f"/model/{MODEL_ID}/invoke", json={**base, "anthropic_beta": [SCOPE_BETA]}, headers=headers
        ) as r:
            assert (r.status, await r.json()) == (400, {"message": "invalid beta flag"})
        async with http.post(
            sim + f"/model/{MODEL_ID}/invoke",
            json={k: v for k, v in base.items() if k != "anthropic_version"},
            headers=headers,
        ) as r:
            assert (r.status, await r.json()) == (400, {"message": "anthropic_version: Field required"})


async def test_a_sigv4_request_with_a_gzip_body_goes_upstream_as_received(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    """Attack finding (session 8): the gzip body of a signed request went upstream inflated and
    without its `Content-Encoding`, so the signature (over the bytes sent) no longer matched."""
    proxy = await make_proxy(upstream=fake_upstream.url)
    body = orjson.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 8, "messages": [
        {"role": "user", "content": "hi"}]})
    wire = gzip.compress(body, mtime=0)
    headers = {
        "Authorization": "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261202/us-east-1/bedrock/aws4_request, "
        "SignedHeaders=content-encoding;host;x-amz-date, Signature=" + "0" * 64,
        "X-Amz-Date": "20261202T080000Z",
        "Content-Encoding": "gzip",
        "Content-Type": "application/json",
    }
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(f"{proxy.url}/model/{MODEL_ID}/invoke", data=wire, headers=headers) as r:
            assert r.status == 200
    received = fake_upstream.received[-1]
    assert (received.body, received.headers["content-encoding"]) == (wire, "gzip")
    assert proxy.sample("promptcache_signed_requests_total", provider="anthropic") == 1
