"""Wasted tail writes (finding P3): aider appends a reminder to its newest user message and sends
that message without it next turn, so a marker there is written (1.25x) and never read. The
session counts consecutive rewritten newest messages (`SessionRecord.tail_misses`) and the
planner then marks the end of the previous turn instead, until a request keeps its predecessor's
newest message again.

Pure: `tail_rewritten`, the planner's positions, the record field. Through the simulator: an
aider-like conversation, exact usage per turn, with the learning on and off (same reads, lower
cost), and straight to the simulator.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from proxy.pacing import Forecast
from proxy.pipeline import breakpoints
from proxy.pipeline.breakpoints import PacingInput, PlanContext, place_breakpoints
from proxy.pipeline.replay import Masker, stripped_bytes, tail_rewritten, view_messages
from proxy.providers import ANTHROPIC
from proxy.store.codec import UNCHECKED_MAGIC, SessionRecord, Sidecar, decode_record, encode_record
from tests.pipeline.test_simulator import GUIDE, HEADERS, _tokens
from tests.pipeline.test_simulator_turns import _both

MESSAGES = "/v1/messages"
SONNET = "claude-sonnet-4-6"
EPH = {"type": "ephemeral"}
REMINDER = "\n\n# *SEARCH/REPLACE block* Rules:\n\n" + " ".join(
    f"Step {i}: the FULL file path alone on a line, then the fence, then <<<<<<< SEARCH." for i in range(40)
)


def _aider(turn: int) -> dict[str, Any]:
    """Turn `turn` as aider sends it: a done exchange marked by the client (`Ok.`), the earlier
    questions and answers, and the newest question with the reminder appended."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "I switched to a new code base."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Ok.", "cache_control": EPH}]},
    ]
    for k in range(turn):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"Question {k}?"}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Answer {k}."}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": f"Question {turn}?{REMINDER}"}]})
    return {
        "model": SONNET,
        "max_tokens": 64,
        "system": [{"type": "text", "text": GUIDE}],
        "messages": messages,
    }


# --- pure ----------------------------------------------------------------------------------------


def _sidecars(body: dict[str, Any], masker: Masker) -> tuple[Sidecar, ...]:
    view = view_messages(ANTHROPIC, body, masker)
    return tuple(Sidecar(i, view.digests[i], stripped_bytes(m), view.exact[i]) for i, m in enumerate(body["messages"]))


def test_tail_rewritten_only_when_the_newest_message_is_the_first_change() -> None:
    masker = Masker()
    before = _sidecars(_aider(1), masker)

    def rewritten(body: dict[str, Any]) -> bool:
        view = view_messages(ANTHROPIC, body, masker)
        return tail_rewritten(view.digests, before, view.system_positions)

    assert rewritten(_aider(2))  # the reminder went away
    kept = copy.deepcopy(_aider(2))
    kept["messages"][4] = _aider(1)["messages"][4]  # the question still carries it: an append
    assert not rewritten(kept)
    earlier = copy.deepcopy(_aider(2))
    earlier["messages"][0]["content"][0]["text"] = "I switched again."  # an edit before it
    assert not rewritten(earlier)
    assert not rewritten(_aider(0))  # fewer messages: a fork, not this pattern
    same_length = copy.deepcopy(_aider(1))
    same_length["messages"][4]["content"][0]["text"] = "Question 0, again?"
    assert rewritten(same_length)  # the newest message edited in place
    assert not tail_rewritten((), (), frozenset())


def test_planner_marks_the_end_of_the_previous_turn_after_a_wasted_tail() -> None:
    body = _aider(1)  # blocks: system 0, messages 1..5 (the newest question is 5)
    before = copy.deepcopy(body)
    out, plan = place_breakpoints(ANTHROPIC, body, context=PlanContext())
    assert [(m.index, m.origin, m.reason) for m in plan.markers] == [
        (0, "injected", "shared"),
        (2, "client", "client"),
        (4, "injected", "turn"),
        (5, "injected", "last"),
    ]
    skipping = PlanContext(tail_misses=1)
    out, plan = place_breakpoints(ANTHROPIC, body, context=skipping)
    assert [(m.index, m.origin, m.reason) for m in plan.markers] == [
        (0, "injected", "shared"),
        (2, "client", "client"),
        (4, "injected", "turn"),
    ]
    assert "cache_control" not in out["messages"][-1]["content"][0]
    assert body == before  # input never mutated
    assert place_breakpoints(ANTHROPIC, out, context=skipping)[0] == out  # idempotent
    # a client's own marker on the newest message stays where it is
    marked = copy.deepcopy(body)
    marked["messages"][-1]["content"][0]["cache_control"] = EPH
    _, kept = place_breakpoints(ANTHROPIC, marked, context=skipping)
    assert (5, "client", "client") in [(m.index, m.origin, m.reason) for m in kept.markers]


def test_first_request_leaves_the_newest_message_to_a_client_that_marked_earlier_ones() -> None:
    body = _aider(0)  # blocks: system 0, messages 1 (question), 2 (`Ok.`, client), 3 (newest)
    _, plan = place_breakpoints(ANTHROPIC, body, context=PlanContext(first=True))
    assert [(m.index, m.origin, m.reason) for m in plan.markers] == [(0, "injected", "shared"), (2, "client", "client")]
    # with a record behind it the session's own evidence decides (nothing rewritten yet: marked)
    _, plan = place_breakpoints(ANTHROPIC, body, context=PlanContext())
    assert [(m.index, m.reason) for m in plan.markers] == [(0, "shared"), (2, "client"), (3, "last")]
    # a client that marks nothing in its messages, or marks its newest message, is not affected
    bare = copy.deepcopy(body)
    del bare["messages"][1]["content"][0]["cache_control"]
    _, plan = place_breakpoints(ANTHROPIC, bare, context=PlanContext(first=True))
    assert [(m.index, m.reason) for m in plan.markers] == [(0, "shared"), (2, "turn"), (3, "last")]
    newest = copy.deepcopy(body)
    newest["messages"][-1]["content"][0]["cache_control"] = EPH
    _, plan = place_breakpoints(ANTHROPIC, newest, context=PlanContext(first=True))
    assert [(m.index, m.origin) for m in plan.markers] == [(0, "injected"), (2, "client"), (3, "client")]


def test_no_tail_when_the_conversation_is_predicted_to_end() -> None:
    body = _aider(1)  # blocks: system 0, messages 1..5; the previous request's last marker was 4
    ending = Forecast(p_end=1.0, human_soon=0.0, human_hour=0.0, tool_soon=1.0, tool_hour=0.0)
    alive = PlanContext(previous_breakpoints=(4,), pacing=PacingInput(ending))
    _, plan = place_breakpoints(ANTHROPIC, body, context=alive)
    # the shared prefix and the anchor (read, refreshed at the read price); no tail, no turn
    assert [(m.index, m.ttl, m.reason) for m in plan.markers] == [
        (0, "1h", "shared"),
        (2, "1h", "client"),
        (4, "1h", "anchor"),
    ]
    gone = PlanContext(previous_breakpoints=(4,), pacing=PacingInput(ending, expired=True))
    _, plan = place_breakpoints(ANTHROPIC, body, context=gone)
    assert [(m.index, m.ttl, m.reason) for m in plan.markers] == [(0, "5m", "shared"), (2, "5m", "client")]
    coming = Forecast(p_end=1.0, human_soon=1.0, human_hour=0.0, tool_soon=1.0, tool_hour=0.0)
    _, plan = place_breakpoints(ANTHROPIC, body, context=PlanContext((4,), pacing=PacingInput(coming)))
    assert [(m.index, m.reason) for m in plan.markers] == [(0, "shared"), (2, "client"), (4, "anchor"), (5, "last")]


def test_plan_context_and_record_carry_the_count() -> None:
    assert not PlanContext().skips_tail and PlanContext(tail_misses=1).skips_tail
    record = SessionRecord(chain=b"\x01" * 16, ends=(3,), model=SONNET, params_digest=b"", tail_misses=3)
    assert decode_record(encode_record(record)) == record
    # a record written before the field existed decodes with 0
    data = encode_record(record)
    size = int.from_bytes(data[4:8], "big")
    header = orjson.loads(data[8 : 8 + size])
    del header["tm"]
    head = orjson.dumps(header)
    old = UNCHECKED_MAGIC + len(head).to_bytes(4, "big") + head + data[8 + size : -8]  # no checksum then
    assert decode_record(old).tail_misses == 0


# --- through the simulator -----------------------------------------------------------------------

TURNS = 5


@pytest.mark.parametrize("learning", [True, False], ids=["learning", "no-learning"])
async def test_aider_like_trace_spends_no_write_on_a_tail_it_never_reads(
    make_proxy: Any, monkeypatch: pytest.MonkeyPatch, learning: bool
) -> None:
    if not learning:
        monkeypatch.setattr(breakpoints, "TAIL_MISSES_TO_SKIP", 10**9)
    bodies = [(MESSAGES, _aider(turn)) for turn in range(TURNS)]
    async with _both(make_proxy, bodies, HEADERS) as runs:  # no session header: inferred, as aider
        for turn, (usage, body) in enumerate(zip(runs.usages, runs.sent, strict=True)):
            n = len(body["messages"])  # 2 + 2 * turn + 1
            total = await _tokens(runs.sim, body, n)
            before_newest = await _tokens(runs.sim, body, n - 1)
            # every turn reads the end of the turn before last, the earliest entry this turn
            # still shares (the client's `Ok.` on turn 2)
            read = 0 if turn == 0 else await _tokens(runs.sim, body, 2 * turn)
            newest_marked = "cache_control" in body["messages"][-1]["content"][-1]
            got = (
                usage["cache_read_input_tokens"],
                usage["cache_creation_input_tokens"],
                usage["input_tokens"],
            )
            if turn > 0 and not learning:  # the tail is marked and written
                assert newest_marked, turn
                assert got == (read, total - read, 0), turn
            else:  # the end of the previous turn is written, the newest question sent uncached
                # (on the first turn too: the client marked its `Ok.` and not its newest message)
                assert not newest_marked, turn
                assert got == (read, before_newest - read, total - before_newest), turn
        # the client alone: its `Ok.` marker only
        for turn, usage in enumerate(runs.direct):
            assert usage["cache_read_input_tokens"] == (
                0 if turn == 0 else runs.direct[0]["cache_creation_input_tokens"]
            )


async def test_learning_costs_less_for_the_same_reads(make_proxy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input cost in base-price token units (docs/provider-rules.md 1.9: read 0.1x, 5m write 1.25x)."""
    bodies = [(MESSAGES, _aider(turn)) for turn in range(TURNS)]

    def cost(usages: list[dict[str, Any]]) -> float:
        return sum(
            u["input_tokens"] + 1.25 * u["cache_creation_input_tokens"] + 0.1 * u["cache_read_input_tokens"]
            for u in usages
        )

    async with _both(make_proxy, bodies, HEADERS) as runs:
        learned, direct = runs.usages, runs.direct
    monkeypatch.setattr(breakpoints, "TAIL_MISSES_TO_SKIP", 10**9)
    async with _both(make_proxy, bodies, HEADERS) as runs:
        unlearned = runs.usages
    reads = [u["cache_read_input_tokens"] for u in learned]
    assert reads == [u["cache_read_input_tokens"] for u in unlearned]
    assert all(r > d["cache_read_input_tokens"] for r, d in zip(reads[2:], direct[2:], strict=True))
    # each later turn saves the 0.25x on its newest question (the reminder included)
    tails = [
        u["cache_creation_input_tokens"] - v["cache_creation_input_tokens"]
        for u, v in zip(unlearned, learned, strict=True)
    ]
    assert tails[0] == 0 and all(t == v["input_tokens"] > 700 for t, v in zip(tails[1:], learned[1:], strict=True))
    assert cost(unlearned) - cost(learned) == pytest.approx(0.25 * sum(tails))
    assert cost(learned) < cost(unlearned)


def _rebuilt(turn: int) -> dict[str, Any]:
    """`_aider(turn)` without the reminder (the newest question is sent again as it was) and
    with every earlier answer re-rendered each turn (aider rebuilds the chat after its
    examples): the first change is an earlier message, not the newest one."""
    body = copy.deepcopy(_aider(turn))
    body["messages"][-1]["content"][0]["text"] = f"Question {turn}?"
    for message in body["messages"][2:-1]:
        if message["role"] == "assistant":
            message["content"][0]["text"] += f" (as of turn {turn})"
    return body


async def test_a_rewrite_before_the_previous_newest_message_counts_as_a_wasted_tail(make_proxy: Any) -> None:
    bodies = [(MESSAGES, _rebuilt(turn)) for turn in range(TURNS)]
    async with _both(make_proxy, bodies, HEADERS) as runs:
        for turn, (usage, body) in enumerate(zip(runs.usages, runs.sent, strict=True)):
            n = len(body["messages"])
            total = await _tokens(runs.sim, body, n)
            before_newest = await _tokens(runs.sim, body, n - 1)
            # turn 0: the client marked `Ok.` and not its newest message (first request); turn 1
            # appends (its newest is written); from turn 2 on the answer of turn 0 is
            # re-rendered, so turn 1's newest message was never read: the newest goes uncached
            newest_marked = "cache_control" in body["messages"][-1]["content"][-1]
            assert newest_marked == (turn == 1), turn
            if turn >= 2:
                assert usage["input_tokens"] == total - before_newest, turn
