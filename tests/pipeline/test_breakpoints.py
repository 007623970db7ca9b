"""The breakpoint planner: candidates, lookback bridge, minimums, TTLs, capabilities, OpenAI."""

from __future__ import annotations

from proxy.pipeline.breakpoints import PlanContext, place_breakpoints
from proxy.providers import ANTHROPIC, OPENAI_CHAT
from proxy.settings import UpstreamCapabilities
from tests.pipeline.helpers import optimise

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
EPH = {"type": "ephemeral"}


def _chat(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)]


def _marked(body: dict, key: str = "cache_control") -> list[int]:
    blocks = (
        ANTHROPIC.prefix_blocks(body)
        if key == "cache_control"
        else OPENAI_CHAT.prefix_blocks(body)
    )
    return [i for i, b in enumerate(blocks) if isinstance(b.value, dict) and b.value.get(key) is not None]


def test_bridge_within_twenty_positions_of_the_previous_breakpoint() -> None:
    body = {"model": "claude-sonnet-4-6", "messages": _chat(41)}
    out, plan = place_breakpoints(ANTHROPIC, body, context=PlanContext(previous_breakpoints=(5,)))
    assert [(m.index, m.reason) for m in plan.markers] == [(24, "bridge"), (39, "turn"), (40, "last")]
    assert _marked(out) == [24, 39, 40]
    near, near_plan = place_breakpoints(
        ANTHROPIC, body, context=PlanContext(previous_breakpoints=(25,))
    )
    assert "bridge" not in [m.reason for m in near_plan.markers]


def test_runs_of_tool_use_and_tool_result_count_as_one_lookback_position() -> None:
    calls = [{"type": "tool_use", "id": f"t{i}", "name": "read", "input": {}} for i in range(25)]
    results = [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"} for i in range(25)]
    messages = [*_chat(3), {"role": "assistant", "content": calls}, {"role": "user", "content": results}]
    body = {"model": "claude-sonnet-4-6", "messages": messages}
    _, plan = place_breakpoints(ANTHROPIC, body, context=PlanContext(previous_breakpoints=(2,)))
    assert [m.reason for m in plan.markers] == ["turn", "last"]
    texts = [{"type": "text", "text": f"part {i}"} for i in range(25)]
    flat = {
        "model": "claude-sonnet-4-6",
        "messages": [*_chat(3), {"role": "assistant", "content": texts}, {"role": "user", "content": "next"}],
    }
    _, flat_plan = place_breakpoints(
        ANTHROPIC, flat, context=PlanContext(previous_breakpoints=(2,))
    )
    assert [(m.index, m.reason) for m in flat_plan.markers] == [(21, "bridge"), (27, "turn"), (28, "last")]


def test_no_new_marker_under_the_model_minimum() -> None:
    body = {"model": "claude-opus-4-6", "system": "Short prompt.", "messages": _chat(3)}
    out, plan = optimise(ANTHROPIC, body)
    assert plan.markers == () and out == body
    long_body = {**body, "system": "word " * 4000}
    _, long_plan = optimise(ANTHROPIC, long_body)
    assert [m.reason for m in long_plan.markers] == ["shared", "turn", "last"]


def test_ttls_from_the_plan_context_keep_one_hour_first() -> None:
    body = {"model": "m", "system": "word " * 2000, "messages": _chat(3)}
    context = PlanContext(ttl_shared="1h", ttl_session="5m")
    out, plan = place_breakpoints(ANTHROPIC, body, context=context)
    assert [(m.index, m.ttl) for m in plan.markers] == [(0, "1h"), (2, "5m"), (3, "5m")]
    assert out["system"] == [
        {"type": "text", "text": "word " * 2000, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]
    upgraded, plan2 = place_breakpoints(ANTHROPIC, body, context=PlanContext(ttl_session="1h"))
    assert [m.ttl for m in plan2.markers] == ["1h", "1h", "1h"]


def test_one_hour_pacing_lengthens_the_client_markers_and_never_shortens_them() -> None:
    body = {
        "model": "m",
        "system": [{"type": "text", "text": "word " * 2000, "cache_control": EPH}],
        "messages": [
            *_chat(2),
            {
                "role": "user",
                "content": [{"type": "text", "text": "q", "cache_control": {**EPH, "ttl": "5m"}}],
            },
        ],
    }
    paced, plan = place_breakpoints(
        ANTHROPIC, body, context=PlanContext(ttl_shared="1h", ttl_session="1h")
    )
    assert [(m.index, m.ttl, m.origin, m.reason) for m in plan.markers] == [
        (0, "1h", "client", "client"),
        (2, "1h", "injected", "turn"),
        (3, "1h", "client", "client"),
    ]
    assert paced["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert paced["messages"][2]["content"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert place_breakpoints(ANTHROPIC, paced, context=PlanContext(ttl_session="1h"))[0] == paced
    short, short_plan = place_breakpoints(ANTHROPIC, body, context=PlanContext())
    assert [m.ttl for m in short_plan.markers] == ["5m", "5m", "5m"]
    assert short["messages"][2]["content"][0]["cache_control"] == {**EPH, "ttl": "5m"}
    kept, _ = place_breakpoints(ANTHROPIC, paced, context=PlanContext())
    assert kept["messages"][2]["content"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    stripped, _ = place_breakpoints(
        ANTHROPIC,
        body,
        context=PlanContext(ttl_session="1h"),
        caps=UpstreamCapabilities(strip_ttl=True),
    )
    assert stripped["system"][0]["cache_control"] == EPH


def test_capabilities_strip_ttl_and_scope_and_keep_markers_off_tool_results() -> None:
    results = [{"type": "tool_result", "tool_use_id": "t", "content": "ok", "cache_control": EPH}]
    body = {
        "model": "m",
        "system": [
            {
                "type": "text",
                "text": "Rules.",
                "cache_control": {"type": "ephemeral", "ttl": "1h", "scope": "global"},
            }
        ],
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]},
            {"role": "user", "content": results},
        ],
    }
    caps = UpstreamCapabilities(strip_ttl=True, strip_scope=True, no_tool_message_markers=True)
    out, plan = place_breakpoints(ANTHROPIC, body, caps=caps)
    assert out["system"][0]["cache_control"] == EPH
    assert out["messages"][1]["content"][0]["cache_control"] == EPH
    assert "cache_control" not in out["messages"][2]["content"][0]
    assert [(m.index, m.origin) for m in plan.markers] == [(0, "client"), (2, "moved")]


def test_injected_markers_before_a_scoped_client_marker_take_its_scope() -> None:
    scoped = {"type": "ephemeral", "scope": "global"}
    body = {
        "model": "m",
        "tools": [{"name": "read", "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": "Rules.", "cache_control": scoped}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    out, _ = place_breakpoints(ANTHROPIC, body, system_tiers=("session",))
    assert out["tools"][0]["cache_control"] == scoped
    assert out["messages"][0]["content"] == [{"type": "text", "text": "hi", "cache_control": EPH}]


def test_openai_before_gpt_5_6_gets_a_prefix_key_and_no_markers() -> None:
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    first = {
        "model": "gpt-5.1",
        "tools": tools,
        "messages": [{"role": "system", "content": "Be brief."}, *_chat(1)],
    }
    second = {**first, "messages": [{"role": "system", "content": "Be brief."}, *_chat(3)]}
    other = {**first, "tools": []}
    out1, plan1 = optimise(OPENAI_CHAT, first)
    out2, _ = optimise(OPENAI_CHAT, second)
    out3, _ = optimise(OPENAI_CHAT, other)
    assert plan1.cache_key is not None and plan1.cache_key.startswith("pc-")
    assert out1["prompt_cache_key"] == out2["prompt_cache_key"] != out3["prompt_cache_key"]
    assert list(out1) == ["model", "prompt_cache_key", "tools", "messages"]
    assert _marked(out1, "prompt_cache_breakpoint") == []
    kept, plan = optimise(OPENAI_CHAT, {**first, "prompt_cache_key": "client-key"})
    assert kept["prompt_cache_key"] == "client-key" and plan.cache_key is None


def test_the_prefix_key_digests_the_head_the_adapter_names() -> None:
    """The key covers `MarkerPolicy.cache_key_tokens` of tools + stable system (OpenAI: 1,024
    tokens, docs/provider-rules.md 2.1): system texts that differ only past 4,096 bytes share it."""
    import dataclasses

    from proxy.pipeline.layout import LayoutCache
    from proxy.pipeline.planner import prefix_cache_key

    def key(text: str, tokens: int | None = None) -> str | None:
        body = {"model": "gpt-5.1", "messages": [{"role": "system", "content": text}, *_chat(1)]}
        policy = OPENAI_CHAT.marker_policy(body)
        assert policy.cache_key_tokens == 1024
        if tokens is not None:
            policy = dataclasses.replace(policy, cache_key_tokens=tokens)
        view = LayoutCache().view(OPENAI_CHAT, body, policy, frozenset())[0]
        return prefix_cache_key(view, policy, 0)

    head = "a" * 5000
    assert key(head + "x") == key(head + "y")
    assert key("b" * 100 + "x") != key("b" * 100 + "y")
    assert key("b" * 100 + "x", tokens=10) == key("b" * 100 + "y", tokens=10)


def test_openai_breakpoints_on_gpt_5_6_only_on_user_system_tool_parts() -> None:
    body = {
        "model": "gpt-5.6",
        "messages": [
            {"role": "system", "content": "word " * 2000},
            {"role": "user", "content": "question"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "answer", "prompt_cache_breakpoint": {"mode": "explicit"}}
                ],
            },
            {"role": "user", "content": "more"},
        ],
    }
    out, plan = optimise(OPENAI_CHAT, body)
    marker = {"mode": "explicit"}
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "word " * 2000, "prompt_cache_breakpoint": marker}
    ]
    assert out["messages"][1]["content"] == [
        {"type": "text", "text": "question", "prompt_cache_breakpoint": marker}
    ]
    assert out["messages"][2]["content"] == [{"type": "text", "text": "answer"}]
    assert out["messages"][3]["content"] == [
        {"type": "text", "text": "more", "prompt_cache_breakpoint": marker}
    ]
    assert len(plan.markers) == 3  # implicit mode: the automatic breakpoint takes the 4th slot
    assert plan.markers[1].origin == "moved"
