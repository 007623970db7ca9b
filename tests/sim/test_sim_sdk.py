"""The official `anthropic` and `openai` SDKs pointed straight at the simulator."""

from __future__ import annotations

import anthropic
import openai
import pytest

from proxy.sim.tokens import TokenCounter

CONFORMANCE = [
    # (test name, docs/provider-rules.md section behind the rule)
    ("test_anthropic_sdk_usage", "1.10 usage fields parsed by the SDK, streamed and not"),
    ("test_anthropic_sdk_error", "1.4 error body parsed into BadRequestError"),
    ("test_anthropic_sdk_beta_and_tools", "1.13 ?beta=true + anthropic-beta; scripted tool_use"),
    ("test_openai_sdk_chat", "2.4 Chat usage, include_usage stream, tool_calls"),
    ("test_openai_sdk_responses", "2.4 Responses usage, streamed events, function_call"),
    ("test_openai_sdk_error", "OpenAI error shape parsed into BadRequestError"),
    ("test_openai_sdk_duplicate_item_ids", "9 Responses input item ids unique"),
    ("test_openai_sdk_cache_key_length", "9 prompt_cache_key at most 64 characters"),
    ("test_anthropic_sdk_code_execution_callers", "1.3 no marker on code-execution calls"),
]

tok = TokenCounter().count
MODEL = "claude-sonnet-4-6"
SYSTEM = " word" * 1500
REPLY = "OK from promptcache-sim (turn 1)"


def anthropic_client(sim) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=sim.url, api_key="sdk-key", max_retries=0)


def openai_client(sim) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="sdk-key", max_retries=0)


async def test_anthropic_sdk_usage(sim) -> None:
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": "hi"}]
    async with anthropic_client(sim) as client:
        m = await client.messages.create(model=MODEL, max_tokens=64, system=system, messages=messages)
        assert m.content[0].text == REPLY and m.stop_reason == "end_turn"
        u = m.usage
        assert (u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens) == (
            tok("hi") + 3,
            1500,
            0,
        )
        assert (u.cache_creation.ephemeral_5m_input_tokens, u.cache_creation.ephemeral_1h_input_tokens) == (
            1500,
            0,
        )
        async with client.messages.stream(
            model=MODEL, max_tokens=64, system=system, messages=messages
        ) as stream:
            final = await stream.get_final_message()
        assert final.content[0].text == REPLY
        u = final.usage
        assert (u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens) == (
            tok("hi") + 3,
            0,
            1500,
        )
        assert u.output_tokens == tok(REPLY)
        count = await client.messages.count_tokens(model=MODEL, system=system, messages=messages)
        assert count.input_tokens == 1500 + tok("hi") + 3


async def test_anthropic_sdk_error(sim) -> None:
    content = [{"type": "text", "text": f"t{i}", "cache_control": {"type": "ephemeral"}} for i in range(5)]
    async with anthropic_client(sim) as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                model=MODEL, max_tokens=8, messages=[{"role": "user", "content": content}]
            )
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        },
    }


async def test_anthropic_sdk_beta_and_tools(sim) -> None:
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}]
    async with anthropic_client(sim) as client:
        m = await client.beta.messages.create(
            model=MODEL,
            max_tokens=64,
            betas=["extended-cache-ttl-2025-04-11"],
            tools=tools,
            messages=[{"role": "user", "content": "weather? [[tool:get_weather]]"}],
        )
        assert m.stop_reason == "tool_use"
        assert (m.content[0].type, m.content[0].name, m.content[0].input) == ("tool_use", "get_weather", {})
        async with client.messages.stream(
            model=MODEL,
            max_tokens=64,
            tools=tools,
            messages=[{"role": "user", "content": "weather?"}],
            extra_headers={"x-sim-tool-call": "get_weather", "x-sim-tool-input": '{"city": "Paris"}'},
        ) as stream:
            final = await stream.get_final_message()
        assert final.stop_reason == "tool_use"
        assert (final.content[0].name, final.content[0].input) == ("get_weather", {"city": "Paris"})


async def test_openai_sdk_chat(sim) -> None:
    messages = [{"role": "user", "content": " word" * 1300}]
    async with openai_client(sim) as client:
        for expected in (0, 1280):
            r = await client.chat.completions.create(model="gpt-4o", messages=messages)
            assert r.choices[0].message.content == REPLY
            assert (r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens) == (1307, expected)
        stream = await client.chat.completions.create(
            model="gpt-4o", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
        assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens == 1280
        tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
        r = await client.chat.completions.create(
            model="gpt-4o",
            tools=tools,
            messages=[{"role": "user", "content": 'list [[tool:ls {"path": "/"}]]'}],
        )
        call = r.choices[0].message.tool_calls[0]
        assert (r.choices[0].finish_reason, call.function.name, call.function.arguments) == (
            "tool_calls",
            "ls",
            '{"path":"/"}',
        )


async def test_openai_sdk_responses(sim) -> None:
    async with openai_client(sim) as client:
        for expected in (0, 1280):
            r = await client.responses.create(model="gpt-4o", input=" word" * 1300)
            assert r.output_text == REPLY
            assert (r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens) == (1307, expected)
            assert r.usage.input_tokens_details.cache_write_tokens == 0
        async with client.responses.stream(model="gpt-4o", input=" word" * 1300) as stream:
            final = await stream.get_final_response()
        assert final.output_text == REPLY and final.usage.input_tokens_details.cached_tokens == 1280
        events = [e async for e in await client.responses.create(model="gpt-4o", input="hi", stream=True)]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]
        r = await client.responses.create(model="gpt-4o", tools=tools, input="go [[tool:ls]]")
        assert (r.output[0].type, r.output[0].name, r.output[0].arguments) == ("function_call", "ls", "{}")


async def test_openai_sdk_error(sim) -> None:
    async with openai_client(sim) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="gpt-4o", input="hi", previous_response_id="resp_nope")
    assert caught.value.status_code == 400
    assert caught.value.code == "previous_response_not_found"


async def test_openai_sdk_duplicate_item_ids(sim) -> None:
    item = {"type": "message", "role": "developer", "id": "msg_dev_1", "content": "Be brief."}
    question = {"role": "user", "content": "hi"}
    async with openai_client(sim) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="gpt-4o", input=[item, {**item, "content": "Note."}, question])
        ok = await client.responses.create(model="gpt-4o", input=[item, {**item, "id": "msg_dev_2"}, question])
        assert ok.output_text == REPLY
        no_ids = {k: v for k, v in item.items() if k != "id"}
        assert (await client.responses.create(model="gpt-4o", input=[no_ids, no_ids, question])).output_text == REPLY
    assert caught.value.status_code == 400
    assert caught.value.param == "input"
    assert caught.value.body["message"] == (
        "Duplicate item found with id msg_dev_1. Remove duplicate items from your input and try again."
    )


async def test_openai_sdk_cache_key_length(sim) -> None:
    question = [{"role": "user", "content": "hi"}]
    async with openai_client(sim) as client:
        for key in ("k" * 65, "pc-" + "0" * 69):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.responses.create(model="gpt-4o", input=question, prompt_cache_key=key)
            assert caught.value.status_code == 400
            assert (caught.value.param, caught.value.code) == ("prompt_cache_key", "string_above_max_length")
            assert caught.value.body["message"] == (
                "Invalid 'prompt_cache_key': string too long. Expected a string with maximum length 64, "
                f"but got a string with length {len(key)} instead."
            )
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model="gpt-4o", messages=question, prompt_cache_key=key)
        ok = await client.responses.create(model="gpt-4o", input=question, prompt_cache_key="k" * 64)
        assert ok.output_text == REPLY
        chat = await client.chat.completions.create(model="gpt-4o", messages=question, prompt_cache_key="k" * 64)
        assert chat.choices[0].message.content == REPLY


def _programmatic(call_marker: bool, result_marker: bool) -> list[dict]:
    """A programmatic tool call: code execution calls `get_weather`, whose result comes back."""
    eph = {"type": "ephemeral"}
    call = {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "get_weather",
        "input": {"city": "Paris"},
        "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_01"},
    }
    result = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"}
    return [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Running code.", "cache_control": eph},
                {**call, "cache_control": eph} if call_marker else call,
            ],
        },
        {"role": "user", "content": [{**result, "cache_control": eph} if result_marker else result]},
    ]


async def test_anthropic_sdk_code_execution_callers(sim) -> None:
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}]
    hidden = "called by code execution cannot have cache_control. These blocks are not rendered in Claude's context."
    async with anthropic_client(sim) as client:
        for call_marker, result_marker, message in (
            (True, False, f"Tool use toolu_01 {hidden}"),
            (False, True, f"Tool use result for toolu_01 {hidden}"),
        ):
            with pytest.raises(anthropic.BadRequestError) as caught:
                await client.messages.create(
                    model=MODEL, max_tokens=8, tools=tools, messages=_programmatic(call_marker, result_marker)
                )
            assert caught.value.status_code == 400
            assert caught.value.body["error"]["message"] == message
        ok = await client.messages.create(model=MODEL, max_tokens=8, tools=tools, messages=_programmatic(False, False))
        assert ok.stop_reason == "end_turn"
