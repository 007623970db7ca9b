"""The previous record's sidecars as columns (`proxy.pipeline.replay.StoredColumns`): with
them `first_mismatch`, `tail_rewritten`, `splice` and `proxy.measure.reuse_for` give exactly
what they give walking the sidecars one by one, for any history (positions with gaps, a
system-section head, replays due, a changed message anywhere) and through the stages."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.replay import (
    Masker,
    first_mismatch,
    splice,
    stored_columns,
    strip_markers,
    tail_rewritten,
    view_messages,
)
from proxy.providers import ANTHROPIC
from proxy.rules import load_rules, volatile_patterns
from proxy.store.codec import Sidecar
from tests.sessions.test_fast_paths import _send, _services
from tests.sessions.test_rawprefix import _body, _turn

MASKER = Masker(volatile_patterns(load_rules()))
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIGESTS = st.sampled_from([bytes([i]) * 16 for i in range(3)])


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[bytes], tuple[Sidecar, ...], frozenset[int]]:
    """Current digests, the sidecars of a previous request (mostly positions 0..n-1, sometimes
    with a gap or out of order) and the skipped positions."""
    stored = draw(st.lists(DIGESTS, max_size=12))
    positions = list(range(len(stored)))
    shape = draw(st.sampled_from(["contiguous", "contiguous", "gap", "shuffled"]))
    if shape == "gap" and positions:
        del positions[draw(st.integers(0, len(positions) - 1))]
    elif shape == "shuffled":
        positions = draw(st.permutations(positions))
    sidecars = tuple(Sidecar(p, stored[p], b"{}", b"", b"k" * 16) for p in positions)
    current = list(stored)
    for _ in range(draw(st.integers(0, 2))):
        if current:
            current[draw(st.integers(0, len(current) - 1))] = draw(DIGESTS)
    current = current[: draw(st.integers(0, len(current)))] + draw(st.lists(DIGESTS, max_size=3))
    skip = frozenset(draw(st.lists(st.integers(0, 12), max_size=2)))
    return current, sidecars, skip


@FAST
@given(histories())
def test_columns_answer_as_the_walk_does(case: tuple[list[bytes], tuple[Sidecar, ...], frozenset[int]]) -> None:
    current, sidecars, skip = case
    columns = stored_columns(sidecars)
    assert first_mismatch(current, sidecars, skip, columns) == first_mismatch(current, sidecars, skip)
    assert tail_rewritten(current, sidecars, skip, columns) == tail_rewritten(current, sidecars, skip)


def _sidecars(items: list[Any], masker: Masker = MASKER) -> tuple[Sidecar, ...]:
    out = []
    for i, m in enumerate(items):
        data = orjson.dumps(strip_markers(m))
        out.append(Sidecar(i, masker.digest(m), data, masker.digests(m)[0]))
    return tuple(out)


def _conversation(n: int) -> list[Any]:
    messages: list[Any] = [{"role": "user", "content": "Start at 2026-11-29T20:09:13Z."}]
    k = 0
    while len(messages) < n:
        messages.extend(_turn(k))
        k += 1
    return messages[:n]


def test_a_changed_byte_in_message_3_of_500() -> None:
    """500 earlier messages, then the same with one byte of message 3 changed, then with
    message 0's timestamp re-rendered (masked: the same digest, other bytes, so it is
    replayed): the columns' answers are the walk's, exactly."""
    previous = _conversation(500)
    sidecars = _sidecars(previous)
    columns = stored_columns(sidecars)
    assert columns.digests is not None and len(columns.digests) == 500
    appended = [*previous, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    changed = list(appended)
    text = changed[3]["content"][0]["text"]
    changed[3] = {**changed[3], "content": [{**changed[3]["content"][0], "text": "S" + text[1:]}]}
    restamped = list(appended)
    restamped[0] = {"role": "user", "content": "Start at 2026-11-30T08:00:00Z."}
    expected = {"appended": (None, False, 0), "changed": (3, False, 0), "restamped": (None, False, 1)}
    for name, items in (("appended", appended), ("changed", changed), ("restamped", restamped)):
        view = view_messages(ANTHROPIC, {"messages": items}, MASKER)
        rewritten = first_mismatch(view.digests, sidecars, view.system_positions, columns)
        assert rewritten == first_mismatch(view.digests, sidecars, view.system_positions)
        tail = tail_rewritten(view.digests, sidecars, view.system_positions, columns)
        assert tail == tail_rewritten(view.digests, sidecars, view.system_positions)
        fast = splice(items, view.digests, sidecars, view.system_positions, rewritten, view, columns)
        slow = splice(items, view.digests, sidecars, view.system_positions, rewritten, view)
        assert (fast.items, fast.replayed, fast.positions) == (slow.items, slow.replayed, slow.positions)
        assert (name, rewritten, tail, fast.replayed) == (name, *expected[name])
    assert fast.positions == (0,) and fast.items is not None
    assert orjson.dumps(fast.items[0]) == sidecars[0].value  # the stored bytes went out


def test_columns_need_positions_0_to_n_minus_1() -> None:
    sidecars = _sidecars(_conversation(6))
    assert stored_columns(sidecars).digests == tuple(s.digest for s in sidecars)
    assert stored_columns(sidecars[1:]).digests is None  # starts at 1
    assert stored_columns((sidecars[1], sidecars[0])).digests is None  # out of order
    assert stored_columns(()).digests == ()
    assert stored_columns(sidecars).of(sidecars[:3], frozenset()) is None  # not these sidecars
    assert stored_columns(sidecars).of(sidecars, frozenset({0})) is None  # a skipped position


async def test_stages_answer_with_columns_as_the_walk_does() -> None:
    """A growing conversation (with a rewritten message, then growing again) through the stages:
    each request's history verdicts, its replay and what measurement reuses from the previous
    record are those of the walk over the sidecars (the same functions without the columns)."""
    from proxy.measure import reuse_for, sent_body

    body = _body(40)
    edited = [*body["messages"]]
    edited[3] = {"role": edited[3]["role"], "content": "changed"}
    bodies = [
        body,
        {**body, "messages": [*body["messages"], *_turn(40)]},
        {**body, "messages": [*body["messages"], *_turn(40), *_turn(41)]},
        {**body, "messages": [*edited, *_turn(40), *_turn(41), *_turn(42)]},
        {**body, "messages": [*edited, *_turn(40), *_turn(41), *_turn(42), *_turn(43)]},
    ]
    for mode in ("observe", "optimise"):
        services = _services(mode)
        verdicts = []
        for b in bodies:
            ex = await _send(services, ANTHROPIC, b)
            view, previous = ex.message_view, ex.previous
            assert view is not None
            if previous is None:
                assert ex.stored_columns is None
                verdicts.append(None)
                continue
            columns = ex.stored_columns
            assert columns is not None and columns.sidecars is previous.sidecars and columns.digests is not None
            skip = view.system_positions
            assert ex.history_rewritten == first_mismatch(view.digests, previous.sidecars, skip)
            rewritten = tail_rewritten(view.digests, previous.sidecars, skip)
            assert rewritten == tail_rewritten(view.digests, previous.sidecars, skip, columns)
            walked = splice(list(b["messages"]), view.digests, previous.sidecars, skip, ex.history_rewritten, view)
            assert ex.replayed == walked.replayed
            sent = sent_body(ex)
            assert sent is not None
            fast = reuse_for(ex, sent)
            ex.stored_columns = None
            slow = reuse_for(ex, sent)
            assert (fast is None, fast and fast.same) == (slow is None, slow and slow.same)
            verdicts.append((ex.history_rewritten, ex.replayed, fast.same if fast is not None else 0))
        # optimise: the previous request's marked messages were sent as edited copies, which
        # measurement does not vouch for by identity (as before the columns)
        reused = [81, 83, 3, 87] if mode == "observe" else [80, 82, 3, 85]
        assert verdicts == [None, (None, 0, reused[0]), (None, 0, reused[1]), (3, 0, 3), (None, 0, reused[3])]
