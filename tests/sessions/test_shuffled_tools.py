"""Session inference does not depend on tool order (issue 12, finding 3).

A client that shuffles its 6 tools (and their schema keys) every turn, with a 120-guideline
system prompt, no markers and no session hint: the session is inferred from the tool SET, so
canonicalise pins the first-seen tool order and every turn after the first reads the previous
request (>= 90% of its input from cache on turns 2..10), straight to the simulator nothing.
"""

from __future__ import annotations

import random
from typing import Any

from proxy.pipeline.replay import Masker, view_messages
from proxy.providers import ANTHROPIC
from tests.pipeline.test_simulator import HEADERS, MODEL
from tests.pipeline.test_simulator_turns import _both

MESSAGES = "/v1/messages"
GUIDELINES = "\n".join(
    f"Guideline {i}: prefer small, reviewed changes in area {i}; state the risk of each change." for i in range(120)
)


def _tools(turn: int) -> list[dict[str, Any]]:
    rng = random.Random(turn)
    tools = []
    for i in range(6):
        props = {f"arg_{k}": {"type": "string", "description": f"argument {k} of tool {i}"} for k in range(4)}
        keys = list(props)
        rng.shuffle(keys)
        schema = {"type": "object", "properties": {k: props[k] for k in keys}}
        tools.append({"name": f"tool_{i}", "description": f"Tool number {i}.", "input_schema": schema})
    rng.shuffle(tools)
    return tools


def _body(turn: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for k in range(turn + 1):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"Request {k}: tidy module {k}."}]})
        if k < turn:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Tidied module {k}."}]})
    return {"model": MODEL, "max_tokens": 32, "tools": _tools(turn), "system": GUIDELINES, "messages": messages}


def test_identity_ignores_tool_order() -> None:
    masker = Masker()
    first = view_messages(ANTHROPIC, _body(1), masker)
    shuffled = view_messages(ANTHROPIC, {**_body(1), "tools": _tools(7)}, masker)
    assert first.boundaries == shuffled.boundaries
    fewer = view_messages(ANTHROPIC, {**_body(1), "tools": _tools(1)[:5]}, masker)
    assert fewer.head != first.head  # another tool set is another prefix


async def test_a_client_shuffling_its_tools_reads_from_turn_two(make_proxy: Any) -> None:
    bodies = [(MESSAGES, _body(turn)) for turn in range(10)]
    async with _both(make_proxy, bodies, HEADERS) as runs:
        def share(u: dict[str, Any]) -> float:
            total = u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] + u["input_tokens"]
            return u["cache_read_input_tokens"] / total

        assert all(u["cache_read_input_tokens"] == 0 for u in runs.direct)
        shares = [share(u) for u in runs.usages]
        assert shares[0] == 0
        assert min(shares[1:]) >= 0.90, shares
        assert len({tuple(t["name"] for t in body["tools"]) for body in runs.sent}) == 1
