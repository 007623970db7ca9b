"""The official SDKs through promptcache (observe mode) against a recording fake upstream.

The upstream must receive exactly the body bytes the SDK sends when it talks to the upstream
directly, and the SDK must parse promptcache's answers exactly as the upstream's.
"""

from __future__ import annotations

import anthropic
import openai

from tests.fakes.upstream import FakeUpstream

MODEL = "claude-sonnet-4-6"
_PER_CONNECTION = {"host", "connection", "content-length"}


def _end_to_end_headers(headers) -> dict[str, str]:
    """Headers that must reach the upstream unchanged (all but per-connection ones)."""
    return {k.lower(): v for k, v in headers.items() if k.lower() not in _PER_CONNECTION}
MESSAGES = [{"role": "user", "content": "Say hello"}]


async def _anthropic_bodies(fake: FakeUpstream, base_url: str, stream: bool) -> bytes:
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-ant-test-key", max_retries=0)
    async with client:
        if stream:
            async with client.messages.stream(model=MODEL, max_tokens=64, messages=MESSAGES) as s:
                final = await s.get_final_message()
        else:
            final = await client.messages.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    assert final.content[0].text == "Hello there"
    assert final.usage.cache_read_input_tokens == 3000
    assert final.usage.cache_creation_input_tokens == 1500
    assert final.usage.output_tokens == 7
    return fake.received[-1].body


async def test_anthropic_sdk_bytes_unchanged(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, mode="observe")
    for stream in (False, True):
        direct = await _anthropic_bodies(fake_upstream, fake_upstream.url, stream)
        direct_headers = _end_to_end_headers(fake_upstream.received[-1].headers)
        through = await _anthropic_bodies(fake_upstream, proxy.url, stream)
        assert through == direct
        assert _end_to_end_headers(fake_upstream.received[-1].headers) == direct_headers
        assert direct_headers["authorization"] == "Bearer sk-ant-test-key"
    assert [r.path for r in fake_upstream.received] == ["/v1/messages"] * 4


async def test_openai_sdk_chat_and_responses_bytes_unchanged(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, mode="observe")
    bodies: dict[str, list[bytes]] = {}
    headers: dict[str, list[dict[str, str]]] = {}
    for base in (fake_upstream.url, proxy.url):
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-openai-test-key", max_retries=0)
        async with client:
            chat = await client.chat.completions.create(model="gpt-5.1", messages=MESSAGES)
            assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
            assert chat.usage.prompt_tokens_details.cached_tokens == 1920
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    model="gpt-5.1", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
                )
            ]
            assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 2048
            response = await client.responses.create(model="gpt-5.1", input="Say hello")
            assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 3968
            events = [e async for e in await client.responses.create(model="gpt-5.1", input="x", stream=True)]
            assert events[-1].type == "response.completed"
        bodies[base] = [r.body for r in fake_upstream.received[-4:]]
        headers[base] = [_end_to_end_headers(r.headers) for r in fake_upstream.received[-4:]]
    assert bodies[proxy.url] == bodies[fake_upstream.url]
    assert headers[proxy.url] == headers[fake_upstream.url]
    assert headers[proxy.url][0]["authorization"] == "Bearer sk-openai-test-key"
