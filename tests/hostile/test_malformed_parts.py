"""Malformed parts are skipped block by block and counted, never fatal to a stage (issue 11,
item 9): a content block whose `type`, a message whose `role`, a tool whose `name` or a tool
call whose `name` is a list, an object or a number. Before, such a part made a whole stage fail
open (the request lost replay, pinning and every marker); now the rest of the request is still
optimised, and `promptcache_malformed_parts_total{stage,kind}` counts what was skipped.

End to end through the proxy (real HTTP on loopback, a recording fake upstream), then property
tests over the pure cores with malformed parts planted in generated bodies."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.canonicalise import SessionPins
from proxy.providers import ANTHROPIC, route
from proxy.providers.openai_request import has_breakpoints
from tests.fakes.upstream import FakeUpstream
from tests.pipeline.helpers import RULES, optimise
from tests.pipeline.strategies import (
    ANTHROPIC_MARKER_KEY,
    OPENAI_MARKER_KEY,
    anthropic_bodies,
    content_fingerprint,
    count_markers,
    openai_bodies,
)
from tests.sessions.conftest import Client, Proxy

MODEL = "claude-sonnet-4-6"
SYSTEM_TEXT = "Guideline: prefer small reviewed changes. " * 120
EPH = {"type": "ephemeral"}
READ = {"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}
WRITE = {"name": "write", "description": "Write a file.", "input_schema": {"type": "object"}}
BAD_TOOL = {"name": ["x"], "description": "bad", "input_schema": {"type": "object"}}
SESSION = {"x-session-id": "conversation-1"}
STAGES = ("parse", "session", "canonicalise", "reorder", "pin", "replay", "breakpoints", "serialise", "observe")


def stage_errors(proxy: Proxy) -> dict[str, float]:
    return {
        s: proxy.sample("promptcache_stage_errors_total", stage=s)
        for s in STAGES
        if proxy.sample("promptcache_stage_errors_total", stage=s)
    }


def malformed(proxy: Proxy) -> dict[tuple[str, str], float]:
    out = {}
    for metric in proxy.registry.collect():
        if metric.name == "promptcache_malformed_parts":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    out[(sample.labels["stage"], sample.labels["kind"])] = sample.value
    return out


def sent(fake: FakeUpstream, i: int) -> dict[str, Any]:
    return orjson.loads(fake.received[i].body)


async def test_block_type_and_tool_name_in_a_later_turn(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    """Turn 2 carries a content block whose `type` is a list and a tool whose `name` is a list,
    with its tools shuffled and its first message re-sent with keys in another order: the tool
    order is still pinned (the malformed tool last), the first message still replayed with its
    turn-1 bytes, and the markers still placed."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    first = {"role": "user", "content": [{"type": "text", "text": "Tidy module one."}]}
    system = [{"type": "text", "text": SYSTEM_TEXT}]
    turn1 = {"model": MODEL, "max_tokens": 8, "tools": [READ, WRITE], "system": system, "messages": [first]}
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {"p": "a"}}]}
    odd = {"type": ["text"], "text": "odd"}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}, odd]}
    turn2 = {
        "model": MODEL,
        "max_tokens": 8,
        "tools": [WRITE, BAD_TOOL, READ],
        "system": system,
        "messages": [{"content": first["content"], "role": "user"}, call, result],
    }
    assert (await client.messages(proxy, turn1, headers=SESSION))[0] == 200
    assert (await client.messages(proxy, turn2, headers=SESSION))[0] == 200
    out = sent(fake_upstream, 1)
    assert out == {
        "model": MODEL,
        "max_tokens": 8,
        "tools": [READ, WRITE, BAD_TOOL],
        "system": [{"type": "text", "text": SYSTEM_TEXT, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [
            first,
            {"role": "assistant", "content": [{**call["content"][0], "cache_control": EPH}]},
            {"role": "user", "content": [{**result["content"][0], "cache_control": EPH}, odd]},
        ],
    }
    assert orjson.dumps(out["messages"][0]) == orjson.dumps(first)  # the turn-1 bytes, replayed
    assert proxy.sample("promptcache_replayed_messages_total", provider="anthropic") == 1
    assert stage_errors(proxy) == {}
    assert malformed(proxy) == {
        ("session", "block_type"): 1,
        ("canonicalise", "tool_name"): 1,
        ("breakpoints", "block_type"): 1,
    }


async def test_tool_use_name_not_a_string(start_proxy: Any, fake_upstream: FakeUpstream, client: Client) -> None:
    """A `tool_use` whose `name` is an object in a later turn: skipped by input pinning only;
    the well-formed call's input keys are still put back in their first-seen order."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    system = [{"type": "text", "text": SYSTEM_TEXT}]
    ask = {"role": "user", "content": [{"type": "text", "text": "Read a."}]}
    call1 = {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a", "mode": "r"}}
    result1 = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}
    turn1 = {
        "model": MODEL,
        "max_tokens": 8,
        "tools": [READ],
        "system": system,
        "messages": [ask, {"role": "assistant", "content": [call1]}, result1],
    }
    bad_call = {"type": "tool_use", "id": "t3", "name": {"a": 1}, "input": {}}
    call2 = {"type": "tool_use", "id": "t2", "name": "read", "input": {"mode": "w", "path": "b"}}
    turn2 = {
        **turn1,
        "messages": [
            *turn1["messages"],
            {"role": "assistant", "content": [call2, bad_call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "done"}]},
        ],
    }
    assert (await client.messages(proxy, turn1, headers=SESSION))[0] == 200
    assert (await client.messages(proxy, turn2, headers=SESSION))[0] == 200
    out = sent(fake_upstream, 1)
    assert list(out["messages"][3]["content"][0]["input"]) == ["path", "mode"]  # pinned order
    assert out["messages"][3]["content"][1] == {**bad_call, "cache_control": EPH}
    assert count_markers(ANTHROPIC, out, ANTHROPIC_MARKER_KEY) == 4
    assert stage_errors(proxy) == {}
    assert malformed(proxy) == {("canonicalise", "call_name"): 1}


async def test_chat_role_not_a_string_keeps_replay(start_proxy: Any, fake_upstream: FakeUpstream) -> None:
    """A Chat message whose `role` is a list in a later turn: the earlier message is still
    replayed with its first bytes, the malformed one forwarded as sent."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    system = {"role": "system", "content": SYSTEM_TEXT}
    first = {"role": "user", "content": "Summarise the design document, please."}
    odd = {"role": ["user"], "content": "odd"}
    bodies = [
        {"model": "gpt-5.1", "messages": [system, first]},
        {
            "model": "gpt-5.1",
            "messages": [
                system,
                {"content": first["content"], "role": "user"},
                {"role": "assistant", "content": "Hello there"},
                odd,
                {"role": "user", "content": "And the risks?"},
            ],
        },
    ]
    headers = {"authorization": "Bearer k", "content-type": "application/json", **SESSION}
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            async with session.post(proxy.url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers) as r:
                assert r.status == 200
    messages = sent(fake_upstream, 1)["messages"]
    assert [orjson.dumps(m) for m in messages] == [
        orjson.dumps(system),
        orjson.dumps(first),
        orjson.dumps({"role": "assistant", "content": "Hello there"}),
        orjson.dumps(odd),
        orjson.dumps({"role": "user", "content": "And the risks?"}),
    ]
    assert proxy.sample("promptcache_replayed_messages_total", provider="openai") == 1
    assert stage_errors(proxy) == {}
    assert malformed(proxy) == {("session", "role"): 1}


async def test_responses_role_not_a_string(start_proxy: Any, fake_upstream: FakeUpstream) -> None:
    """A Responses input item whose `role` is an object: not a system message, the request
    still optimised (no stage error), counted."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    body = {
        "model": "gpt-5.1",
        "instructions": SYSTEM_TEXT,
        "input": [{"role": {"a": 1}, "content": "odd"}, {"role": "user", "content": "hi"}],
    }
    headers = {"authorization": "Bearer k", "content-type": "application/json"}
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.url + "/v1/responses", data=orjson.dumps(body), headers=headers) as r:
            assert r.status == 200
    assert sent(fake_upstream, 0)["input"] == body["input"]
    assert stage_errors(proxy) == {}
    assert malformed(proxy) == {("reorder", "role"): 1, ("pin", "role"): 1}


# --- properties over the pure cores ----------------------------------------------------------

BAD_VALUES = st.sampled_from([["text"], {"a": 1}, 7, 1.5, True])
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _slots(value: Any, at: tuple = ()) -> list[tuple]:
    """Paths of every `type`, `role` and `name` key in `value`."""
    out = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("type", "role", "name"):
                out.append((*at, key))
            out.extend(_slots(item, (*at, key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.extend(_slots(item, (*at, i)))
    return out


@st.composite
def poisoned(draw: st.DrawFn, bodies: st.SearchStrategy[Any]) -> Any:
    """A generated body with 1-3 of its `type` / `role` / `name` values made malformed."""
    case = draw(bodies)
    body = case[1] if isinstance(case, tuple) else case
    body = copy.deepcopy(body)
    slots = _slots(body)
    if slots:
        for path in draw(st.lists(st.sampled_from(slots), min_size=1, max_size=3, unique=True)):
            target = body
            for part in path[:-1]:
                target = target[part]
            target[path[-1]] = draw(BAD_VALUES)
    return (case[0], body) if isinstance(case, tuple) else body


def _pins(body: dict[str, Any]) -> SessionPins:
    names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    return SessionPins(tuple(reversed([n for n in names if isinstance(n, str)])))


@FAST
@given(poisoned(anthropic_bodies()))
def test_cores_with_malformed_parts_anthropic(body: dict) -> None:
    before = orjson.dumps(body)
    pins = _pins(body)
    out, plan = optimise(ANTHROPIC, body, RULES, min_tokens=8, pins=pins)
    assert orjson.dumps(body) == before, "input mutated"
    again, plan2 = optimise(ANTHROPIC, out, RULES, min_tokens=8, pins=pins)
    assert orjson.dumps(again) == orjson.dumps(out), "not idempotent"
    assert plan2.injected == plan2.moved == plan2.dropped == 0
    key = ANTHROPIC_MARKER_KEY
    assert count_markers(ANTHROPIC, out, key) <= 4
    assert content_fingerprint(ANTHROPIC, out, key) == content_fingerprint(
        ANTHROPIC, body, key
    )


@FAST
@given(poisoned(openai_bodies()))
def test_cores_with_malformed_parts_openai(case: tuple[str, dict]) -> None:
    path, body = case
    before = orjson.dumps(body)
    out, _ = optimise(route(path)[0], body, RULES, min_tokens=8, pins=_pins(body))
    assert orjson.dumps(body) == before, "input mutated"
    again, _ = optimise(route(path)[0], out, RULES, min_tokens=8, pins=_pins(body))
    assert orjson.dumps(again) == orjson.dumps(out), "not idempotent"
    key = OPENAI_MARKER_KEY
    # a model without breakpoints takes no markers from promptcache: the client's pass as sent
    limit = 4 if has_breakpoints(body.get("model")) else max(4, count_markers(route(path)[0], body, key))
    assert count_markers(route(path)[0], out, key) <= limit
    assert content_fingerprint(route(path)[0], out, key) == content_fingerprint(route(path)[0], body, key)


DEEP = b'{"a":' * 300 + b"1" + b"}" * 300


async def test_a_body_nested_deeper_than_orjson_writes_is_forwarded_as_sent(
    start_proxy: Any, fake_upstream: FakeUpstream
) -> None:
    """Found by the HTTP fuzz test: a value nested 300 levels deep (valid JSON the simulator
    accepts) failed the session, serialise and observe stages (orjson writes at most 254
    levels). Now it is forwarded byte for byte and counted as `too_deep`, not as a stage error."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    bodies = {
        "/v1/chat/completions": b'{"model":"gpt-5.1","messages":[{"role":"user","content":"hi"}],"metadata":'
        + DEEP
        + b"}",
        "/v1/responses": b'{"model":"gpt-5.1","input":[{"role":"user","content":"hi"},{"role":"assistant",'
        b'"content":[{"type":"output_text","text":' + DEEP + b'}]},{"role":"user","content":"x"}]}',
    }
    headers = {"authorization": "Bearer k", "content-type": "application/json"}
    async with aiohttp.ClientSession() as session:
        for path, body in bodies.items():
            async with session.post(proxy.url + path, data=body, headers=headers) as r:
                assert r.status == 200
    assert [r.body for r in fake_upstream.received] == list(bodies.values())
    assert stage_errors(proxy) == {}
    assert malformed(proxy) == {("serialise", "too_deep"): 1, ("session", "too_deep"): 1, ("observe", "too_deep"): 1}
