"""One example per kind of client fault, with the exact body promptcache sends.

`NO_NEW` disables new markers (min tokens out of reach) where a test is about fixing the
client's own markers; the others run with the real per-model minimum or none.
"""

from __future__ import annotations

import orjson

from proxy.pipeline.breakpoints import PlannedMarker, place_breakpoints
from proxy.pipeline.canonicalise import SessionPins
from proxy.pipeline.pins import pin_body
from proxy.pipeline.reorder import reorder_body
from proxy.providers import ANTHROPIC
from tests.pipeline.helpers import RULES, STAYING_RULES, optimise

MESSAGES = "/v1/messages"
NO_NEW = 10**9
EPH = {"type": "ephemeral"}
EPH_1H = {"type": "ephemeral", "ttl": "1h"}
MODEL = "claude-sonnet-4-6"


def _text(text: str, marker: dict | None = None) -> dict:
    return {"type": "text", "text": text, **({"cache_control": marker} if marker else {})}


def test_four_client_markers_plus_top_level() -> None:
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "cache_control": EPH,
        "tools": [{"name": "read", "input_schema": {"type": "object"}, "cache_control": EPH}],
        "system": [_text("You are terse.", EPH)],
        "messages": [
            {"role": "user", "content": [_text("a", EPH)]},
            {"role": "assistant", "content": [_text("b", EPH)]},
            {"role": "user", "content": [_text("c")]},
        ],
    }
    out, plan = optimise(ANTHROPIC, body, min_tokens=NO_NEW)
    assert out == {
        "model": MODEL,
        "max_tokens": 8,
        "tools": [{"name": "read", "input_schema": {"type": "object"}, "cache_control": EPH}],
        "system": [_text("You are terse.", EPH)],
        "messages": [
            {"role": "user", "content": [_text("a", EPH)]},
            {"role": "assistant", "content": [_text("b")]},
            {"role": "user", "content": [_text("c", EPH)]},
        ],
    }
    assert list(out) == ["model", "max_tokens", "tools", "system", "messages"]
    assert plan.positions == (0, 1, 2, 4)
    assert (plan.kept, plan.moved, plan.dropped, plan.injected) == (3, 1, 1, 0)


def test_marker_inside_tool_result_content_moves_onto_the_tool_result() -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "tu_1",
        "content": [_text("file contents", EPH), _text("more")],
    }
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "read a.py"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "tu_1", "name": "read", "input": {}}],
            },
            {"role": "user", "content": [result]},
        ],
    }
    out, plan = optimise(ANTHROPIC, body, min_tokens=NO_NEW)
    assert out["messages"][2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "tu_1",
                "content": [_text("file contents"), _text("more")],
                "cache_control": EPH,
            }
        ],
    }
    assert out["messages"][:2] == body["messages"][:2]
    assert plan.markers == (PlannedMarker(2, "5m", "moved", "client"),)


def test_marker_on_empty_text_moves_and_the_block_goes() -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [_text("hello"), _text("", EPH_1H)]}],
    }
    out, plan = optimise(ANTHROPIC, body, min_tokens=NO_NEW)
    assert out == {"model": MODEL, "messages": [{"role": "user", "content": [_text("hello", EPH_1H)]}]}
    assert plan.positions == (0,)


def test_marker_on_a_sole_empty_text_moves_to_the_nearest_block() -> None:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "question"},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": [_text("", EPH)]},
        ],
    }
    out, plan = optimise(ANTHROPIC, body, min_tokens=NO_NEW)
    assert out["messages"] == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": [_text("answer", EPH)]},
        {"role": "user", "content": [_text("")]},
    ]
    assert plan.markers == (PlannedMarker(1, "5m", "moved", "client"),)


def test_one_hour_marker_after_bare_markers_upgrades_the_earlier_ones() -> None:
    body = {
        "model": MODEL,
        "system": [_text("Rules.", EPH)],
        "messages": [
            {"role": "user", "content": [_text("a", {"type": "ephemeral", "ttl": "5m"})]},
            {"role": "assistant", "content": [_text("b", EPH_1H)]},
            {"role": "user", "content": [_text("c", EPH)]},
        ],
    }
    out, plan = optimise(ANTHROPIC, body, min_tokens=NO_NEW)
    assert out["system"] == [_text("Rules.", EPH_1H)]
    assert out["messages"] == [
        {"role": "user", "content": [_text("a", EPH_1H)]},
        {"role": "assistant", "content": [_text("b", EPH_1H)]},
        {"role": "user", "content": [_text("c", EPH)]},
    ]
    assert [m.ttl for m in plan.markers] == ["1h", "1h", "1h", "5m"]


LONG = "Follow the repository conventions and explain each change briefly.\n" * 80


def _turn(billing: str, user: str) -> dict:
    return {
        "model": MODEL,
        "max_tokens": 100,
        "system": [_text(f"x-anthropic-billing-header: cc_version=2.1.3; cch={billing};"), _text(LONG)],
        "messages": [{"role": "user", "content": user}],
    }


def test_first_system_block_that_changes_every_request_stays_first_and_its_new_value_moves() -> None:
    """Claude Code's billing header is API-significant: it keeps its place, first-seen bytes
    while unchanged (pin); a changed value goes onto the newest user message, so the system
    prompt stays byte-stable without moving the header out of it."""
    first, _ = optimise(ANTHROPIC, _turn("a1b2c", "hi"))
    assert first["system"] == [
        _text("x-anthropic-billing-header: cc_version=2.1.3; cch=a1b2c;"),
        _text(LONG, EPH),
    ]
    assert first["messages"] == [{"role": "user", "content": [_text("hi", EPH)]}]
    pinned = pin_body(ANTHROPIC, _turn("a1b2c", "hi"), RULES)[1].pinned
    reordered, system = reorder_body(ANTHROPIC, _turn("d3e4f", "hello"), RULES)
    pinned_body, report = pin_body(ANTHROPIC, reordered, RULES, pinned)
    second, plan = place_breakpoints(
        ANTHROPIC, pinned_body, min_tokens=RULES.min_tokens(MODEL), system_tiers=system.tiers
    )
    assert report.moved == 1
    assert second == {
        "model": MODEL,
        "max_tokens": 100,
        "system": [_text("x-anthropic-billing-header: cc_version=2.1.3; cch=a1b2c;"), _text(LONG, EPH)],
        "messages": [
            {
                "role": "user",
                "content": [
                    _text("x-anthropic-billing-header: cc_version=2.1.3; cch=d3e4f;"),
                    _text("hello", EPH),
                ],
            }
        ],
    }
    assert first["system"] == second["system"]
    # no tools, and the header (session-specific) first: no prefix is shared across sessions
    assert plan.markers == (
        PlannedMarker(1, "5m", "injected", "session"),
        PlannedMarker(3, "5m", "injected", "last"),
    )
    staying, _ = optimise(ANTHROPIC, _turn("d3e4f", "hello"), STAYING_RULES)
    assert staying["system"] == [
        _text("x-anthropic-billing-header: cc_version=2.1.3; cch=d3e4f;"),
        _text(LONG, EPH),
    ]
    assert staying["messages"] == [{"role": "user", "content": [_text("hello", EPH)]}]


def _tool(name: str, schema: dict) -> dict:
    return {"name": name, "description": f"{name} files", "input_schema": schema}


SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}}


def test_tools_shuffled_between_turns_follow_the_pinned_order() -> None:
    turn1 = [_tool("read", SCHEMA), _tool("write", SCHEMA), _tool("bash", SCHEMA)]
    turn2 = [_tool("bash", SCHEMA), _tool("grep", SCHEMA), _tool("read", SCHEMA), _tool("write", SCHEMA)]
    pins = SessionPins(pinned_tool_order=("read", "write", "bash"))
    body = {"model": MODEL, "tools": turn2, "messages": [{"role": "user", "content": "go"}]}
    out, _ = optimise(ANTHROPIC, body, min_tokens=NO_NEW, pins=pins)
    assert [t["name"] for t in out["tools"]] == ["read", "write", "bash", "grep"]
    assert orjson.dumps(out["tools"][:3]) == orjson.dumps(turn1)
    unpinned, _ = optimise(ANTHROPIC, body, min_tokens=NO_NEW)
    assert [t["name"] for t in unpinned["tools"]] == ["bash", "grep", "read", "write"]


def test_schema_and_tool_input_keys_reordered_between_turns_are_pinned() -> None:
    reordered = {"properties": {"limit": {"type": "integer"}, "path": {"type": "string"}}, "type": "object"}
    body = {
        "model": MODEL,
        "tools": [_tool("read", reordered)],
        "messages": [
            {"role": "user", "content": "read it"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "tu_1", "name": "read", "input": {"limit": 3, "path": "a"}}
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "ok"}]},
        ],
    }
    pins = SessionPins(
        pinned_tool_order=("read",),
        pinned_schemas={"read": SCHEMA},
        pinned_inputs={"read": {"path": "x", "limit": 1}},
    )
    out, _ = optimise(ANTHROPIC, body, min_tokens=NO_NEW, pins=pins)
    assert orjson.dumps(out["tools"]) == orjson.dumps([_tool("read", SCHEMA)])
    assert orjson.dumps(out["messages"][1]["content"][0]["input"]) == b'{"path":"a","limit":3}'
    assert orjson.dumps(body["tools"][0]["input_schema"]) == orjson.dumps(reordered)  # caller untouched


def test_marker_on_thinking_block_moves_to_the_nearest_legal_block() -> None:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "why?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "because", "signature": "sig", "cache_control": EPH},
                    _text("Because."),
                ],
            },
            {"role": "user", "content": "ok"},
        ],
    }
    out, plan = optimise(ANTHROPIC, body, min_tokens=NO_NEW)
    assert out["messages"] == [
        {"role": "user", "content": [_text("why?", EPH)]},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "because", "signature": "sig"}, _text("Because.")],
        },
        {"role": "user", "content": "ok"},
    ]
    assert plan.markers == (PlannedMarker(0, "5m", "moved", "client"),)


def test_null_markers_are_removed_and_prefix_keys_go_last() -> None:
    body = {
        "messages": [{"role": "user", "content": [_text("hi", None) | {"cache_control": None}]}],
        "cache_control": None,
        "model": MODEL,
        "system": "Be brief.",
        "max_tokens": 4,
    }
    out, plan = optimise(ANTHROPIC, body, min_tokens=NO_NEW)
    assert orjson.dumps(out) == orjson.dumps(
        {
            "model": MODEL,
            "max_tokens": 4,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": [_text("hi")]}],
        }
    )
    assert plan.markers == ()
