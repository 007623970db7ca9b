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

from proxy.pipeline.layout import LayoutCache, Scan, _actions, _scan, scan
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
    assert _scan_fields(_scan(new_runs, policy.key, _actions(policy, kinds), previous, known)) == fresh


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
