"""Pins: first-seen tool order, schemas and tool-call inputs, in canonicalise's shape."""

from __future__ import annotations

from proxy.pipeline.canonicalise import SessionPins
from proxy.pipeline.session import update_pins
from proxy.providers import ANTHROPIC, route

PATH = "/v1/messages"


def body(tools: list[dict], messages: list[dict] | None = None) -> dict:
    return {"tools": tools, "messages": messages or [{"role": "user", "content": "hi"}]}


def tool(name: str, schema: dict) -> dict:
    return {"name": name, "input_schema": schema}


def test_first_seen_wins_and_new_tools_append() -> None:
    shape = ANTHROPIC.tool_shape
    first = body(
        [
            tool("read", {"type": "object", "properties": {"b": {}, "a": {}}}),
            tool("grep", {"type": "object"}),
        ],
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "1", "name": "read", "input": {"path": "x", "limit": 1}}
                ],
            },
        ],
    )
    pins = update_pins(None, ANTHROPIC.prefix_blocks(first), shape)
    assert pins == {
        "pinned_tool_order": ["read", "grep"],
        "pinned_schemas": {
            "read": {"type": "object", "properties": {"b": {}, "a": {}}},
            "grep": {"type": "object"},
        },
        "pinned_inputs": {"read": {"path": "x", "limit": 1}},
    }
    second = body(
        [tool("edit", {"type": "object"}), tool("read", {"properties": {"a": {}, "b": {}}, "type": "object"})]
    )
    later = update_pins(pins, ANTHROPIC.prefix_blocks(second), shape)
    assert later["pinned_tool_order"] == ["read", "grep", "edit"]
    assert list(later["pinned_schemas"]["read"]) == ["type", "properties"]
    assert pins["pinned_tool_order"] == ["read", "grep"]  # input untouched
    assert SessionPins.of(later).pinned_tool_order == ("read", "grep", "edit")


def test_openai_chat_tool_names() -> None:
    path = "/v1/chat/completions"
    request = {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    pins = update_pins(None, route(path)[0].prefix_blocks(request), route(path)[0].tool_shape)
    assert pins["pinned_tool_order"] == ["f"]
    assert pins["pinned_schemas"] == {"f": {"type": "object"}}


def test_sent_markers_positions_and_ttls() -> None:
    from proxy.divergence import marker_positions, read_rules
    from proxy.pipeline.session import sent_markers

    def positions(body):
        return marker_positions([b.value for b in blocks], body, read_rules(ANTHROPIC, body))

    sent = {
        "tools": [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
    }
    blocks = ANTHROPIC.prefix_blocks(sent)
    assert sent_markers(blocks, sent, positions(sent)) == ((0, 1), ("1h", "5m"))
    automatic = {**sent, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    assert sent_markers(blocks, automatic, positions(automatic)) == ((0, 1, 3), ("1h", "5m", "1h"))


def test_calls_are_walked_from_the_first_block_the_previous_request_did_not_send() -> None:
    from proxy.pipeline.session import calls_from, pins_after
    from proxy.prefix import scan_prompt
    from proxy.store.codec import SessionRecord

    def call(i: int, name: str) -> dict:
        return {"role": "assistant", "content": [{"type": "tool_use", "id": str(i), "name": name, "input": {"n": i}}]}

    tools = [tool("read", {"type": "object"})]
    history = [{"role": "user", "content": "hi"}, call(1, "read"), {"role": "user", "content": "ok"}]
    before = scan_prompt(ANTHROPIC.layout(body(tools, history)))
    pins = update_pins(None, ANTHROPIC.prefix_blocks(body(tools, history)), ANTHROPIC.tool_shape)
    previous = SessionRecord(before.chain.chain, before.chain.ends, "m", b"", pins=pins)
    appended = scan_prompt(ANTHROPIC.layout(body(tools, [*history, call(2, "grep")])))
    assert (before.tools, len(before.values), len(appended.values)) == (1, 4, 5)
    assert calls_from(appended, previous, pins) == 4  # only the new call
    assert calls_from(appended, previous, None) == 1  # no pins: every call
    assert calls_from(appended, None, pins) == 1
    edited = scan_prompt(ANTHROPIC.layout(body(tools, [history[0], call(1, "edit"), *history[2:]])))
    assert calls_from(edited, previous, pins) == 2  # from the block that differs
    calls = [v for v in appended.values[calls_from(appended, previous, pins) :] if v.get("type") == "tool_use"]
    assert pins_after(pins, appended.values[:1], calls, ANTHROPIC.tool_shape)["pinned_inputs"] == {
        "read": {"n": 1},
        "grep": {"n": 2},
    }
