"""Bedrock Converse: `cachePoint` placement (pure), boto3's `bedrock-runtime` client through
promptcache (bearer: optimised; SigV4: byte-identical), usage from JSON and event-stream, and
the simulator's checkpoint rules."""

from __future__ import annotations

import asyncio
import copy

import aiohttp
import boto3
import orjson
import pytest
from botocore.config import Config
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.providers.converse_request import MAX_POINTS, is_point, place_cache_points
from tests.fakes.upstream import CONVERSE_RESPONSE
from tests.platforms.conftest import SYSTEM

MODEL_ID = "us.anthropic.claude-sonnet-4-6-v1:0"
POINT = {"cachePoint": {"type": "default"}}


def _body(turns: int) -> dict:
    messages = [{"role": "user", "content": [{"text": "list the files"}]}]
    for i in range(turns):
        messages.append(
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": f"t{i}", "name": "ls", "input": {}}}]}
        )
        result = {"toolResult": {"toolUseId": f"t{i}", "content": [{"text": f"file_{i}.py " * 50}]}}
        messages.append({"role": "user", "content": [result]})
    tools = [{"toolSpec": {"name": "ls", "description": "list", "inputSchema": {"json": {"type": "object"}}}}]
    return {"system": [{"text": SYSTEM}], "messages": messages, "toolConfig": {"tools": tools}}


def _points(body: dict) -> list[tuple[str, ...]]:
    found = []
    for t, tool in enumerate(body["toolConfig"]["tools"]):
        if is_point(tool):
            found.append(("tools", t))
    for s, block in enumerate(body["system"]):
        if is_point(block):
            found.append(("system", s))
    for m, message in enumerate(body["messages"]):
        for c, block in enumerate(message["content"]):
            if is_point(block):
                found.append(("messages", m, c))
            inner = block.get("toolResult", {}).get("content", [])
            assert not any(is_point(p) for p in inner), "a cachePoint inside toolResult.content"
    return found


def test_points_after_system_and_the_newest_block_sibling_after_tool_result() -> None:
    body = _body(2)
    placed = place_cache_points(body, 1024, keep_ttl=True)
    assert _points(placed) == [("system", 1), ("messages", 4, 1)]
    assert placed["messages"][4]["content"][0]["toolResult"]["toolUseId"] == "t1"
    assert body == _body(2)  # caller input untouched
    assert place_cache_points(placed, 1024, keep_ttl=True) == placed  # idempotent


def test_client_points_nested_leading_over_budget_and_ttl() -> None:
    body = _body(3)
    result = body["messages"][2]["content"][0]["toolResult"]
    result["content"].append({"cachePoint": {"type": "default", "ttl": "1h"}})  # nested: hoisted
    body["messages"][0]["content"].insert(0, POINT)  # leading: marks nothing, dropped
    for m in (2, 4):
        body["messages"][m]["content"].append(copy.deepcopy(POINT))
    body["toolConfig"]["tools"].append(copy.deepcopy(POINT))
    placed = place_cache_points(body, 1024, keep_ttl=False)
    points = _points(placed)
    assert len(points) == MAX_POINTS
    assert points[-1] == ("messages", 6, 1)  # the newest message's checkpoint is kept
    assert placed["messages"][0]["content"] == [{"text": "list the files"}]
    assert all("ttl" not in block["cachePoint"] for block in placed["messages"][2]["content"] if is_point(block))


def test_below_the_minimum_nothing_is_added() -> None:
    body = {"system": [{"text": "short"}], "messages": [{"role": "user", "content": [{"text": "hi"}]}]}
    assert place_cache_points(body, 1024, keep_ttl=True) is body


blocks = st.one_of(
    st.builds(lambda t: {"text": t}, st.text(min_size=1, max_size=400)),
    st.just(POINT),
    st.builds(lambda t: {"toolResult": {"toolUseId": "x", "content": [{"text": t}, POINT]}}, st.text(max_size=50)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(blocks, min_size=1, max_size=6), min_size=1, max_size=6), st.integers(0, 600))
def test_properties_bounded_idempotent_content_kept(contents: list, min_tokens: int) -> None:
    body = {"system": [{"text": "s" * 900}], "messages": [{"role": "user", "content": c} for c in contents]}
    before = copy.deepcopy(body)
    placed = place_cache_points(body, min_tokens, keep_ttl=True)
    assert body == before
    assert place_cache_points(placed, min_tokens, keep_ttl=True) == placed
    total = sum(1 for b in placed["system"] if is_point(b)) + sum(
        1 for m in placed["messages"] for b in m["content"] if is_point(b)
    )
    assert total <= MAX_POINTS

    def content(b: dict) -> list:
        return [
            {"toolResult": {**x["toolResult"], "content": [p for p in x["toolResult"]["content"] if not is_point(p)]}}
            if "toolResult" in x
            else x
            for x in b
            if not is_point(x)
        ]

    assert [content(m["content"]) for m in placed["messages"]] == [content(m["content"]) for m in before["messages"]]


# --- boto3 through promptcache ----------------------------------------------------------------


def _client(url: str, monkeypatch: pytest.MonkeyPatch, token: str | None):
    if token is not None:
        monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", token)
    else:
        monkeypatch.delenv("AWS_BEARER_TOKEN_BEDROCK", raising=False)
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret-example",
        config=Config(retries={"max_attempts": 1}),
    )


async def _bearer_turns(url: str, n: int, stream: bool) -> list[dict]:
    """Converse over plain HTTP with a Bedrock API key (botocore sends bearer tokens over HTTPS
    only, so this client is aiohttp; the event-stream answers are decoded by botocore's own
    parser, independent of promptcache's)."""
    from botocore.eventstream import EventStreamBuffer

    body = _body(0)
    messages = body["messages"]
    usages = []
    path = "converse-stream" if stream else "converse"
    async with aiohttp.ClientSession(headers={"authorization": "Bearer bedrock-api-key"}) as http:
        for turn in range(n):
            request = {"system": body["system"], "messages": messages, "toolConfig": body["toolConfig"]}
            async with http.post(f"{url}/model/{MODEL_ID}/{path}", json=request) as resp:
                assert resp.status == 200, await resp.text()
                raw = await resp.read()
            if stream:
                buffer = EventStreamBuffer()
                buffer.add_data(raw)
                events = {m.headers[":event-type"]: orjson.loads(m.payload) for m in buffer}
                usage, text = events["metadata"]["usage"], events["contentBlockDelta"]["delta"]["text"]
            else:
                answer = orjson.loads(raw)
                usage, text = answer["usage"], answer["output"]["message"]["content"][0]["text"]
            usages.append(usage)
            messages = [
                *messages,
                {"role": "assistant", "content": [{"text": text}]},
                {"role": "user", "content": [{"text": f"n{turn}"}]},
            ]
    return usages


@pytest.mark.parametrize("stream", [False, True])
async def test_bearer_converse_is_optimised_and_reads(make_sim, make_proxy, stream: bool) -> None:
    sim = await make_sim()
    proxy = await make_proxy(upstream=sim)
    usages = await _bearer_turns(proxy.url, 3, stream)
    reads = [u["cacheReadInputTokens"] for u in usages]
    writes = [u["cacheWriteInputTokens"] for u in usages]
    assert writes[0] > 5000 and reads == [0, writes[0], writes[0] + writes[1]]
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == sum(reads)
    assert proxy.sample("promptcache_signed_requests_total", provider="anthropic") == 0
    direct = await _bearer_turns(sim, 2, stream)  # the same client without promptcache: no checkpoints
    assert [u["cacheReadInputTokens"] for u in direct] == [0, 0]


async def test_boto3_sigv4_converse_through_promptcache_to_the_simulator(make_sim, make_proxy, monkeypatch) -> None:
    sim = await make_sim()
    proxy = await make_proxy(upstream=sim)
    client = _client(proxy.url, monkeypatch, None)
    body = _body(0)
    body["system"].append(POINT)  # the client's own checkpoint: kept as it is
    answers = []
    for _ in range(2):
        answers.append(await asyncio.to_thread(client.converse, modelId=MODEL_ID, **body))
    assert [a["usage"]["cacheReadInputTokens"] for a in answers] == [0, answers[0]["usage"]["cacheWriteInputTokens"]]
    assert proxy.sample("promptcache_signed_requests_total", provider="anthropic") == 2


async def test_boto3_sigv4_converse_is_byte_identical(make_sim, make_proxy, fake_upstream, monkeypatch) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    client = _client(proxy.url, monkeypatch, None)
    sent: list[bytes] = []
    client.meta.events.register("before-send.bedrock-runtime.Converse", lambda request, **_: sent.append(request.body))
    body = _body(1)
    answer = await asyncio.to_thread(client.converse, modelId=MODEL_ID, **body)
    assert answer["usage"]["cacheReadInputTokens"] == CONVERSE_RESPONSE["usage"]["cacheReadInputTokens"]
    received = fake_upstream.received[-1]
    assert received.path == f"/model/{MODEL_ID}/converse"
    assert received.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert received.body == sent[-1]
    assert b"cachePoint" not in received.body
    assert proxy.sample("promptcache_signed_requests_total", provider="anthropic") == 1
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == 3000


async def test_simulated_converse_checkpoint_rules(make_sim) -> None:
    sim = await make_sim()
    url = sim + f"/model/{MODEL_ID}/converse"
    headers = {"authorization": "Bearer k"}
    cases = [
        (
            {"messages": [{"role": "user", "content": [{"text": "a"}, *[POINT] * 5]}]},
            400,
            "The number of cache points in the request (5) exceeded the maximum of 4.",
        ),
        (
            {"messages": [{"role": "user", "content": [POINT]}]},
            400,
            "messages.0.content: a message cannot contain only a cachePoint",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"toolResult": {"toolUseId": "x", "content": [{"text": "r"}, POINT]}}]}
                ]
            },
            400,
            "messages.0.content.0.toolResult.content.1: cachePoint is not supported inside toolResult content",
        ),
    ]
    async with aiohttp.ClientSession() as http:
        for body, status, message in cases:
            async with http.post(url, json=body, headers=headers) as resp:
                assert (resp.status, await resp.json()) == (status, {"message": message})
        old = sim + "/model/anthropic.claude-3-opus-20240229-v1:0/converse"
        body = {"messages": [{"role": "user", "content": [{"text": "a"}, POINT]}]}
        async with http.post(old, json=body, headers=headers) as resp:
            assert resp.status == 403
            assert (await resp.json())["message"] == (
                "You invoked an unsupported model or your request did not allow prompt caching."
            )
