"""Every rejection of the simulator, with its exact status and body."""

from __future__ import annotations

import copy
from typing import Any

import pytest

CONFORMANCE = [
    # (test name, docs/provider-rules.md section behind the rule)
    ("test_anthropic_rejections[five-markers]", "1.4 at most 4 markers, exact text"),
    ("test_anthropic_rejections[1h-after-bare-5m]", "1.2 bare = 5m; 1.7 TTL order, exact text"),
    ("test_anthropic_rejections[1h-after-5m-in-messages]", "1.7 TTL order path messages.0.content.4"),
    ("test_anthropic_rejections[empty-text]", "1.3 empty text blocks, exact text"),
    ("test_anthropic_rejections[thinking]", "1.3 thinking, exact text"),
    ("test_anthropic_rejections[redacted-thinking]", "1.3 redacted_thinking"),
    ("test_anthropic_rejections[inside-tool-result]", "1.3 / 7 inside tool_result.content, exact text"),
    ("test_anthropic_rejections[automatic-with-four-explicit]", "1.1 no slot left for automatic"),
    ("test_anthropic_rejections[automatic-conflicting-ttl]", "1.1 last block's TTL differs"),
    ("test_anthropic_rejections[automatic-1h-after-5m]", "1.1 + 1.7 automatic marker obeys TTL order"),
    ("test_anthropic_rejections[unknown-ttl]", "8.1 optional: unknown ttl values"),
    ("test_anthropic_rejections[extra-cache-control-field]", "1.2 Extra inputs are not permitted"),
    ("test_anthropic_accepts", "1.2 scope accepted on direct API; 1.7 ttl without beta header"),
    ("test_missing_key_anthropic", "brief: 401 in the provider's error shape"),
    ("test_missing_version_header", "1.13 anthropic-version required"),
    ("test_missing_key_openai", "brief: 401 in the provider's error shape"),
    ("test_openai_rejections", "2.x request validation, OpenAI error shape"),
]

HEADERS = {"anthropic-version": "2023-06-01"}
CC = {"type": "ephemeral"}
CC_5M = {"type": "ephemeral", "ttl": "5m"}
CC_1H = {"type": "ephemeral", "ttl": "1h"}
TTL_ORDER = (
    "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block. "
    "Note that blocks are processed in the following order: `tools`, `system`, `messages`."
)


def base() -> dict[str, Any]:
    return {
        "model": "claude-opus-5",
        "max_tokens": 16,
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"part {i}"} for i in range(5)]},
        ],
    }


def five_markers(b: dict) -> None:
    b["system"][0]["cache_control"] = CC
    for block in b["messages"][0]["content"][:4]:
        block["cache_control"] = CC


def one_hour_after_bare(b: dict) -> None:
    b["system"][0]["cache_control"] = CC
    b["messages"][0]["content"][4]["cache_control"] = CC_1H


def one_hour_after_5m_in_messages(b: dict) -> None:
    b["messages"][0]["content"][1]["cache_control"] = CC_5M
    b["messages"][0]["content"][4]["cache_control"] = CC_1H


def empty_text(b: dict) -> None:
    b["messages"].append({"role": "assistant", "content": "ok"})
    b["messages"].append(
        {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "text", "text": ""}]}
    )
    b["messages"][2]["content"][1]["cache_control"] = CC


def thinking(kind: str):
    def mutate(b: dict) -> None:
        block = (
            {"type": "thinking", "thinking": "hmm", "signature": "sig"}
            if kind == "thinking"
            else {"type": "redacted_thinking", "data": "xyz"}
        )
        b["messages"].append({"role": "assistant", "content": [{**block, "cache_control": CC}]})
        b["messages"].append({"role": "user", "content": "go on"})

    return mutate


def inside_tool_result(b: dict) -> None:
    b["tools"] = [{"name": "read", "input_schema": {"type": "object"}}]
    b["messages"].append(
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}]}
    )
    b["messages"].append(
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "file", "cache_control": CC}],
                }
            ],
        }
    )


def automatic_with_four(b: dict) -> None:
    for block in b["messages"][0]["content"][:4]:
        block["cache_control"] = CC
    b["cache_control"] = CC


def automatic_conflict(b: dict) -> None:
    b["messages"][0]["content"][4]["cache_control"] = CC_1H
    b["cache_control"] = CC


def automatic_after_5m(b: dict) -> None:
    b["system"][0]["cache_control"] = CC
    b["cache_control"] = CC_1H


def unknown_ttl(b: dict) -> None:
    b["messages"][0]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "2h"}


def extra_field(b: dict) -> None:
    b["system"][0]["cache_control"] = {"type": "ephemeral", "size": 3}


CASES = [
    ("five-markers", five_markers, "A maximum of 4 blocks with cache_control may be provided. Found 5."),
    ("1h-after-bare-5m", one_hour_after_bare, f"messages.0.content.4.cache_control.ttl: {TTL_ORDER}"),
    (
        "1h-after-5m-in-messages",
        one_hour_after_5m_in_messages,
        f"messages.0.content.4.cache_control.ttl: {TTL_ORDER}",
    ),
    (
        "empty-text",
        empty_text,
        "messages.2.content.1.text: cache_control cannot be set for empty text blocks",
    ),
    (
        "thinking",
        thinking("thinking"),
        "messages.1.content.0.thinking.cache_control: Extra inputs are not permitted",
    ),
    (
        "redacted-thinking",
        thinking("redacted_thinking"),
        "messages.1.content.0.redacted_thinking.cache_control: Extra inputs are not permitted",
    ),
    (
        "inside-tool-result",
        inside_tool_result,
        "cache_control may not be specified within tool_result.content. "
        "Instead, place it directly on tool_result",
    ),
    (
        "automatic-with-four-explicit",
        automatic_with_four,
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
    (
        "automatic-conflicting-ttl",
        automatic_conflict,
        "cache_control: the top-level cache_control (ttl='5m') conflicts with the cache_control on the "
        "last cacheable block messages.0.content.4 (ttl='1h')",
    ),
    ("automatic-1h-after-5m", automatic_after_5m, f"messages.0.content.4.cache_control.ttl: {TTL_ORDER}"),
    (
        "unknown-ttl",
        unknown_ttl,
        "messages.0.content.0.cache_control.ephemeral.ttl: Input should be '5m' or '1h'",
    ),
    (
        "extra-cache-control-field",
        extra_field,
        "system.0.cache_control.ephemeral.size: Extra inputs are not permitted",
    ),
]


@pytest.mark.parametrize(("mutate", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_anthropic_rejections(sim, mutate, message: str) -> None:
    b = base()
    mutate(b)
    for stream in (False, True):
        status, data = await sim.messages({**b, "stream": stream})
        assert (status, data) == (
            400,
            {"type": "error", "error": {"type": "invalid_request_error", "message": message}},
        )


async def test_anthropic_accepts(sim) -> None:
    b = copy.deepcopy(base())
    b["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h", "scope": "global"}
    b["messages"][0]["content"][4]["cache_control"] = CC_5M
    status, data = await sim.messages(b)  # no anthropic-beta header needed for ttl
    assert status == 200, data


async def test_missing_key_anthropic(sim) -> None:
    status, data = await sim.messages(base(), key=None)
    assert (status, data) == (
        401,
        {
            "type": "error",
            "error": {"type": "authentication_error", "message": "x-api-key header is required"},
        },
    )


async def test_missing_version_header(sim) -> None:
    status, data = await sim.post("/v1/messages", base(), key=None, headers={"x-api-key": "k"})
    assert (status, data) == (
        400,
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "anthropic-version: header is required"},
        },
    )


async def test_missing_key_openai(sim) -> None:
    for path in ("/v1/chat/completions", "/v1/responses"):
        status, data = await sim.post(path, {"model": "gpt-4o", "messages": []}, key=None)
        assert status == 401
        assert data == {
            "error": {
                "message": "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }


async def test_openai_rejections(sim) -> None:
    cases = [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}]},
            {"message": "you must provide a model parameter", "param": "model", "code": None},
        ),
        (
            "/v1/chat/completions",
            {"model": "gpt-4o"},
            {
                "message": "Missing required parameter: 'messages'.",
                "param": "messages",
                "code": "missing_required_parameter",
            },
        ),
        (
            "/v1/responses",
            {"model": "gpt-4o", "input": "hi", "previous_response_id": "resp_x"},
            {
                "message": "Previous response with id 'resp_x' not found.",
                "param": "previous_response_id",
                "code": "previous_response_not_found",
            },
        ),
        (
            "/v1/responses",
            {"model": "gpt-5.6", "input": "hi", "prompt_cache_options": {"ttl": "5m"}},
            {
                "message": "Invalid value: '5m'. Supported values are: '30m'.",
                "param": "prompt_cache_options.ttl",
                "code": "invalid_value",
            },
        ),
    ]
    for path, body, error in cases:
        status, data = await sim.post(path, body)
        assert (status, data) == (400, {"error": {**error, "type": "invalid_request_error"}})
