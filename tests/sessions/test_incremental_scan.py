"""The incremental prompt scan: blocks of messages unchanged since the session's previous
request are not serialised or digested again (`proxy.prefix.Reuse`, `proxy.measure.reuse_for`),
and the scan is the same as a full one."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.measure import reuse_for
from proxy.pipeline.replay import stripped_bytes
from proxy.prefix import PrefixChain, Reuse, scan_prompt
from proxy.providers import ANTHROPIC, route
from tests.pipeline.strategies import anthropic_bodies, openai_bodies
from tests.sessions.test_fast_paths import _send, _services

MESSAGES = "/v1/messages"
FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _runs(adapter: Any, body: dict[str, Any]) -> list[Any]:
    return [run for key in adapter.prefix_keys if key in body for run in adapter.layout({key: body[key]})]


def _fields(scan: Any) -> tuple[Any, ...]:
    return (scan.chain, list(scan.blocks), scan.kinds, scan.values, scan.marked, scan.tools)


def _earlier(data: st.DataObject, body: dict[str, Any], key: str) -> dict[str, Any]:
    """An earlier request of the same conversation: fewer messages, maybe one of them edited,
    maybe markers elsewhere, maybe other tools."""
    earlier = copy.deepcopy(body)
    items = earlier[key]
    del items[data.draw(st.integers(0, len(items))) :]
    if items and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(items) - 1))
        if isinstance(items[i], dict):
            items[i] = {**items[i], "content": "edited earlier"}
    if items and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(items) - 1))
        content = items[i].get("content") if isinstance(items[i], dict) else None
        if isinstance(content, list) and content and isinstance(content[-1], dict):
            content[-1] = {**content[-1], "cache_control": {"type": "ephemeral"}}
    if "tools" in earlier and data.draw(st.booleans()):
        earlier["tools"] = earlier["tools"][:-1]
    return earlier


def _check(data: st.DataObject, adapter: Any, body: dict[str, Any]) -> None:
    key = "input" if adapter.api_path == "/v1/responses" else "messages"
    if not isinstance(body.get(key), list):
        return
    earlier = _earlier(data, body, key)
    before = scan_prompt(_runs(adapter, earlier)).chain
    # what reuse_for vouches for: leading elements whose marker-free bytes are the earlier ones
    same = 0
    for old, new in zip(earlier[key], body[key], strict=False):
        if stripped_bytes(old) != stripped_bytes(new):
            break
        same += 1
    runs = _runs(adapter, body)
    full = scan_prompt(runs)
    incremental = scan_prompt(runs, Reuse(PrefixChain(before.chain, before.ends), key, same))
    assert _fields(incremental) == _fields(full)


@FAST
@given(anthropic_bodies(), st.data())
def test_incremental_scan_equals_full_scan_anthropic(body: dict[str, Any], data: st.DataObject) -> None:
    _check(data, ANTHROPIC, body)


@FAST
@given(openai_bodies(), st.data())
def test_incremental_scan_equals_full_scan_openai(case: tuple[str, dict[str, Any]], data: st.DataObject) -> None:
    _check(data, route(case[0])[0], case[1])


def _turns(n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Start the task. " * 50}]
    for k in range(n):
        call = f"toolu_{k:04d}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {k}."},
                    {"type": "tool_use", "id": call, "name": "read", "input": {"path": f"f{k}.py"}},
                ],
            }
        )
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": f"line {k}\n" * 30}]}
        )
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "You are a careful agent. " * 40}],
        "tools": [{"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}],
        "messages": messages,
    }


async def test_an_appended_turn_reuses_every_earlier_message() -> None:
    """Turn 2 appends a tool round trip to turn 1: all of turn 1's seven messages are vouched
    for (their blocks are copied, not digested), in observe and in optimise mode (sent as the
    client's objects or replayed)."""
    first, second = _turns(3), _turns(4)
    for mode, expected in (("observe", 7), ("optimise", 7)):
        services = _services(mode)
        await _send(services, ANTHROPIC, first)
        ex = await _send(services, ANTHROPIC, second)
        reuse = reuse_for(ex, ex.sent_prompt[0])
        assert reuse is not None and reuse.array_key == "messages"
        assert (mode, reuse.same) == (mode, expected)
