"""Simulator validation (issue 11, item 11): wrong-typed `cache_control` fields and malformed
tools get 400 `invalid_request_error` in the API's wording, never a 500."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.sessions.conftest import Sim

ANTHROPIC = {"x-api-key": "key-s", "anthropic-version": "2023-06-01"}
OPENAI = {"Authorization": "Bearer key-s"}
USER = [{"role": "user", "content": "hi"}]


def messages(**extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": USER, **extra}


def marked(cache_control: Any) -> dict[str, Any]:
    return messages(system=[{"type": "text", "text": "sys", "cache_control": cache_control}])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            marked({"type": "ephemeral", "ttl": ["1h"]}),
            "system.0.cache_control.ephemeral.ttl: Input should be '5m' or '1h'",
        ),
        (
            marked({"type": "ephemeral", "ttl": {"h": 1}}),
            "system.0.cache_control.ephemeral.ttl: Input should be '5m' or '1h'",
        ),
        (
            marked({"type": "ephemeral", "ttl": 3600}),
            "system.0.cache_control.ephemeral.ttl: Input should be '5m' or '1h'",
        ),
        (marked({"type": ["ephemeral"]}), "system.0.cache_control.type: Input should be 'ephemeral'"),
        (
            marked({"type": "ephemeral", "scope": 1}),
            "system.0.cache_control.ephemeral.scope: Input should be a valid string",
        ),
        (marked("ephemeral"), "system.0.cache_control: Input should be a valid dictionary"),
        (
            messages(tools=[{"name": 7, "input_schema": {"type": "object"}}]),
            "tools.0.custom.name: Input should be a valid string",
        ),
        (
            messages(tools=[{"name": "t", "input_schema": "object"}]),
            "tools.0.custom.input_schema: Input should be a valid dictionary",
        ),
        (messages(tools=[{"input_schema": {"type": "object"}}]), "tools.0.custom.name: Field required"),
    ],
)
async def test_anthropic_rejections(sim: Sim, body: dict[str, Any], message: str) -> None:
    async with sim.session.post(sim.url + "/v1/messages", json=body, headers=ANTHROPIC) as r:
        assert r.status == 400
        assert await r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        (
            "/v1/chat/completions",
            {"model": "gpt-5.1", "messages": USER, "tools": [{"type": "function", "function": {"name": 3}}]},
            "tools[0].function.name",
            "Invalid type for 'tools[0].function.name': expected a string, but got an integer instead.",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "gpt-5.1",
                "messages": USER,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}],
            },
            "tools[0].function.parameters",
            "Invalid type for 'tools[0].function.parameters': expected an object, but got an array instead.",
        ),
        (
            "/v1/responses",
            {"model": "gpt-5.1", "input": "hi", "tools": [{"type": "function", "name": None, "parameters": {}}]},
            "tools[0].name",
            "Invalid type for 'tools[0].name': expected a string, but got null instead.",
        ),
        (
            "/v1/responses",
            {"model": "gpt-5.1", "input": "hi", "tools": ["search"]},
            "tools[0]",
            "Invalid type for 'tools[0]': expected an object, but got a string instead.",
        ),
        (  # found by the HTTP fuzz test: an unhashable part type crashed the simulator (500)
            "/v1/responses",
            {"model": "gpt-5.1", "input": [{"role": "user", "content": [{"type": {}, "text": "hi"}]}]},
            "input[0].content[0].type",
            "Invalid type for 'input[0].content[0].type': expected a string, but got an object instead.",
        ),
        (
            "/v1/chat/completions",
            {"model": "gpt-5.1", "messages": [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]},
            "messages[0].content[0].type",
            "Invalid type for 'messages[0].content[0].type': expected a string, but got an array instead.",
        ),
        (  # found by the HTTP fuzz test (a duplicate "input" key): a number crashed it (500)
            "/v1/responses",
            {"model": "gpt-5.1", "stream": True, "input": -1},
            "input",
            "Invalid type for 'input': expected a string or an array, but got an integer instead.",
        ),
        (
            "/v1/responses",
            {"model": "gpt-5.1", "input": {"role": "user"}},
            "input",
            "Invalid type for 'input': expected a string or an array, but got an object instead.",
        ),
        (  # found by the HTTP fuzz test (a duplicate "tools" key): a boolean crashed it (500)
            "/v1/chat/completions",
            {"model": "gpt-5.1", "messages": USER, "tools": True},
            "tools",
            "Invalid type for 'tools': expected an array, but got a boolean instead.",
        ),
        (
            "/v1/responses",
            {"model": "gpt-5.1", "input": "hi", "tools": {"type": "function"}},
            "tools",
            "Invalid type for 'tools': expected an array, but got an object instead.",
        ),
    ],
)
async def test_openai_rejections(sim: Sim, path: str, body: dict[str, Any], param: str, message: str) -> None:
    async with sim.session.post(sim.url + path, json=body, headers=OPENAI) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error == {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_type"}


async def test_well_formed_tools_are_accepted(sim: Sim) -> None:
    tools = [{"name": "t", "input_schema": {"type": "object"}}]
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.url + "/v1/messages", json=messages(tools=tools), headers=ANTHROPIC) as r:
            assert r.status == 200


DEEP = b'{"a":' * 300 + b"1" + b"}" * 300


async def test_a_body_nested_too_deeply_is_a_400_never_a_500(sim: Sim) -> None:
    """Found by the HTTP fuzz test: a tool input nested 300 levels deep crashed the simulator's
    token count (orjson writes at most 254 levels). Assumed limit: the APIs document none."""
    body = (
        b'{"model":"claude-sonnet-4-6","max_tokens":8,"messages":[{"role":"user","content":"hi"},'
        b'{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"r","input":' + DEEP + b"}]},"
        b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}]}'
    )
    headers = {**ANTHROPIC, "content-type": "application/json"}
    async with sim.session.post(sim.url + "/v1/messages", data=body, headers=headers) as r:
        assert r.status == 400
        assert await r.json() == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "The request body is nested too deeply."},
        }


async def test_a_deep_body_on_a_stream_is_refused_before_the_stream_starts(sim: Sim) -> None:
    """Found by the HTTP fuzz test: a Responses stream whose `instructions` were nested 300
    levels deep failed after its headers went out (a second response written into the stream)."""
    body = b'{"model":"gpt-5.1","stream":true,"input":"hi","instructions":' + DEEP + b"}"
    headers = {**OPENAI, "content-type": "application/json"}
    async with sim.session.post(sim.url + "/v1/responses", data=body, headers=headers) as r:
        assert r.status == 400
        assert (await r.json())["error"]["message"] == "The request body is nested too deeply."
