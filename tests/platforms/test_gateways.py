"""OpenAI-wire gateways serving Claude (LiteLLM, OpenRouter), Azure OpenAI paths, and the usage
variants of OpenAI-compatible upstreams (DeepSeek, Kimi, LiteLLM, OpenRouter)."""

from __future__ import annotations

import openai
import orjson
import pytest

from proxy.providers.openai import ChatUsage
from tests.fakes.upstream import FakeUpstream
from tests.platforms.conftest import SYSTEM

CLAUDE = "anthropic/claude-sonnet-4-6"


def _chat_markers(body: dict) -> list[tuple[int, str, dict]]:
    """`(message index, role, marker)` of every `cache_control` on a Chat content part."""
    found = []
    for m, message in enumerate(body["messages"]):
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and "cache_control" in part:
                    found.append((m, message["role"], part["cache_control"]))
    return found


def _conversation(tool_turns: int) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "list the files"}]
    for i in range(tool_turns):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"file_{i}.py " * 200})
    return messages


@pytest.mark.parametrize("profile", ["litellm", "openrouter"])
async def test_claude_behind_a_gateway_gets_cache_control_on_parts_never_on_tool_messages(
    fake_upstream: FakeUpstream, make_proxy, profile: str
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, openai_profile=profile)
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-gateway", max_retries=0)
    async with client:
        for session in ("sess-a", "sess-b", "sess-a"):
            await client.chat.completions.create(
                model=CLAUDE, messages=_conversation(6), extra_headers={"x-session-id": session}
            )
    hints = [orjson.loads(r.body).get("session_id") for r in fake_upstream.received]
    body = orjson.loads(fake_upstream.received[-1].body)
    markers = _chat_markers(body)
    # the string system prompt became one text part carrying the first marker
    assert body["messages"][0]["content"][0]["text"] == SYSTEM
    # (its TTL follows pacing: 1h once the entry it marks lives and is read again, proxy.pacing)
    assert markers[0][:2] == (0, "system") and markers[0][2]["type"] == "ephemeral"
    assert 1 <= len(markers) <= 4
    assert all(role != "tool" for _, role, _ in markers)
    assert "prompt_cache_breakpoint" not in fake_upstream.received[-1].body.decode()
    if profile == "openrouter":
        # the promptcache session (a keyed hash, never the client's raw id): one per conversation
        assert hints[0] == hints[2] != hints[1] and all(isinstance(h, str) and len(h) <= 256 for h in hints)
        assert "sess-a" not in hints
    else:
        assert hints == [None, None, None]


async def test_gpt_models_behind_a_gateway_get_no_cache_control(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, openai_profile="litellm")
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-gateway", max_retries=0)
    async with client:
        await client.chat.completions.create(model="gpt-5.1", messages=_conversation(1))
    assert b"cache_control" not in fake_upstream.received[-1].body


async def test_direct_profile_gives_claude_names_no_markers(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-direct", max_retries=0)
    async with client:
        await client.chat.completions.create(model=CLAUDE, messages=_conversation(1))
    assert b"cache_control" not in fake_upstream.received[-1].body


async def test_azure_deployment_path_is_optimised_in_place(fake_upstream: FakeUpstream, make_proxy) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, openai_profile="azure")
    client = openai.AsyncAzureOpenAI(
        azure_endpoint=proxy.url, api_key="azure-key", api_version="2025-04-01-preview", max_retries=0
    )
    async with client:
        chat = await client.chat.completions.create(model="gpt5-deployment", messages=_conversation(0))
    assert chat.usage is not None and chat.usage.prompt_tokens_details.cached_tokens == 1920
    received = fake_upstream.received[-1]
    assert (received.path, received.query) == (
        "/openai/deployments/gpt5-deployment/chat/completions",
        "api-version=2025-04-01-preview",
    )
    assert received.headers["api-key"] == "azure-key"
    assert proxy.sample("promptcache_input_tokens_total", provider="openai", cache="read") == 1920


def _chat_usage(usage: dict) -> tuple[int, int, int, float | None]:
    reader = ChatUsage()
    reader.feed_json({"id": "x", "usage": usage})
    result = reader.result()
    return result.input_none, result.cache_read, result.cache_write, result.cache_discount


def test_usage_variants_never_double_count() -> None:
    # DeepSeek: hit + miss = prompt_tokens; newer answers also carry cached_tokens = hit
    deepseek = {"prompt_tokens": 1000, "prompt_cache_hit_tokens": 768, "prompt_cache_miss_tokens": 232}
    assert _chat_usage(deepseek) == (232, 768, 0, None)
    both = {**deepseek, "prompt_tokens_details": {"cached_tokens": 768}}
    assert _chat_usage(both) == (232, 768, 0, None)
    assert _chat_usage({"prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36}) == (36, 64, 0, None)
    # Kimi: top-level cached_tokens
    assert _chat_usage({"prompt_tokens": 500, "cached_tokens": 384}) == (116, 384, 0, None)
    # LiteLLM serving Claude: Anthropic's creation count, inside prompt_tokens
    litellm = {
        "prompt_tokens": 6000,
        "prompt_tokens_details": {"cached_tokens": 5000},
        "cache_creation_input_tokens": 900,
        "cache_read_input_tokens": 5000,
    }
    assert _chat_usage(litellm) == (100, 5000, 900, None)
    # OpenRouter: cache_write_tokens and the cache_discount figure
    openrouter = {
        "prompt_tokens": 3000,
        "prompt_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 512},
        "cache_discount": 0.0123,
    }
    assert _chat_usage(openrouter) == (440, 2048, 512, 0.0123)


async def test_litellm_claude_reads_its_prefix_on_the_simulated_gateway(make_sim, make_proxy) -> None:
    sim = await make_sim(openai_platform="litellm")
    proxy = await make_proxy(upstream=sim, openai_profile="litellm")
    messages = _conversation(2)
    usages = []
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-gw", max_retries=0) as client:
        for turn in range(3):
            chat = await client.chat.completions.create(model=CLAUDE, messages=messages)
            usages.append(chat.usage.model_dump())
            messages = [
                *messages,
                {"role": "assistant", "content": chat.choices[0].message.content},
                {"role": "user", "content": f"next {turn}"},
            ]
    reads = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    writes = [u["cache_creation_input_tokens"] for u in usages]
    assert reads[0] == 0 and writes[0] > 5000
    assert reads[1:] == [writes[0], writes[0] + writes[1]]
    assert proxy.sample("promptcache_input_tokens_total", provider="openai", cache="read") == sum(reads)


async def test_simulated_litellm_rejects_a_marker_on_a_tool_message(make_sim) -> None:
    sim = await make_sim(openai_platform="litellm")
    messages = _conversation(1)
    messages[-1] = {**messages[-1], "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}
    async with openai.AsyncOpenAI(base_url=sim + "/v1", api_key="sk-gw", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model=CLAUDE, messages=messages)
    assert "cache_control may not be specified within tool_result.content" in str(info.value)
