"""Vertex AI and strict-compatible upstreams: the official SDK through promptcache, forwarded
bodies on the recording fake, read shares and rejections on the simulator."""

from __future__ import annotations

import aiohttp
import anthropic
import orjson

from tests.fakes.upstream import FakeUpstream
from tests.platforms.conftest import SYSTEM

MODEL = "claude-sonnet-4-6"
VERTEX_PATH = f"/v1/projects/proj-1/locations/us-east5/publishers/anthropic/models/{MODEL}:rawPredict"
SCOPE_BETA = "prompt-caching-scope-2026-01-05"
KEPT_BETA = "fine-grained-tool-streaming-2025-05-14"


def _vertex(url: str) -> anthropic.AsyncAnthropicVertex:
    return anthropic.AsyncAnthropicVertex(
        region="us-east5", project_id="proj-1", access_token="ya29.test-token", base_url=url + "/v1", max_retries=0
    )


def _system(marker: dict) -> list[dict]:
    return [{"type": "text", "text": SYSTEM, "cache_control": marker}]


def _markers(value) -> list[dict]:
    found = []
    if isinstance(value, dict):
        if isinstance(value.get("cache_control"), dict):
            found.append(value["cache_control"])
        for item in value.values():
            found.extend(_markers(item))
    elif isinstance(value, list):
        for item in value:
            found.extend(_markers(item))
    return found


async def test_vertex_sdk_path_body_and_betas_on_the_fake(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    async with _vertex(proxy.url) as client:
        message = await client.messages.create(
            model=MODEL,
            max_tokens=32,
            system=_system({"type": "ephemeral", "scope": "global"}),
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"anthropic-beta": f"{SCOPE_BETA},{KEPT_BETA}"},
        )
    assert message.usage.cache_read_input_tokens == 3000
    received = fake_upstream.received[-1]
    assert received.path == VERTEX_PATH
    assert received.headers["authorization"] == "Bearer ya29.test-token"
    assert received.headers.getall("anthropic-beta") == [KEPT_BETA]
    body = orjson.loads(received.body)
    assert "model" not in body and body["anthropic_version"] == anthropic._constants.ANTHROPIC_API_VERSION
    markers = _markers(body)
    assert 1 <= len(markers) <= 4 and all("scope" not in m for m in markers)
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    # usage teed from the platform path
    assert proxy.sample("promptcache_input_tokens_total", provider="anthropic", cache="read") == 3000


async def test_vertex_stream_path_and_local_errors_in_google_shape(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    async with _vertex(proxy.url) as client:
        async with client.messages.stream(
            model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "hello"}]
        ) as stream:
            final = await stream.get_final_message()
    assert final.content[0].text == "Hello there"
    assert fake_upstream.received[-1].path == VERTEX_PATH.replace(":rawPredict", ":streamRawPredict")
    await fake_upstream.stop()  # nothing listens: promptcache answers 502 itself
    async with aiohttp.ClientSession() as http:
        async with http.post(
            proxy.url + VERTEX_PATH, json={"anthropic_version": "vertex-2023-10-16", "max_tokens": 1, "messages": []}
        ) as resp:
            assert resp.status == 502
            error = await resp.json()
    assert error["error"]["code"] == 502 and error["error"]["status"] == "UNAVAILABLE"


async def test_simulated_vertex_rejects_scope_and_its_beta(make_sim) -> None:
    sim = await make_sim()
    body = {
        "anthropic_version": "vertex-2023-10-16",
        "max_tokens": 8,
        "system": _system({"type": "ephemeral", "scope": "global"}),
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {"authorization": "Bearer t"}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim + VERTEX_PATH, json=body, headers=headers) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"] == (
                "system.0.cache_control.ephemeral.scope: Extra inputs are not permitted"
            )
        plain = {**body, "system": SYSTEM}
        async with http.post(sim + VERTEX_PATH, json=plain, headers={**headers, "anthropic-beta": SCOPE_BETA}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"] == (
                f"Unexpected value(s) `{SCOPE_BETA}` for the `anthropic-beta` header. Please consult our "
                "documentation at docs.anthropic.com or try again without the header."
            )
        async with http.post(sim + VERTEX_PATH, json={**plain, "model": MODEL}, headers=headers) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"] == "model: Extra inputs are not permitted"


async def _turns(client, n: int, **extra) -> list:
    messages: list[dict] = [{"role": "user", "content": "hello"}]
    usages = []
    for turn in range(n):
        reply = await client.messages.create(model=MODEL, max_tokens=32, messages=messages, **extra)
        usages.append(reply.usage)
        messages = [
            *messages,
            {"role": "assistant", "content": reply.content},
            {"role": "user", "content": f"next {turn}"},
        ]
    return usages


async def test_vertex_sdk_reads_its_prefix_on_the_simulator(make_sim, make_proxy) -> None:
    sim = await make_sim()
    proxy = await make_proxy(upstream=sim)
    async with _vertex(proxy.url) as client:
        usages = await _turns(
            client,
            3,
            system=_system({"type": "ephemeral", "scope": "global"}),
            extra_headers={"anthropic-beta": SCOPE_BETA},
        )
    assert [u.cache_read_input_tokens for u in usages] == [0, 5104, 5124]
    assert [u.cache_creation_input_tokens for u in usages] == [5104, 20, 20]
    # straight to the simulated platform, the same client fails: the proxy made the difference
    async with _vertex(sim) as client:
        try:
            await _turns(client, 1, system=_system({"type": "ephemeral", "scope": "global"}))
        except anthropic.BadRequestError as exc:
            assert "ephemeral.scope: Extra inputs are not permitted" in str(exc)
        else:
            raise AssertionError("the simulated Vertex accepted scope")


async def test_strict_compatible_upstream_gets_no_ttl_and_still_reads(make_sim, make_proxy) -> None:
    sim = await make_sim("strict-compatible")
    proxy = await make_proxy(upstream=sim, anthropic_profile="strict-compatible")
    system = _system({"type": "ephemeral", "ttl": "1h"})
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-strict", max_retries=0) as client:
        usages = await _turns(client, 2, system=system)
    assert [u.cache_read_input_tokens for u in usages] == [0, 5104]
    async with anthropic.AsyncAnthropic(base_url=sim, api_key="sk-strict", max_retries=0) as client:
        try:
            await _turns(client, 1, system=system)
        except anthropic.BadRequestError as exc:
            assert "`cache_control.ttl: 1h` is not supported" in str(exc)
        else:
            raise AssertionError("the strict simulator accepted ttl")


async def test_old_capability_flags_still_strip_on_the_direct_profile(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, anthropic_capabilities="strip_ttl")
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-x", max_retries=0) as client:
        await client.messages.create(
            model=MODEL,
            max_tokens=8,
            system=_system({"type": "ephemeral", "ttl": "1h", "scope": "global"}),
            messages=[{"role": "user", "content": "hi"}],
        )
    markers = _markers(orjson.loads(fake_upstream.received[-1].body))
    assert markers and all("ttl" not in m for m in markers)
    assert markers[0] == {"type": "ephemeral", "scope": "global"}


async def test_foundry_sdk_gets_no_scope_and_no_scope_beta(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, anthropic_profile="foundry")
    client = anthropic.AsyncAnthropicFoundry(api_key="foundry-key", base_url=proxy.url + "/anthropic/", max_retries=0)
    async with client:
        await client.messages.create(
            model=MODEL,
            max_tokens=8,
            system=_system({"type": "ephemeral", "ttl": "1h", "scope": "global"}),
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"anthropic-beta": SCOPE_BETA},
        )
    received = fake_upstream.received[-1]
    assert received.path == "/v1/messages"
    assert "anthropic-beta" not in received.headers
    assert orjson.loads(received.body)["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


async def test_cache_diagnostics_setting_asks_nothing_of_vertex(make_sim, make_proxy) -> None:
    sim = await make_sim()
    proxy = await make_proxy(upstream=sim, cache_diagnostics=True)
    async with _vertex(proxy.url) as client:
        usages = await _turns(client, 2, system=SYSTEM)
    assert usages[1].cache_read_input_tokens == usages[0].cache_creation_input_tokens > 0
    body = {"anthropic_version": "vertex-2023-10-16", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    body["diagnostics"] = {"previous_message_id": None}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim + VERTEX_PATH, json=body, headers={"authorization": "Bearer t"}) as resp:
            assert (resp.status, (await resp.json())["error"]["message"]) == (
                400,
                "diagnostics: Extra inputs are not permitted",
            )
