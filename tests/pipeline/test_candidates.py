"""Breakpoint candidates at the end of the tools and at the end of the last block that survived
the previous turn (issue 12, findings 8 and 9).

Pure: the planner's positions and reasons. Through the simulator, exact usage: a second
conversation that shares the tools but not the system prompt reads the tools; an aider-like
client without markers that rebuilds everything after its history every turn reads the examples
and the history the turn before kept from its third turn on (only the system prompt without).
"""

from __future__ import annotations

import copy
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.pacing import Forecast
from proxy.pipeline.breakpoints import PacingInput, PlanContext, place_breakpoints
from proxy.providers import ANTHROPIC
from tests.pipeline.test_simulator import GUIDE, HEADERS, MODEL, PROBE, _tokens
from tests.pipeline.test_simulator_turns import _both

MESSAGES = "/v1/messages"

TOOLS = [
    {
        "name": f"tool_{i}",
        "description": " ".join(f"Step {k} of tool {i}: check the inputs, then act once." for k in range(30)),
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for i in range(6)
]


def _request(system: str, question: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 32,
        "tools": TOOLS,
        "system": [{"type": "text", "text": system}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}],
    }


def test_a_free_slot_goes_to_the_end_of_the_tools() -> None:
    body = _request("You are a careful assistant.", "hello")
    before = copy.deepcopy(body)
    out, plan = place_breakpoints(ANTHROPIC, body, context=PlanContext())
    assert [(m.index, m.reason, m.ttl) for m in plan.markers] == [
        (5, "tools", "5m"),
        (6, "shared", "5m"),
        (7, "last", "5m"),
    ]
    assert out["tools"][5]["cache_control"] == {"type": "ephemeral"}
    assert body == before
    assert place_breakpoints(ANTHROPIC, out, context=PlanContext())[0] == out
    # the shared TTL is the tools' TTL too
    _, long_plan = place_breakpoints(ANTHROPIC, body, context=PlanContext(ttl_shared="1h"))
    assert [(m.reason, m.ttl) for m in long_plan.markers] == [("tools", "1h"), ("shared", "1h"), ("last", "5m")]


async def test_a_conversation_sharing_only_the_tools_reads_them(make_proxy: Any) -> None:
    first = _request(GUIDE, "Question from the first conversation?")
    second = _request("You review pull requests for a small team.\n" + GUIDE[::-1], "Another question?")
    async with _both(make_proxy, [(MESSAGES, first), (MESSAGES, second)], HEADERS) as runs:
        async with aiohttp.ClientSession() as client:

            async def count(payload: dict[str, Any]) -> int:
                async with client.post(
                    f"{runs.sim}/v1/messages/count_tokens", data=orjson.dumps(payload), headers=HEADERS
                ) as resp:
                    return (await resp.json())["input_tokens"]

            tools = await count({"model": MODEL, "tools": TOOLS, "messages": [PROBE]}) - await count(
                {"model": MODEL, "messages": [PROBE]}
            )
        assert tools > 1024
        assert [u["cache_read_input_tokens"] for u in runs.direct] == [0, 0]  # no markers at all
        assert runs.usages[1]["cache_read_input_tokens"] == tools
        assert "cache_control" in runs.sent[1]["tools"][-1]


# --- aider without client markers ---------------------------------------------------------------

EXAMPLES = [
    (
        f"Example request {k}: change the helper in module {k} to use the standard library.",
        "To make this change we need to modify the module:\n"
        + "\n".join(f"line {j} of the edit {k}" for j in range(40)),
    )
    for k in range(4)
]
FILES = "I have *added these files to the chat* so you can go ahead and edit them.\n" + GUIDE[:1500]


def _aider(turn: int) -> dict[str, Any]:
    """aider's layout: the few-shot examples, then the conversation so far, then the files
    message (rebuilt behind the history every turn), then the newest question."""
    messages: list[dict[str, Any]] = []
    for question, answer in EXAMPLES:
        messages.append({"role": "user", "content": [{"type": "text", "text": question}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    for k in range(turn):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"Question {k}?"}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Answer {k}."}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": FILES}]})
    messages.append(
        {"role": "assistant", "content": [{"type": "text", "text": "Ok, any changes will be to those files."}]}
    )
    messages.append({"role": "user", "content": [{"type": "text", "text": f"Question {turn}?"}]})
    return {"model": MODEL, "max_tokens": 32, "system": [{"type": "text", "text": GUIDE}], "messages": messages}


def test_the_last_surviving_block_is_a_candidate() -> None:
    body = _aider(2)  # blocks: system 0, examples 1..8, history 9..12, files 13..14, newest 15
    _, plan = place_breakpoints(ANTHROPIC, body, context=PlanContext(rewritten_from=8))
    assert [(m.index, m.reason) for m in plan.markers] == [(0, "shared"), (8, "survivor"), (14, "turn"), (15, "last")]
    _, plain = place_breakpoints(ANTHROPIC, body, context=PlanContext())
    assert "survivor" not in [m.reason for m in plain.markers]


@pytest.mark.parametrize("turns", [5])
async def test_aider_without_markers_reads_its_examples(make_proxy: Any, turns: int) -> None:
    bodies = [(MESSAGES, _aider(turn)) for turn in range(turns)]
    async with _both(make_proxy, bodies, HEADERS) as runs:  # no session header: inferred
        system = await _tokens(runs.sim, runs.sent[0], 0)
        reads = [u["cache_read_input_tokens"] for u in runs.usages]
        assert reads[:2] == [0, system]
        # turn k reads what turn k - 1 kept: the examples and the k - 2 exchanges after them
        for k in range(2, turns):
            assert reads[k] == await _tokens(runs.sim, runs.sent[k], 2 * len(EXAMPLES) + 2 * (k - 2)), k
        assert all(u["cache_read_input_tokens"] == 0 for u in runs.direct)


def test_with_a_1h_tail_the_session_system_end_outranks_the_anchor() -> None:
    """Claude Code marks two system blocks and its newest message: one free slot. With the tail
    written 1h, the anchor adds nothing the tail does not keep (the tail's read reaches it within
    the lookback), so the slot goes to the end of the session system, which the tenant's next
    conversation reads; with a 5m tail the anchor keeps its slot (it outlives the tail)."""
    eph = {"type": "ephemeral"}
    body = {
        "model": MODEL,
        "max_tokens": 32,
        "system": [
            {"type": "text", "text": "You are an agent.", "cache_control": eph},
            {"type": "text", "text": GUIDE, "cache_control": eph},
            {"type": "text", "text": "# Memory\n\nThe project keeps its notes here."},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q0"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a0"}]},
            {"role": "user", "content": [{"type": "text", "text": "q1", "cache_control": eph}]},
        ],
    }
    tiers = ("stable", "stable", "session")

    def plan(next_hour: float) -> list[tuple[int, str | None, str]]:
        forecast = Forecast(p_end=1.0, human_soon=1 - next_hour, human_hour=next_hour, tool_soon=1.0, tool_hour=0.0)
        context = PlanContext((0, 1, 2, 3), pacing=PacingInput(forecast))
        _, got = place_breakpoints(ANTHROPIC, body, system_tiers=tiers, context=context)
        return [(m.index, m.ttl, m.reason) for m in got.markers]

    assert plan(1.0) == [(0, "1h", "client"), (1, "1h", "client"), (2, "1h", "session"), (5, "1h", "client")]
    assert plan(0.0) == [(0, "1h", "client"), (1, "1h", "client"), (3, "1h", "anchor"), (5, "5m", "client")]
