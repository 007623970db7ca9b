"""A moved note is delivered once per value (proxy.pipeline.delivered, issue 12 item 7/2).

Pure: `carried` / `next_delivered`; `reorder_body` and `pin_body` with the session's delivered
notes (exact bodies); properties of `reorder_body` with delivered notes (pure, idempotent,
content only moved or left out as delivered, markers unchanged). Through promptcache and the
simulator: a counter line unchanged, changed, unchanged, then a new conversation under the same
session id (exact bodies and usage per turn).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.pipeline.canonicalise import canonicalise_body
from proxy.pipeline.delivered import MAX_NOTE_CHARS, carried, next_delivered
from proxy.pipeline.pins import pin_body
from proxy.pipeline.reorder import reorder_body
from proxy.providers import ANTHROPIC, OPENAI_CHAT, route
from proxy.store.codec import Sidecar
from tests.pipeline.helpers import RULES
from tests.pipeline.strategies import (
    ANTHROPIC_MARKER_KEY,
    OPENAI_MARKER_KEY,
    anthropic_bodies,
    content_fingerprint,
    count_markers,
    openai_bodies,
)
from tests.pipeline.test_simulator import GUIDE, HEADERS, Relay, _tokens, _unmarked

sim_app = pytest.importorskip("proxy.sim.app")
sim_clock = pytest.importorskip("proxy.sim.clock")

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
SONNET = "claude-sonnet-4-6"
SLOT = "move\x1fusage-counters\x1f0"


def _d(i: int) -> bytes:
    return bytes([i]) * 16


# --- carried / next_delivered ----------------------------------------------------------------


def test_a_note_is_carried_while_every_message_up_to_its_request_is_unchanged() -> None:
    sidecars = [Sidecar(i, _d(i), b"{}") for i in range(3)]
    delivered = [("a", "x", 2), ("b", "y", 0), ("c", "z", 4)]
    # an append: messages 0..2 as stored, two new ones; "c" was delivered on what is now the newest
    assert carried(delivered, [_d(0), _d(1), _d(2), _d(7), _d(8)], sidecars) == {
        "a": ("a", "x", 2),
        "b": ("b", "y", 0),
    }
    # message 1 rewritten: only what came before it is still in the history
    assert carried(delivered, [_d(0), _d(9), _d(2), _d(7)], sidecars) == {"b": ("b", "y", 0)}
    # a retry of the delivering request: its last message is the newest again, not history
    assert carried(delivered, [_d(0), _d(1), _d(2)], sidecars) == {"b": ("b", "y", 0)}
    # a missing sidecar is not "unchanged"; system-section positions are skipped
    assert carried(delivered, [_d(0), _d(1), _d(2), _d(7)], sidecars[1:]) == {}
    assert carried(delivered, [_d(5), _d(1), _d(2), _d(7)], sidecars[1:], frozenset({0})) == {
        "a": ("a", "x", 2),
        "b": ("b", "y", 0),
    }
    assert carried([], [_d(0)], sidecars) == {}


def test_next_delivered_keeps_what_is_carried_and_adds_this_request() -> None:
    kept = {"a": ("a", "x", 2), "b": ("b", "y", 0)}
    assert next_delivered(kept, [("b", "y2"), ("c", "z")], 5) == (("a", "x", 2), ("b", "y2", 5), ("c", "z", 5))
    # a text too long to keep is not recorded (delivered every turn) and forgets its slot
    assert next_delivered(kept, [("a", "x" * (MAX_NOTE_CHARS + 1))], 5) == (("b", "y", 0),)
    assert next_delivered({}, [], 3) == ()


# --- reorder_body / pin_body with delivered notes ----------------------------------------------


def _system(counter: int) -> str:
    return f"You are terse.\nContext used: {counter} tokens of 200000 (0%)\nUse the tools."


def _anthropic(counter: int, question: str = "Q?") -> dict[str, Any]:
    return {"model": SONNET, "system": _system(counter), "messages": [{"role": "user", "content": question}]}


def test_reorder_leaves_out_a_moved_line_equal_to_the_one_delivered() -> None:
    note = "Context used: 546 tokens of 200000 (0%)\n"
    first, plan = reorder_body(ANTHROPIC, _anthropic(546), RULES)
    assert first["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": note}, {"type": "text", "text": "Q?"}]}
    ]
    assert (plan.moved, plan.slots, plan.repeated) == ((note,), (SLOT,), 0)
    same, plan = reorder_body(ANTHROPIC, _anthropic(546), RULES, delivered={SLOT: note})
    assert same == {
        "model": SONNET,
        "system": "You are terse.\nUse the tools.",
        "messages": [{"role": "user", "content": "Q?"}],
    }
    assert (plan.moved, plan.slots, plan.repeated) == ((), (), 1)
    changed, plan = reorder_body(ANTHROPIC, _anthropic(1046), RULES, delivered={SLOT: note})
    assert changed["system"] == same["system"]
    new_note = "Context used: 1046 tokens of 200000 (0%)\n"
    assert changed["messages"][0]["content"][0] == {"type": "text", "text": new_note}
    assert (plan.repeated, plan.slots) == (0, (SLOT,))
    # another slot's value never hides this one
    other, _ = reorder_body(ANTHROPIC, _anthropic(546), RULES, delivered={"move\x1fother\x1f0": note})
    assert other == first


def test_reorder_leaves_out_a_delivered_line_on_openai_chat_too() -> None:
    note = "Context used: 546 tokens of 200000 (0%)\n"
    body = {
        "model": "gpt-5.5",
        "messages": [{"role": "system", "content": _system(546)}, {"role": "user", "content": "Q?"}],
    }
    out, plan = reorder_body(OPENAI_CHAT, body, RULES, delivered={SLOT: note})
    assert out["messages"] == [
        {"role": "system", "content": "You are terse.\nUse the tools."},
        {"role": "user", "content": "Q?"},
    ]
    assert plan.repeated == 1


def test_pinned_change_is_moved_once_and_not_again_while_delivered() -> None:
    header = "x-anthropic-billing-header: cc_version=2.1.3; cch={};"
    def body(cch: str) -> dict[str, Any]:
        return {
            "model": SONNET,
            "system": [{"type": "text", "text": header.format(cch)}, {"type": "text", "text": GUIDE}],
            "messages": [{"role": "user", "content": "Q?"}],
        }
    pinned = pin_body(ANTHROPIC, body("a1"), RULES)[1].pinned
    moved, report = pin_body(ANTHROPIC, body("b2"), RULES, pinned)
    assert moved["system"][0]["text"] == header.format("a1")
    assert moved["messages"][0]["content"][0] == {"type": "text", "text": header.format("b2")}
    ((slot, value),) = report.delivered
    assert (slot.startswith("pin\x1fbilling-header"), value, report.moved) == (True, header.format("b2"), 1)
    again, report = pin_body(ANTHROPIC, body("b2"), RULES, pinned, {slot: value})
    assert again == {**body("b2"), "system": moved["system"]}
    assert (report.moved, report.repeated, report.delivered) == (0, 1, [])


# --- properties ---------------------------------------------------------------------------------

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _lines(texts: tuple[str, ...]) -> Counter:
    return Counter(("line", line) for text in texts for line in text.split("\n"))


def _empty_texts(value: Any, key: str) -> int:
    """Empty text blocks carrying the marker `key`, anywhere in `value`."""
    if isinstance(value, list):
        return sum(_empty_texts(item, key) for item in value)
    if not isinstance(value, dict):
        return 0
    here = int(value.get("type") == "text" and value.get("text") == "" and key in value)
    return here + sum(_empty_texts(item, key) for item in value.values())


def _check(adapter: Any, body: dict[str, Any], key: str, pick: list[bool]) -> None:
    body = canonicalise_body(adapter, body)[0]  # reorder's input (canonicalise runs first)
    before = orjson.dumps(body)
    full, plan = reorder_body(adapter, body, RULES)
    picks = pick + [False] * len(plan.slots)
    delivered = {s: t for s, t, on in zip(plan.slots, plan.moved, picks[: len(plan.slots)], strict=True) if on}
    out, plan2 = reorder_body(adapter, body, RULES, delivered=delivered)
    assert orjson.dumps(body) == before  # caller input never mutated
    again, _ = reorder_body(adapter, out, RULES, delivered=delivered)
    assert orjson.dumps(again) == orjson.dumps(out)  # idempotent
    # notes carry no marker: leaving one out moves none and adds none. One difference is allowed:
    # empty text blocks that the moved text made removable (canonicalise merged their markers
    # into it) stay, with their markers, when nothing is put on the user message
    kept = count_markers(adapter, out, key) - count_markers(adapter, full, key)
    assert 0 <= kept <= _empty_texts(out, key) - _empty_texts(full, key)
    assert count_markers(adapter, full, key) <= count_markers(adapter, body, key)
    if plan2.moved == plan.moved:  # nothing left out (or nothing could move): as without notes
        assert orjson.dumps(out) == orjson.dumps(full)
        return
    assert plan2.repeated == len(plan.moved) - len(plan2.moved) == len(delivered)
    # content: exactly the left-out notes are missing, everything else is the full output's
    missing = content_fingerprint(adapter, full, key) - content_fingerprint(adapter, out, key)
    extra = content_fingerprint(adapter, out, key) - content_fingerprint(adapter, full, key)
    left_out = tuple(delivered.values())
    assert not extra
    assert all(item[0] == "line" for item in missing) and set(missing) <= set(_lines(left_out))


@FAST
@given(anthropic_bodies(), st.lists(st.booleans(), min_size=1, max_size=4))
def test_reorder_with_delivered_notes_is_pure_idempotent_and_only_leaves_them_out(
    body: dict[str, Any], pick: list[bool]
) -> None:
    _check(ANTHROPIC, copy.deepcopy(body), ANTHROPIC_MARKER_KEY, pick)


_EMPTY_MARKED = {"type": "text", "text": "", OPENAI_MARKER_KEY: {"mode": "explicit"}}


@FAST
@given(openai_bodies(), st.lists(st.booleans(), min_size=1, max_size=4))
@example(  # the moved note makes both empty blocks removable: their two markers merge into it
    (
        "/v1/chat/completions",
        {
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "Tokens used: 1234 of 200000"},
                {"role": "user", "content": [dict(_EMPTY_MARKED), dict(_EMPTY_MARKED)]},
            ],
        },
    ),
    [True],
)
def test_reorder_with_delivered_notes_is_pure_idempotent_and_only_leaves_them_out_openai(
    case: tuple[str, dict[str, Any]], pick: list[bool]
) -> None:
    path, body = case
    _check(route(path)[0], body, OPENAI_MARKER_KEY, pick)


# --- through promptcache and the simulator ------------------------------------------------------


def _turns(counters: list[int]) -> list[dict[str, Any]]:
    """A conversation growing by one question per turn, the system's counter per turn."""
    bodies = []
    for n, counter in enumerate(counters):
        messages: list[dict[str, Any]] = []
        for k in range(n + 1):
            if k:
                messages.append({"role": "assistant", "content": f"Answer {k - 1}."})
            messages.append({"role": "user", "content": f"Question {k}?"})
        system = f"{GUIDE}\nContext used: {counter} tokens of 200000 (0%)\n"
        bodies.append({"model": SONNET, "max_tokens": 32, "system": system, "messages": messages})
    return bodies


async def test_a_counter_note_is_delivered_only_when_it_changed(make_proxy: Any) -> None:
    bodies = _turns([546, 546, 1046, 1046])
    fresh = {**_turns([1046])[0]}  # the client starts over under the same session id
    runner, sim = await sim_app.start_sim("127.0.0.1", 0, clock=sim_clock.Clock.manual_at())
    relay = Relay(sim)
    try:
        await relay.start()
        proxy = await make_proxy(upstream=relay.url)
        usages, totals = [], []
        headers = {**HEADERS, "x-session-id": "delivered-notes"}
        async with aiohttp.ClientSession() as client:
            for body in [*bodies, fresh]:
                async with client.post(f"{proxy.url}{MESSAGES}", data=orjson.dumps(body), headers=headers) as r:
                    assert r.status == 200, await r.text()
                    usages.append((await r.json())["usage"])
                sent = relay.bodies[-1]
                totals.append(await _tokens(sim, sent, len(sent["messages"])))
                async with client.post(f"{sim}/_sim/clock", json={"advance": 10}) as r:
                    assert r.status == 200
        sent = relay.bodies

        def newest(k: int) -> list[str]:
            content = sent[k]["messages"][-1]["content"]
            return [content] if isinstance(content, str) else [b["text"] for b in content]

        note = "Context used: {} tokens of 200000 (0%)\n"
        assert newest(0) == [note.format(546), "Question 0?"]
        assert newest(1) == ["Question 1?"]  # unchanged: not repeated
        assert newest(2) == [note.format(1046), "Question 2?"]  # changed: delivered once
        assert newest(3) == ["Question 3?"]
        assert newest(4) == [note.format(1046), "Question 0?"]  # its carrier is gone: delivered again
        system = [_unmarked({"content": b["system"]})["content"] for b in sent]
        assert all(s == system[0] for s in system) and "Context used" not in orjson.dumps(system[0]).decode()
        for k in range(1, 4):  # earlier turns are replayed with exactly the bytes they were sent with
            before = sent[k - 1]["messages"]
            assert [_unmarked(m) for m in sent[k]["messages"][: len(before)]] == [_unmarked(m) for m in before]
        assert [u["cache_read_input_tokens"] for u in usages[:4]] == [0, *totals[:3]]
        assert [u["cache_creation_input_tokens"] for u in usages[:4]] == [
            totals[0],
            *[b - a for a, b in zip(totals[:3], totals[1:4], strict=True)],
        ]
        assert all(u["input_tokens"] == 0 for u in usages)
    finally:
        if relay.runner is not None:
            await relay.runner.cleanup()
        await runner.cleanup()
