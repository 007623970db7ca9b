"""Notes ahead of the history move whole, behind it (issue 12, finding 4).

A Responses agent (gpt-5.5, automatic caching, no `prompt_cache_key`, no session hint): short
instructions, then a timestamped `## Memory (updated ...)` section and a `## Todo (updated ...)`
checklist that changes every turn, then the history. The notes travel either at the end of
`instructions` or as a developer input item with an `id` before the history. Straight to the
simulator nothing is ever read (the notes change ahead of everything cacheable). Through
promptcache (default SQLite store) each heading carries its whole section onto the newest user
message, the developer item that held only notes leaves the array, the session is still found
(identity ignores the volatile notes) and replay sends each earlier user message with the notes
it was first sent with: every turn after the first reads the whole previous request.

Driven by the official `openai` SDK; a recording relay between promptcache and the simulator
gives the bodies the simulator received, and the expected reads come from the simulator's own
renderer on them (`proxy.sim.openai.render_responses`: 1,024 tokens, then 128-token steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from proxy.pipeline.segments import classifier_for
from proxy.rules import cached_rules
from proxy.sim.openai import render_responses
from proxy.sim.tokens import TokenCounter
from tests.pipeline.test_simulator import Relay

sim_app = pytest.importorskip("proxy.sim.app")
sim_clock = pytest.importorskip("proxy.sim.clock")

MODEL = "gpt-5.5"
TURNS = 10
INSTRUCTIONS = "You are a coding agent in the user's terminal. Keep changes small and say what you changed."
TASKS = [f"update module {k} and its tests" for k in range(TURNS + 2)]
FILE = "\n".join(
    f"def step_{j}(value_{j}):\n    return compute(value_{j}, step={j}, scale={j % 7})" for j in range(260)
)
"""The file the first message pastes (about 6k tokens): the history is what can be cached."""
TOOLS = [
    {
        "type": "function",
        "name": name,
        "description": f"{name}: run one step of the agent's work on the workspace and return its output.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "A path."}}},
        "strict": False,
    }
    for name in ("read_file", "apply_patch")
]


def notes(turn: int) -> str:
    """The memory (updated once, at turn 4) and the todo checklist (ticked off every turn)."""
    memory = ["- The user prefers tabs.", "- Tests run with `scripts/test`."]
    memory_at = "2026-12-01T09:00:00Z"
    if turn >= 4:
        memory.append("- The CI entry point is `.ci/run`.")
        memory_at = "2026-12-01T09:04:00Z"
    todo = [f"- [{'x' if k < turn else ' '}] {TASKS[k]}" for k in range(turn + 2)]
    return (
        f"## Memory (updated {memory_at})\n" + "\n".join(memory) + "\n\n"
        f"## Todo (updated 2026-12-01T09:{turn:02d}:30Z)\n" + "\n".join(todo) + "\n"
    )


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _history(turn: int) -> list[dict[str, Any]]:
    items = [_user(f"Please {TASKS[0]}. Here is the file:\n\n{FILE}")]
    for k in range(turn):
        call = f"call_{k}"
        arguments = f'{{"path": "m{k}.py"}}'
        items.append({"type": "function_call", "call_id": call, "name": "read_file", "arguments": arguments})
        items.append({"type": "function_call_output", "call_id": call, "output": f"def f{k}():\n    return {k}"})
        answer = [{"type": "output_text", "text": f"Updated m{k}.py."}]
        items.append({"type": "message", "role": "assistant", "content": answer})
        items.append(_user(f"Please {TASKS[k + 1]}."))
    return items


def body(turn: int, where: str) -> dict[str, Any]:
    """Turn `turn` as the client sends it, the notes in `instructions` or in a developer item."""
    if where == "instructions":
        instructions = f"{INSTRUCTIONS}\n\n{notes(turn)}"
        return {"model": MODEL, "tools": TOOLS, "instructions": instructions, "input": _history(turn)}
    content = [{"type": "input_text", "text": notes(turn)}]
    item = {"type": "message", "role": "developer", "id": "msg_notes", "content": content}
    return {"model": MODEL, "tools": TOOLS, "instructions": INSTRUCTIONS, "input": [item, *_history(turn)]}


def test_a_heading_carries_its_section() -> None:
    classifier = classifier_for(cached_rules(None))
    text = f"{INSTRUCTIONS}\n\n{notes(3)}"
    got = [(s.tier, s.rule, s.move_to_user, s.text.split("\n")[0]) for s in classifier.segments(text)]
    assert got == [
        ("stable", None, False, INSTRUCTIONS),
        ("volatile", "timestamp", True, "## Memory (updated 2026-12-01T09:00:00Z)"),
        ("volatile", "timestamp", True, "## Todo (updated 2026-12-01T09:03:30Z)"),
    ]
    assert "".join(s.text for s in classifier.segments(text)) == text
    # without a volatile value in its heading, a memory section is one session segment up to the
    # next heading of its level (not up to the next top-level heading: `## Todo` ends it)
    plain = "## Memory\n- tabs\n\n### Details\n- more\n\n## Todo\n- [ ] a\n"
    assert [(s.tier, s.rule, s.text) for s in classifier.segments(plain)] == [
        ("session", "memory-heading", "## Memory\n- tabs\n\n### Details\n- more\n\n"),
        ("stable", None, "## Todo\n- [ ] a\n"),
    ]


async def _run(base: str, sim: str, where: str) -> list[Any]:
    usages = []
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-sim-notes", max_retries=0) as client:
        async with aiohttp.ClientSession() as http:
            for turn in range(TURNS):
                response = await client.responses.create(**body(turn, where))
                assert response.usage is not None
                usages.append(response.usage)
                async with http.post(f"{sim}/_sim/clock", json={"advance": 30}) as resp:
                    assert resp.status == 200
    return usages


def _common(a: Any, b: Any) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@pytest.mark.parametrize("where", ["instructions", "developer"])
async def test_notes_ahead_of_the_history_move_behind_it(make_proxy: Any, tmp_path: Path, where: str) -> None:
    runner, sim = await sim_app.start_sim("127.0.0.1", 0, clock=sim_clock.Clock.manual_at())
    relay = Relay(sim)
    try:
        await relay.start()
        direct = await _run(sim, sim, where)
        assert [u.input_tokens_details.cached_tokens for u in direct] == [0] * TURNS
        async with aiohttp.ClientSession() as http:
            async with http.delete(f"{sim}/_sim/cache") as resp:
                assert resp.status == 200
        proxy = await make_proxy(upstream=relay.url, store=f"sqlite:///{tmp_path}/sessions.db", state_dir=str(tmp_path))
        usages = await _run(proxy.url, sim, where)
        sent = relay.bodies
        counter = TokenCounter()
        rendered = [render_responses(b, counter).tokens for b in sent]
        for turn, (b, usage) in enumerate(zip(sent, usages, strict=True)):
            assert b["instructions"].rstrip("\n") == INSTRUCTIONS
            assert [item.get("role") for item in b["input"]][0] == "user"  # the developer item left
            newest = b["input"][-1]["content"]
            assert newest[0]["text"] == notes(turn), f"turn {turn}"  # the notes, whole, once
            assert usage.input_tokens == len(rendered[turn])
        cached = [u.input_tokens_details.cached_tokens for u in usages]
        assert cached[0] == 0
        for turn in range(1, TURNS):
            before, now = rendered[turn - 1], rendered[turn]
            common = _common(before, now)
            assert common >= len(before) - 3, f"turn {turn}"  # all but the reply priming
            assert cached[turn] == 1024 + (common - 1024) // 128 * 128, f"turn {turn}"
        shares = [c / u.input_tokens for c, u in zip(cached, usages, strict=True)]
        assert min(shares[1:]) >= 0.9, shares
        assert len({b["prompt_cache_key"] for b in sent}) == 1  # the injected key digests no note
    finally:
        if relay.runner is not None:
            await relay.runner.cleanup()
        await runner.cleanup()
