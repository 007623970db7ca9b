"""The per-request layout cache's shortcuts give exactly what a fresh layout and scan give.

`AnthropicMessagesAdapter.relayout` (runs of unchanged messages reused) must equal `layout`, and a scan
that reuses a previous scan's prefix (`scan(..., previous)`) must equal a scan from scratch,
whatever the edit: messages replaced (by copies or by other messages), appended, dropped, non-
object messages, other keys, OpenAI bodies.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.layout import LayoutCache, Scan, _actions, _same_suffix, _scan, scan
from proxy.pipeline.reorder import plan_system
from proxy.pipeline.segments import classifier_for
from proxy.providers import ANTHROPIC, route
from proxy.providers.base import Run
from tests.pipeline.helpers import RULES, STAYING_RULES
from tests.pipeline.strategies import anthropic_bodies, openai_bodies

MESSAGES = "/v1/messages"
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fields(runs: list[Run]) -> list[tuple[Any, ...]]:
    return [(r.section, r.key, id(r.value), r.is_list, r.kind, r.role, r.message) for r in runs]


def _scan_fields(part: Scan) -> tuple[Any, ...]:
    return (
        _fields(part.runs),
        part.starts,
        part.spans,
        list(part.spans),
        part.size,
        [(i, id(m)) for i, m in part.markers],
        part.nested,
        part.nulls,
        part.empties,
        part.calls,
        part.call_positions,
        part.groups,
        part.hidden,
    )


@st.composite
def edited(draw: st.DrawFn, items: list[Any], others: list[Any]) -> list[Any]:
    """`items` with a few elements replaced (a shallow copy, another element, a non-object),
    then maybe some dropped from the end or others appended."""
    new = list(items)
    pool = [*others, "not a message", 7]
    for _ in range(draw(st.integers(0, 3))):
        if not new:
            break
        i = draw(st.integers(0, len(new) - 1))
        choice = draw(st.sampled_from(["copy", "other"]))
        new[i] = dict(new[i]) if choice == "copy" and isinstance(new[i], dict) else draw(st.sampled_from(pool))
    if new and draw(st.booleans()):
        del new[draw(st.integers(0, len(new) - 1)) :]
    new.extend(draw(st.lists(st.sampled_from(pool), max_size=3)))
    return new


@FAST
@given(st.data(), anthropic_bodies(), anthropic_bodies())
def test_relayout_is_layout_anthropic(data: st.DataObject, body: dict, other: dict) -> None:
    old = body["messages"]
    if data.draw(st.booleans()):
        old = [*old, "not a message"]
    new = data.draw(edited(old, other["messages"]))
    runs = ANTHROPIC.layout({"messages": old})
    again = ANTHROPIC.relayout("messages", new, old, runs)
    if again is not None:
        new_runs, reused = again
        assert _fields(new_runs) == _fields(ANTHROPIC.layout({"messages": new}))
        assert all(a is b for a, b in zip(runs[:reused], new_runs[:reused], strict=True))
    for key in ("system", "tools"):
        assert ANTHROPIC.relayout(key, new, old, runs) is None


@FAST
@given(st.data(), anthropic_bodies(), anthropic_bodies())
def test_incremental_scan_is_a_fresh_scan_anthropic(data: st.DataObject, body: dict, other: dict) -> None:
    policy = ANTHROPIC.marker_policy(body)
    kinds = ANTHROPIC.tool_shape.call_kinds
    old = body["messages"]
    new = data.draw(edited(old, other["messages"]))
    runs = ANTHROPIC.layout({"messages": old})
    previous = scan(runs, policy, kinds)
    again = ANTHROPIC.relayout("messages", new, old, runs)
    new_runs, known = again if again is not None else (ANTHROPIC.layout({"messages": new}), 0)
    fresh = _scan_fields(scan(new_runs, policy, kinds))
    assert _scan_fields(scan(new_runs, policy, kinds, previous)) == fresh
    actions = _actions(policy, kinds)
    assert _scan_fields(_scan(new_runs, policy.key, actions, previous, known, policy.hidden_calls)) == fresh


@FAST
@given(st.data(), openai_bodies(), openai_bodies())
def test_incremental_scan_is_a_fresh_scan_openai(data: st.DataObject, case: tuple, other: tuple) -> None:
    path, body = case
    key = "input" if path == "/v1/responses" else "messages"
    old = body.get(key)
    others = other[1].get("input", other[1].get("messages"))
    if not isinstance(old, list) or not isinstance(others, list):
        return
    new = data.draw(edited(old, others))
    policy = route(path)[0].marker_policy(body)
    kinds = route(path)[0].tool_shape.call_kinds
    previous = scan(route(path)[0].layout({key: old}), policy, kinds)
    new_runs = route(path)[0].layout({key: new})
    assert _scan_fields(scan(new_runs, policy, kinds, previous)) == _scan_fields(scan(new_runs, policy, kinds))


@FAST
@given(st.data(), anthropic_bodies(), anthropic_bodies())
def test_layout_cache_after_an_edit_is_a_fresh_one(data: st.DataObject, body: dict, other: dict) -> None:
    policy = ANTHROPIC.marker_policy(body)
    kinds = ANTHROPIC.tool_shape.call_kinds
    cache = LayoutCache()
    cache.scans(ANTHROPIC, body, policy, kinds)
    if data.draw(st.booleans()):
        cache.message_count(ANTHROPIC, body)  # the edited body's count builds on it
    edited_body = {**body, "messages": data.draw(edited(body["messages"], other["messages"]))}
    warm = cache.scans(ANTHROPIC, edited_body, policy, kinds)
    cold = LayoutCache().scans(ANTHROPIC, edited_body, policy, kinds)
    assert [(k, _scan_fields(s)) for k, s in warm] == [(k, _scan_fields(s)) for k, s in cold]
    assert cache.message_count(ANTHROPIC, edited_body) == len(
        {r.message for r in ANTHROPIC.layout(edited_body) if r.message is not None}
    )


def _moved_and_kept(adapter: Any, body: dict, rules: Any) -> tuple[Any, Any] | None:
    """What reorder compares for a shift: the body with text moved out, and the same system
    prompt sorted with nothing moved (`None` when nothing moves)."""
    units = adapter.system_units(body)
    classifier = classifier_for(rules)
    plan = plan_system(units, classifier)
    if not plan.moved:
        return None
    with_text = adapter.with_user_text(adapter.with_system(body, plan.parts), plan.moved)
    if with_text is None:
        return None
    staying = plan_system(units, classifier, allow_move=False)
    return with_text, adapter.with_system(body, staying.parts) if staying.changed else body


def _count(adapter: Any, body: dict) -> int:
    return len({r.message for r in adapter.layout(body) if r.message is not None})


@FAST
@given(anthropic_bodies(), openai_bodies(), st.sampled_from([RULES, STAYING_RULES]))
def test_no_system_message_no_shift(body: dict, case: tuple, rules: Any) -> None:
    """reorder skips its shift check when `system_messages` is False: moving text then never
    changes the number of messages."""
    for adapter, request in ((ANTHROPIC, body), (route(case[0])[0], case[1])):
        pair = _moved_and_kept(adapter, request, rules)
        if pair is None or LayoutCache().system_messages(adapter, request):
            continue
        moved, kept = pair
        assert _count(adapter, moved) == _count(adapter, kept)


@FAST
@given(openai_bodies())
def test_system_messages_are_head_messages(case: tuple) -> None:
    path, body = case
    expected = any(r.section == "system" and r.message is not None for r in route(path)[0].layout(body))
    assert LayoutCache().system_messages(route(path)[0], body) is expected
    assert not LayoutCache().system_messages(ANTHROPIC, {"system": "x", "messages": []})


def _programmatic_turn(k: int, hidden: bool) -> list[dict[str, Any]]:
    """One tool round trip: a call (made by the code-execution tool when `hidden`) and its result."""
    call: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{k}", "name": "read", "input": {"k": k}}
    if hidden:
        call["caller"] = {"type": "code_execution_20250825", "tool_id": f"srvtoolu_{k}"}
    return [
        {"role": "assistant", "content": [{"type": "text", "text": f"step {k}"}, call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": "ok"}]},
    ]


def _programmatic_body(hidden: list[bool]) -> dict[str, Any]:
    messages: list[Any] = [{"role": "user", "content": "go"}]
    for k, is_hidden in enumerate(hidden):
        messages.extend(_programmatic_turn(k, is_hidden))
    return {"model": "claude-sonnet-4-6", "max_tokens": 8, "system": "s", "messages": messages}


@FAST
@given(st.lists(st.booleans(), min_size=1, max_size=8), st.data())
def test_scanned_hidden_calls_are_the_walked_ones(hidden: list[bool], data: st.DataObject) -> None:
    """The hidden calls a scan records (and reuses from a previous scan after an edit) give
    `Legality` exactly the answers of a walk over every block (`BlockView(runs)`)."""
    from proxy.pipeline.blocks import BlockView, Legality
    from proxy.pipeline.layout import view_of
    from proxy.pipeline.support import NO_CAPABILITY_LIMITS

    body = _programmatic_body(hidden)
    policy = ANTHROPIC.marker_policy(body)
    kinds = ANTHROPIC.tool_shape.call_kinds
    cache = LayoutCache()
    cache.scans(ANTHROPIC, body, policy, kinds)
    keep = data.draw(st.integers(1, len(body["messages"])))
    more = data.draw(st.lists(st.booleans(), max_size=3))
    tail = [m for k, h in enumerate(more) for m in _programmatic_turn(100 + k, h)]
    edited_body = {**body, "messages": [*body["messages"][:keep], *tail]}
    for version in (body, edited_body):
        parts = [s for _, s in cache.scans(ANTHROPIC, version, policy, kinds)]
        view = view_of(parts)
        walked = BlockView(ANTHROPIC.layout(version))
        assert walked.hidden is None and view.hidden is not None
        known, fresh = Legality(ANTHROPIC, policy, NO_CAPABILITY_LIMITS, view), Legality(
            ANTHROPIC, policy, NO_CAPABILITY_LIMITS, walked
        )
        assert known._hidden_ids() == fresh._hidden_ids()
        assert [(known(i), known(i, new=True)) for i in range(view.size)] == [
            (fresh(i), fresh(i, new=True)) for i in range(walked.size)
        ]
    expected = {f"toolu_{k}" for k, h in enumerate(hidden) if h and 2 * k + 1 < keep}
    expected |= {f"toolu_{100 + k}" for k, h in enumerate(more) if h}
    assert Legality(ANTHROPIC, policy, NO_CAPABILITY_LIMITS, view)._hidden_ids() == expected


def test_scanned_hidden_calls_exact() -> None:
    """Two hidden calls of three: their ids, and no marker on them or their results."""
    from proxy.pipeline.blocks import Legality
    from proxy.pipeline.support import NO_CAPABILITY_LIMITS

    body = _programmatic_body([True, False, True])
    policy = ANTHROPIC.marker_policy(body)
    view, _, _ = LayoutCache().view(ANTHROPIC, body, policy, ANTHROPIC.tool_shape.call_kinds)
    assert view.hidden == (policy.hidden_calls, ["toolu_0", "toolu_2"])
    legal = Legality(ANTHROPIC, policy, NO_CAPABILITY_LIMITS, view)
    # blocks: system 0, "go" 1, then per turn: text, call, result
    assert [legal(i, new=True) for i in range(view.size)] == [
        True, True, True, False, False, True, True, True, True, False, False,
    ]


def _with_old_runs(new_runs: list[Run], old_runs: list[Run]) -> list[Run]:
    """`new_runs` with each run equal to the old run at its place (the same value object,
    section, key, shape, kind, role and message) replaced by that very old run, as `relayout`
    reuses the runs of the unchanged messages."""
    return [
        old if i < len(old_runs) and _fields([old := old_runs[i]]) == _fields([run]) else run
        for i, run in enumerate(new_runs)
    ]


@FAST
@given(st.data(), anthropic_bodies(), openai_bodies(), st.integers(1, 3))
def test_a_scan_sharing_a_previous_scans_last_runs_is_a_fresh_scan(
    data: st.DataObject, body: dict, case: tuple, edits: int
) -> None:
    """New leading elements (a new session's first message, an edited system message) before
    the previous scan's very runs: the scan copies what the previous one found in those runs,
    moved to its indices, and equals a fresh scan (section groups starting at the seam too)."""
    path, openai_body = case
    for adapter, key, payload in (
        (ANTHROPIC, "messages", body),
        (route(path)[0], "input" if path == "/v1/responses" else "messages", openai_body),
    ):
        old = payload.get(key)
        if not isinstance(old, list) or not old:
            continue
        pool = [m for m in old if isinstance(m, dict)] + [{"role": "system", "content": "Be brief."}]
        new = list(old)
        for i in range(min(edits, len(new))):
            new[i] = data.draw(st.sampled_from([*pool, {"role": "user", "content": f"first {i}"}, "not a message"]))
            if isinstance(new[i], dict):
                new[i] = dict(new[i])
        policy = adapter.marker_policy(payload)
        kinds = adapter.tool_shape.call_kinds
        old_runs = adapter.layout({key: old})
        previous = scan(old_runs, policy, kinds)
        new_runs = _with_old_runs(adapter.layout({key: new}), old_runs)
        fresh = _scan_fields(scan(new_runs, policy, kinds))
        assert _scan_fields(scan(new_runs, policy, kinds, previous)) == fresh


def test_a_scan_copying_trailing_runs_counts_their_odd_blocks_as_a_walk_does() -> None:
    """A block of no known kind in the trailing runs a scan copies (`_adopt_tail`) is counted
    as skipped once, as walking them counts it, and the copied scan remembers it for the next."""
    from proxy import malformed

    odd = {"type": ["text"], "text": "odd"}
    old = [
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": [{"type": "text", "text": "more"}, odd]},
    ]
    body = {"messages": old}
    policy, kinds = ANTHROPIC.marker_policy(body), ANTHROPIC.tool_shape.call_kinds
    counts = []
    for _ in range(2):
        tally = malformed.Tally()
        token = malformed.CURRENT.set(tally)
        try:
            old_runs = ANTHROPIC.layout(body)
            previous = scan(old_runs, policy, kinds)
            new = [{"role": "user", "content": "Start again."}, *old[1:]]
            redone = ANTHROPIC.relayout("messages", new, old, old_runs)
            assert redone is not None and redone[0][1:] == old_runs[1:]
            copied = scan(redone[0], policy, kinds, previous)
            again = scan(redone[0], policy, kinds, copied)  # the same runs: all copied
        finally:
            malformed.CURRENT.reset(token)
        assert _scan_fields(copied) == _scan_fields(scan(redone[0], policy, kinds))
        assert copied.odd == [2] and again.odd == [2]
        counts.append(dict(tally.counts))
    # the first walk and the copy of its tail; a scan of the very same runs copies them as a
    # leading stretch, which (as before) does not count them again
    assert counts[0] == counts[1] == {("parse", "block_type"): 2}


def test_same_suffix_counts_only_runs_after_the_shared_prefix() -> None:
    """The trailing runs compared from the end may run on into the shared prefix (an object
    standing at two places): what counts is at most the runs after it."""
    a, b, c, x, y = (object() for _ in range(5))
    old: list[Any] = [a, a, x, y, a, b, c]
    assert _same_suffix(old, [a, a, b, c], 2) == 2
    assert _same_suffix(old, [a, a, y, a, b, c], 2) == 4
    assert _same_suffix(old, [a, a, x, c], 2) == 1
    assert _same_suffix(old, [a, a], 2) == 0
