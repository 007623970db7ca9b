"""What the real APIs reject, kept out of what promptcache sends (issue 12, findings 1 and 2).

1. Responses input item ids are unique (docs/provider-rules.md 9): reorder splitting a developer item keeps
   its `id` on one part only.
2. Programmatic tool calling (1.3): no marker on a `tool_use` whose caller is the code-execution
   tool or on its `tool_result`; a client's marker there moves to the nearest legal block.

Pure checks on the stages, then the official SDKs through promptcache in front of the simulator
(which answers both faults 400, tests/sim/test_sim_sdk.py).
"""

from __future__ import annotations

import copy
from typing import Any

import anthropic
import openai
import pytest

from proxy.pipeline.breakpoints import PlanContext, place_breakpoints
from proxy.pipeline.reorder import reorder_body
from proxy.providers import ANTHROPIC, OPENAI_RESPONSES
from proxy.rules import cached_rules
from tests.pipeline.test_simulator import GUIDE

sim_app = pytest.importorskip("proxy.sim.app")
sim_clock = pytest.importorskip("proxy.sim.clock")

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
MODEL = "claude-sonnet-4-6"
EPH = {"type": "ephemeral"}


def _codex_like() -> dict[str, Any]:
    """Two developer items with ids; the first carries a memory section (session tier), so the
    stable text of the second sorts between the first's two parts."""
    return {
        "model": "gpt-5.5",
        "instructions": "You are a coding agent.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "id": "msg_dev_1",
                "content": [{"type": "input_text", "text": f"{GUIDE}\n\n## Memory\n- the user prefers tabs\n"}],
            },
            {
                "type": "message",
                "role": "developer",
                "id": "msg_dev_2",
                "content": [{"type": "input_text", "text": "Sandbox: workspace-write."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]},
        ],
    }


def test_a_split_item_keeps_its_id_on_one_part() -> None:
    body = _codex_like()
    before = copy.deepcopy(body)
    out, plan = reorder_body(OPENAI_RESPONSES, body, cached_rules(None))
    assert plan.tiers == ("stable", "stable", "stable", "session")
    ids = [item.get("id") for item in out["input"]]
    assert ids == ["msg_dev_1", "msg_dev_2", None, None]
    assert out["input"][2]["content"][0]["text"] == "## Memory\n- the user prefers tabs\n"
    assert body == before
    assert reorder_body(OPENAI_RESPONSES, out, cached_rules(None))[0] == out


async def test_codex_like_request_is_accepted_through_promptcache(make_proxy: Any) -> None:
    runner, sim = await sim_app.start_sim("127.0.0.1", 0, clock=sim_clock.Clock.manual_at())
    try:
        proxy = await make_proxy(upstream=sim)
        body = _codex_like()
        async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-sim", max_retries=0) as client:
            response = await client.responses.create(**body)
            assert response.status == "completed"
    finally:
        await runner.cleanup()


# --- programmatic tool calling -------------------------------------------------------------------


def _programmatic(client_marker: bool) -> dict[str, Any]:
    call = {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "get_weather",
        "input": {"city": "Paris"},
        "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_01"},
    }
    result = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"}
    return {
        "model": MODEL,
        "max_tokens": 16,
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": GUIDE}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Running code."}, call]},
            {"role": "user", "content": [{**result, "cache_control": EPH} if client_marker else result]},
        ],
    }


def test_no_marker_on_code_execution_calls_or_their_results() -> None:
    body = _programmatic(client_marker=False)  # blocks: tool 0, system 1, messages 2..5
    before = copy.deepcopy(body)
    out, plan = place_breakpoints(ANTHROPIC, body, context=PlanContext())
    assert [(m.index, m.reason) for m in plan.markers] == [(0, "tools"), (1, "shared"), (3, "last")]
    assert "cache_control" not in out["messages"][1]["content"][1]
    assert "cache_control" not in out["messages"][2]["content"][0]
    assert body == before
    marked, moved = place_breakpoints(ANTHROPIC, _programmatic(client_marker=True), context=PlanContext())
    assert [(m.index, m.origin) for m in moved.markers] == [(0, "injected"), (1, "injected"), (3, "moved")]
    assert "cache_control" not in marked["messages"][2]["content"][0]
    # a direct call (no code-execution caller) keeps its result's marker
    direct = _programmatic(client_marker=True)
    del direct["messages"][1]["content"][1]["caller"]
    _, kept = place_breakpoints(ANTHROPIC, direct, context=PlanContext())
    assert (5, "client") in [(m.index, m.origin) for m in kept.markers]


async def test_programmatic_call_is_accepted_through_promptcache(make_proxy: Any) -> None:
    runner, sim = await sim_app.start_sim("127.0.0.1", 0, clock=sim_clock.Clock.manual_at())
    try:
        proxy = await make_proxy(upstream=sim)
        body = _programmatic(client_marker=True)
        async with anthropic.AsyncAnthropic(base_url=sim, api_key="sk-ant-sim", max_retries=0) as client:
            with pytest.raises(anthropic.BadRequestError):
                await client.messages.create(**body)
        async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-ant-sim", max_retries=0) as client:
            message = await client.messages.create(**body)
            assert message.stop_reason == "end_turn"
    finally:
        await runner.cleanup()
