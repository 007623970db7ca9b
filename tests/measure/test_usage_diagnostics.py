"""Usage readers capture the response id and Anthropic cache diagnostics; the diagnostics stage."""

from __future__ import annotations

from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry

from proxy.exchange import Exchange
from proxy.metrics import STAGES, Metrics
from proxy.pipeline.diagnostics import STAGE
from proxy.providers import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, route
from proxy.services import Services
from proxy.settings import Settings
from proxy.store.codec import SessionRecord
from tests.fakes.upstream import ANTHROPIC_MESSAGE, CHAT_COMPLETION, RESPONSE, chat_stream, responses_stream

MISS = {"cache_miss_reason": {"type": "system_changed", "cache_missed_input_tokens": 4200}}


def _events(raw: list[bytes]) -> list[tuple[str, Any]]:
    out = []
    for chunk in raw:
        lines = chunk.decode().strip().splitlines()
        event = next((line[7:] for line in lines if line.startswith("event: ")), "")
        data = next(line[6:] for line in lines if line.startswith("data: "))
        if data != "[DONE]":
            out.append((event, orjson.loads(data)))
    return out


def test_anthropic_json_id_and_miss_reason() -> None:
    reader = ANTHROPIC.usage_reader()
    reader.feed_json({**ANTHROPIC_MESSAGE, "diagnostics": MISS})
    usage = reader.result()
    assert (usage.response_id, usage.cache_miss_reason, usage.cache_missed_tokens) == (
        "msg_fake_1",
        "system_changed",
        4200,
    )
    assert (usage.cache_read, usage.cache_write_5m, usage.cache_write_1h) == (3000, 1000, 500)


def test_anthropic_stream_diagnostics_on_message_start() -> None:
    reader = ANTHROPIC.usage_reader()
    start = {
        "type": "message_start",
        "message": {**ANTHROPIC_MESSAGE, "id": "msg_s", "diagnostics": {"cache_miss_reason": None}},
    }
    reader.feed_event("message_start", start)
    reader.feed_event("message_delta", {"type": "message_delta", "usage": {"output_tokens": 9}})
    usage = reader.result()
    assert (usage.response_id, usage.cache_miss_reason, usage.cache_missed_tokens, usage.output) == (
        "msg_s",
        "pending",
        None,
        9,
    )


def test_anthropic_null_or_absent_diagnostics_is_none() -> None:
    for body in (ANTHROPIC_MESSAGE, {**ANTHROPIC_MESSAGE, "diagnostics": None}):
        reader = ANTHROPIC.usage_reader()
        reader.feed_json(body)
        assert reader.result().cache_miss_reason is None


def test_openai_response_ids() -> None:
    for path, body in (("/v1/chat/completions", CHAT_COMPLETION), ("/v1/responses", RESPONSE)):
        reader = route(path)[0].usage_reader()
        reader.feed_json(body)
        assert reader.result().response_id == body["id"]
    chat = OPENAI_CHAT.usage_reader()
    for event, data in _events(chat_stream(include_usage=True)):
        chat.feed_event(event, data)
    assert (chat.result().response_id, chat.result().cache_read) == ("chatcmpl-fake", 1920)
    responses = OPENAI_RESPONSES.usage_reader()
    for event, data in _events(responses_stream()):
        responses.feed_event(event, data)
    assert (responses.result().response_id, responses.result().cache_read) == ("resp_fake", 3968)


def _exchange(adapter, path: str, body: dict[str, Any], previous: Any) -> Exchange:
    ex = Exchange(adapter, path, "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(body))
    ex.body = body
    ex.previous = previous
    return ex


def _services(on: bool) -> Services:
    return Services(settings=Settings(cache_diagnostics=on), metrics=Metrics(CollectorRegistry()))


async def test_stage_adds_previous_message_id_copy_on_write() -> None:
    assert STAGE.name == "diagnostics" and STAGE.name in STAGES and STAGE.rewrites
    body = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "hi"}]}
    record = SessionRecord(
        chain=b"", ends=(), model="claude-sonnet-4-6", params_digest=b"", last_response_id="msg_7"
    )
    ex = _exchange(ANTHROPIC, "/v1/messages", body, record)
    await STAGE.run(ex, _services(True))
    assert ex.body == {**body, "diagnostics": {"previous_message_id": "msg_7"}}
    assert "diagnostics" not in body
    assert ex.is_body_dirty is True and ex.is_diagnostics_requested is True
    first = _exchange(ANTHROPIC, "/v1/messages", body, None)
    await STAGE.run(first, _services(True))
    assert first.body["diagnostics"] == {"previous_message_id": None}


async def test_stage_leaves_body_alone_when_off_openai_or_client_set() -> None:
    body = {"model": "claude-sonnet-4-6", "messages": []}
    off = _exchange(ANTHROPIC, "/v1/messages", body, None)
    await STAGE.run(off, _services(False))
    chat = _exchange(OPENAI_CHAT, "/v1/chat/completions", {"model": "gpt-5", "messages": []}, None)
    await STAGE.run(chat, _services(True))
    own = {**body, "diagnostics": {"previous_message_id": "msg_client"}}
    client = _exchange(ANTHROPIC, "/v1/messages", own, None)
    await STAGE.run(client, _services(True))
    for ex, original in ((off, body), (chat, chat.body), (client, own)):
        assert ex.body is original and not ex.is_body_dirty and not ex.is_diagnostics_requested
