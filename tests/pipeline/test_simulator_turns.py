"""Through the simulator, exact usage per turn: volatile system text moved onto the newest user
message (Claude Code billing header in a tool loop; a Codex-style `<environment_context>` on the
Responses API), and a person's long gaps (pacing makes the tail marker 1h).

Every conversation runs twice against one simulator with a manual clock: straight to it, and
through promptcache (packaged rules, memory store) with a recording relay in front of the
simulator, so expected numbers come from the bodies the simulator actually received (Anthropic:
its own `count_tokens`; OpenAI: its own renderer). Conversations are built by the test (the
simulator's replies are not fed back), so both runs send the same client bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.appkeys import SERVICES
from proxy.sim.openai import render_responses
from proxy.sim.tokens import TokenCounter
from tests.pipeline.test_simulator import GUIDE, HEADERS, Relay, _tokens, _unmarked

sim_app = pytest.importorskip("proxy.sim.app")
sim_clock = pytest.importorskip("proxy.sim.clock")

SONNET = "claude-sonnet-4-6"
SESSION = "5b0e2f1c-7a4d-4c0e-9a51-0d6f8e2b3c47"
BETAS = "claude-code-20250219"
OPENAI_HEADERS = {
    "authorization": "Bearer sk-sim-test",
    "content-type": "application/json",
    "x-session-id": SESSION,
}


async def _run(
    base: str, sim: str, bodies: list[tuple[str, dict[str, Any]]], headers: dict[str, str], gap: float
) -> list[dict[str, Any]]:
    """Send each `(path, body)`, moving the simulator's clock by `gap` seconds after each."""
    usages = []
    async with aiohttp.ClientSession() as client:
        for path, body in bodies:
            async with client.post(f"{base}{path}", data=orjson.dumps(body), headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                usages.append((await resp.json())["usage"])
            async with client.post(f"{sim}/_sim/clock", json={"advance": gap}) as resp:
                assert resp.status == 200
    return usages


@dataclass(frozen=True, slots=True)
class Runs:
    direct: list[dict[str, Any]]
    """Usage per request sent straight to the simulator."""
    usages: list[dict[str, Any]]
    """Usage per request sent through promptcache."""
    sent: list[dict[str, Any]]
    """The bodies the simulator received through promptcache."""
    sim: str


@contextlib.asynccontextmanager
async def _both(
    make_proxy: Callable[..., Any],
    bodies: list[tuple[str, dict[str, Any]]],
    headers: dict[str, str],
    gap: float = 10.0,
) -> AsyncIterator[Runs]:
    """Run the conversation straight, flush the cache, run it through promptcache (its session
    clock follows the simulator's gaps, so pacing sees them)."""
    runner, sim = await sim_app.start_sim("127.0.0.1", 0, clock=sim_clock.Clock.manual_at())
    relay = Relay(sim)
    try:
        await relay.start()
        direct = await _run(sim, sim, bodies, headers, gap)
        async with aiohttp.ClientSession() as client:
            async with client.delete(f"{sim}/_sim/cache") as resp:
                assert resp.status == 200
        proxy = await make_proxy(upstream=relay.url)
        now = [0.0]
        proxy.runner.app[SERVICES].sessions.clock = lambda: now[0]
        usages = []
        for path, body in bodies:
            usages.extend(await _run(proxy.url, sim, [(path, body)], headers, gap))
            now[0] += gap
        yield Runs(direct, usages, relay.bodies, sim)
    finally:
        if relay.runner is not None:
            await relay.runner.cleanup()
        await runner.cleanup()


# --- Claude Code: billing header, tool loop ---------------------------------------------


def _billing(turn: int) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.328.a1b; cc_entrypoint=cli; cch={turn:05x};"


def _claude_code_body(turn: int) -> dict[str, Any]:
    """Turn `turn` of a tool loop: the question, then `turn` tool calls with their results; the
    client marks the last system block and the last block of the last message (5m)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the tests."}]}
    ]
    for step in range(turn):
        call = {
            "type": "tool_use",
            "id": f"toolu_{step:02d}",
            "name": "Read",
            "input": {"path": f"m{step}.py"},
        }
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Step {step}."}, call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{step:02d}", "content": f"def f{step}(): ..."}
        messages.append({"role": "user", "content": [result]})
    last = messages[-1]["content"][-1]
    messages[-1]["content"][-1] = {**last, "cache_control": {"type": "ephemeral"}}
    return {
        "model": SONNET,
        "max_tokens": 64,
        "tools": [{"name": "Read", "description": "Read a file.", "input_schema": {"type": "object"}}],
        "system": [
            {"type": "text", "text": _billing(turn)},
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": GUIDE, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": messages,
    }


async def test_changed_billing_header_stays_first_as_first_seen_and_its_value_rides_the_newest_message(
    make_proxy,
) -> None:
    """A billing header whose `cch` changes every turn: the first system block stays the
    first-seen header (API-significant, pinned), each new value goes onto the newest user
    message once, and every turn reads all of the previous turn."""
    bodies = [("/v1/messages", _claude_code_body(turn)) for turn in range(6)]
    headers = {**HEADERS, "anthropic-beta": BETAS, "x-claude-code-session-id": SESSION}
    async with _both(make_proxy, bodies, headers) as runs:
        direct, usages, sent, sim = runs.direct, runs.usages, runs.sent, runs.sim
        assert [u["cache_read_input_tokens"] for u in direct] == [0] * 6
        system = _unmarked({"content": sent[0]["system"]})  # marker TTLs follow pacing (proxy.pacing)
        assert all(_unmarked({"content": b["system"]}) == system for b in sent), "system prompt must be byte-stable"
        assert system["content"][0] == {"type": "text", "text": _billing(0)}
        previous_total = 0
        for turn, (usage, body) in enumerate(zip(usages, sent, strict=True)):
            newest = _unmarked(body["messages"][-1])["content"]
            head = [b for b in newest if b["type"] == "tool_result"]
            if turn:
                assert newest[len(head)] == {"type": "text", "text": _billing(turn)}, f"turn {turn + 1}"
                before = sent[turn - 1]["messages"]
                now = body["messages"][: len(before)]
                assert [_unmarked(m) for m in now] == [_unmarked(m) for m in before], f"turn {turn + 1}"
            else:  # the first request is the first-seen header: nothing moves
                assert newest == _unmarked(_claude_code_body(0)["messages"][-1])["content"]
            total = await _tokens(sim, body, len(body["messages"]))
            assert usage["cache_read_input_tokens"] == previous_total, f"turn {turn + 1}"
            assert usage["cache_creation_input_tokens"] == total - previous_total, f"turn {turn + 1}"
            assert usage["input_tokens"] == 0, f"turn {turn + 1}"
            previous_total = total


async def test_unchanged_billing_header_is_sent_as_the_client_sent_it_and_no_turn_costs_more(
    make_proxy,
) -> None:
    """Claude Code's own case: the header is the same on every request of a session. It stays
    the first system block, nothing lands on the user messages, and no turn reads less or writes
    more than straight to the simulator."""
    bodies = []
    for turn in range(6):
        body = _claude_code_body(turn)
        body["system"][0] = {"type": "text", "text": _billing(0)}
        bodies.append(("/v1/messages", body))
    headers = {**HEADERS, "anthropic-beta": BETAS, "x-claude-code-session-id": SESSION}
    async with _both(make_proxy, bodies, headers) as runs:
        for turn, (body, (_, client)) in enumerate(zip(runs.sent, bodies, strict=True)):
            assert _unmarked({"content": body["system"]}) == _unmarked({"content": client["system"]})
            assert [_unmarked(m) for m in body["messages"]] == [_unmarked(m) for m in client["messages"]], turn
        reads = [
            (u["cache_read_input_tokens"], d["cache_read_input_tokens"])
            for u, d in zip(runs.usages, runs.direct, strict=True)
        ]
        writes = [
            (u["cache_creation_input_tokens"], d["cache_creation_input_tokens"])
            for u, d in zip(runs.usages, runs.direct, strict=True)
        ]
        assert all(through >= straight for through, straight in reads), reads
        assert all(through <= straight for through, straight in writes), writes
        assert [u["input_tokens"] for u in runs.usages] == [0] * 6


# --- Codex-style Responses: <environment_context> with the current time -------------------


def _environment(turn: int) -> str:
    return (
        "<environment_context>\n"
        "  <cwd>/home/dev/app</cwd>\n"
        f"  <current_time>2026-11-30T09:{turn:02d}:00Z</current_time>\n"
        "</environment_context>"
    )


def _part(part: dict[str, Any]) -> dict[str, Any]:
    """A content part without its breakpoint marker (the planner's business, not this test's)."""
    return {k: v for k, v in part.items() if k != "prompt_cache_breakpoint"}


def _responses_body(turn: int) -> dict[str, Any]:
    """Turn `turn`: even turns end with a user message, odd ones with a tool output."""
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": _environment(turn)}],
        }
    ]
    for step in range(turn + 1):
        if step % 2 == 0:
            if step:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": f"Done {step}."}],
                    }
                )
            items.append(
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"Task {step}."}],
                }
            )
        else:
            items.append(
                {"type": "function_call", "call_id": f"call_{step}", "name": "read", "arguments": "{}"}
            )
            items.append(
                {"type": "function_call_output", "call_id": f"call_{step}", "output": f"contents {step}"}
            )
    return {
        "model": "gpt-5.6",
        "instructions": "You are a coding agent running in a terminal.\n" + GUIDE,
        "input": items,
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}}],
        "prompt_cache_key": SESSION,
    }


async def test_environment_context_keeps_its_wrapper_and_every_turn_reads_the_last(make_proxy) -> None:
    bodies = [("/v1/responses", _responses_body(turn)) for turn in range(6)]
    async with _both(make_proxy, bodies, OPENAI_HEADERS) as runs:
        direct, usages, sent = runs.direct, runs.usages, runs.sent
        assert [u["input_tokens_details"]["cached_tokens"] for u in direct] == [0] * 6
        counter = TokenCounter()
        rendered = [render_responses(body, counter) for body in sent]
        kept = "<environment_context>\n  <cwd>/home/dev/app</cwd>\n</environment_context>"
        for turn, (usage, body, tokens) in enumerate(zip(usages, sent, rendered, strict=True)):
            developer = [_part(p) for p in body["input"][0]["content"]]
            assert developer == [{"type": "input_text", "text": kept}], f"turn {turn + 1}"
            moved = {
                "type": "input_text",
                "text": "<environment_context>\n"
                f"  <current_time>2026-11-30T09:{turn:02d}:00Z</current_time>\n</environment_context>",
            }
            last = body["input"][-1]
            first_part = (last["content"] if last["type"] == "message" else last["output"])[0]
            assert _part(first_part) == moved, f"turn {turn + 1}"
            cached = usage["input_tokens_details"]["cached_tokens"]
            assert usage["input_tokens"] == len(tokens.tokens), f"turn {turn + 1}"
            if turn == 0:
                assert cached == 0
                continue
            before = rendered[turn - 1]
            assert tokens.tokens[: before.implicit] == before.tokens[: before.implicit], f"turn {turn + 1}"
            assert cached == before.implicit, f"turn {turn + 1}"


# --- A person at the keyboard: 20-minute gaps ---------------------------------------------


def _paced_body(turn: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for k in range(turn):
        messages += [
            {"role": "user", "content": f"Question {k}."},
            {"role": "assistant", "content": f"Answer {k}."},
        ]
    question = {"type": "text", "text": f"Question {turn}.", "cache_control": {"type": "ephemeral"}}
    return {
        "model": SONNET,
        "max_tokens": 64,
        "system": [{"type": "text", "text": GUIDE, "cache_control": {"type": "ephemeral"}}],
        "messages": [*messages, {"role": "user", "content": [question]}],
    }


async def test_after_a_long_gap_the_tail_is_written_for_an_hour_and_read_after_the_next(make_proxy) -> None:
    bodies = [("/v1/messages", _paced_body(turn)) for turn in range(4)]
    headers = {**HEADERS, "x-session-id": SESSION}
    async with _both(make_proxy, bodies, headers, gap=1200.0) as runs:
        direct, usages, sent, sim = runs.direct, runs.usages, runs.sent, runs.sim
        assert [u["cache_read_input_tokens"] for u in direct] == [0] * 4
        totals = [await _tokens(sim, body, len(body["messages"])) for body in sent]
        assert [u["cache_read_input_tokens"] for u in usages] == [0, 0, totals[1], totals[2]]
        written = [u["cache_creation"] for u in usages]
        assert written == [
            {"ephemeral_5m_input_tokens": totals[0], "ephemeral_1h_input_tokens": 0},
            {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": totals[1]},
            {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": totals[2] - totals[1]},
            {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": totals[3] - totals[2]},
        ]
        tail = sent[3]["messages"][-1]["content"][-1]["cache_control"]
        assert tail == {"type": "ephemeral", "ttl": "1h"}, "the client's 5m tail marker, lengthened"
