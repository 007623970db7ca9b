"""Key-order pinning: the fast paths of `order_like` and of tool-call input pinning give what
the plain recursive walk gives (an oracle kept here), on any JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.canonicalise import SessionPins, _pinned_prefix, canonicalise_body, order_like
from proxy.providers import ANTHROPIC
from tests.pipeline.strategies import anthropic_bodies

MESSAGES = "/v1/messages"
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

keys = st.sampled_from(["a", "b", "c", "path", "limit"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["x", "", "y"]))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)


def oracle(value: Any, reference: Any) -> Any:
    """The walk `order_like` is defined by (no fast path)."""
    if isinstance(value, dict) and isinstance(reference, dict):
        out = {k: value[k] for k in reference if k in value}
        out.update((k, v) for k, v in value.items() if k not in out)
        changed = list(out) != list(value)
        for k, v in out.items():
            if isinstance(v, dict | list) and k in reference:
                ordered = oracle(v, reference[k])
                if ordered is not v:
                    out[k] = ordered
                    changed = True
        return out if changed else value
    if isinstance(value, list) and isinstance(reference, list):
        new = list(value)
        changed = False
        for i in range(min(len(value), len(reference))):
            ordered = oracle(value[i], reference[i])
            if ordered is not value[i]:
                new[i] = ordered
                changed = True
        return new if changed else value
    return value


def _shuffled(draw: Callable[..., Any], value: Any, top: bool = True) -> Any:
    """`value` with dict keys permuted at every level (same content); `top` False keeps the
    outermost key order."""
    if isinstance(value, dict):
        order = draw(st.permutations(list(value))) if top else list(value)
        return {k: _shuffled(draw, value[k]) for k in order}
    if isinstance(value, list):
        return [_shuffled(draw, v) for v in value]
    return value


@st.composite
def pairs(draw: st.DrawFn) -> tuple[Any, Any]:
    value = draw(json_values)
    kind = draw(st.sampled_from(["same", "shuffled", "other"]))
    if kind == "same":
        return value, value
    if kind == "shuffled":
        return value, _shuffled(draw, value)
    return value, draw(json_values)


@FAST
@given(pairs())
def test_order_like_is_the_walk(pair: tuple[Any, Any]) -> None:
    value, reference = pair
    expected = oracle(value, reference)
    got = order_like(value, reference)
    assert got == expected and list(_keys(got)) == list(_keys(expected))
    assert (got is value) == (expected is value)


def _keys(value: Any) -> Any:
    """Every dict's key order, depth first."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v)


@FAST
@given(st.data(), anthropic_bodies())
def test_pinned_inputs_are_ordered_like_the_walk(data: st.DataObject, body: dict) -> None:
    extra = data.draw(st.lists(st.dictionaries(keys, json_values, max_size=4), max_size=4))
    if extra:
        uses = [{"type": "tool_use", "id": f"t{i}", "name": "edit", "input": v} for i, v in enumerate(extra)]
        body["messages"] = [*body["messages"], {"role": "assistant", "content": uses}]
    calls = [
        block
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_use"
    ]
    for block in calls:  # some inputs hold objects and arrays
        if data.draw(st.booleans()):
            block["input"] = {**block["input"], "nested": data.draw(json_values)}
    pinned = {}
    for block in calls:
        if data.draw(st.booleans()):
            top = data.draw(st.booleans())
            pinned[block["name"]] = data.draw(
                st.one_of(st.just(_shuffled(data.draw, block["input"], top)), json_values)
            )
    out, report = canonicalise_body(ANTHROPIC, body, SessionPins(pinned_inputs=pinned))
    plain, _ = canonicalise_body(ANTHROPIC, body)
    got = [b for m in out["messages"] if isinstance(m["content"], list) for b in m["content"]]
    base = [b for m in plain["messages"] if isinstance(m["content"], list) for b in m["content"]]
    assert len(got) == len(base)
    pinned_count = 0
    for new, old in zip(got, base, strict=True):
        if old.get("type") == "tool_use" and old["name"] in pinned and isinstance(old["input"], dict):
            expected = oracle(old["input"], pinned[old["name"]])
            pinned_count += expected is not old["input"]
            assert new["input"] == expected and list(_keys(new["input"])) == list(_keys(expected))
            assert {k: v for k, v in new.items() if k != "input"} == {k: v for k, v in old.items() if k != "input"}
        else:
            assert new == old
    assert report.keys_pinned == pinned_count


def _call_turn(k: int, name: str, call_input: dict[str, Any]) -> list[dict[str, Any]]:
    call = {"type": "tool_use", "id": f"toolu_{k}", "name": name, "input": call_input}
    return [
        {"role": "assistant", "content": [{"type": "text", "text": f"step {k}"}, call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": "ok"}]},
    ]


def _turns_with_seeded_cache(
    bodies: list[dict[str, Any]], pins: list[SessionPins | None]
) -> list[tuple[bytes, Any, Any]]:
    """Each body canonicalised as the stages do on an appended turn (the layout cache seeded
    with the previous body's scans, `LayoutCache.seed`), beside a fresh cache's result."""
    from proxy.pipeline.layout import LayoutCache

    policy = ANTHROPIC.marker_policy(bodies[0])
    kinds = ANTHROPIC.tool_shape.call_kinds
    snapshot = None
    out = []
    for body, pinned in zip(bodies, pins, strict=True):
        cache = LayoutCache()
        if snapshot is not None:
            cache.seed(snapshot)
        part = cache.scans(ANTHROPIC, body, policy, kinds)[-1][1]  # the session stage's scan
        snapshot = cache.snapshot()
        reused = _pinned_prefix(part, pinned.pinned_inputs)[:2] if pinned is not None else None
        got, report = canonicalise_body(ANTHROPIC, body, pinned, cache=cache)
        fresh, fresh_report = canonicalise_body(ANTHROPIC, body, pinned)
        assert orjson.dumps(got) == orjson.dumps(fresh) and report == fresh_report
        assert list(_keys(got)) == list(_keys(fresh))
        memo = cache.scans(ANTHROPIC, body, policy, kinds)[-1][1].pin_memo
        out.append((orjson.dumps(got), report.keys_pinned, memo[:2] if memo is not None else None, reused))
    return out


CALL_INPUTS = st.dictionaries(keys, json_values, min_size=1, max_size=3)


@FAST
@given(st.lists(st.tuples(st.sampled_from(["read", "edit"]), CALL_INPUTS), min_size=1, max_size=6), st.data())
def test_pinning_an_appended_turn_is_pinning_it_whole(calls: list[tuple[str, Any]], data: st.DataObject) -> None:
    """The calls a previous turn's pinning found needing nothing are not walked again while
    their names keep the very pinned inputs: the result is the whole walk's whatever the pins
    do between turns (kept, a name pinned anew, the same input as another object, another
    input for a name)."""
    messages: list[Any] = [{"role": "user", "content": "go"}]
    bodies, pins = [], []
    pinned: dict[str, Any] = {}
    for k, (name, call_input) in enumerate(calls):
        messages = [*messages, *_call_turn(k, name, call_input)]
        bodies.append({"model": "m", "max_tokens": 8, "messages": messages})
        change = data.draw(st.sampled_from(["keep", "keep", "pin_new", "copy", "other"]))
        if change == "pin_new" and name not in pinned:
            pinned = {**pinned, name: _shuffled(data.draw, call_input, data.draw(st.booleans()))}
        elif change == "copy":
            pinned = {n: dict(v) if isinstance(v, dict) else v for n, v in pinned.items()}
        elif change == "other" and pinned:
            victim = data.draw(st.sampled_from(sorted(pinned)))
            pinned = {**pinned, victim: data.draw(CALL_INPUTS)}
        pins.append(SessionPins(pinned_inputs=pinned) if pinned else None)
    _turns_with_seeded_cache(bodies, pins)


def test_an_appended_turn_pins_only_its_new_calls() -> None:
    """Four turns, `read` pinned as `{"path", "limit"}`: calls in that order need nothing (and
    are not walked again), the call in the other order is pinned again on every turn; a new
    pinned input object for `read` (equal to it) walks every call again, with the same result."""
    reference = {"path": "a", "limit": 1}
    inputs = [{"path": "x", "limit": 2}, {"limit": 3, "path": "y"}, {"path": "z", "limit": 4}, {"path": "w"}]
    messages: list[Any] = [{"role": "user", "content": "go"}]
    bodies = []
    for k, call_input in enumerate(inputs):
        messages = [*messages, *_call_turn(k, "read", call_input)]
        bodies.append({"model": "m", "max_tokens": 8, "messages": messages})
    same = SessionPins(pinned_inputs={"read": reference})
    got = _turns_with_seeded_cache(bodies, [same] * 4)
    # calls pinned; the memo (calls, those pinned); what the next turn took from it (start, redo)
    assert [g[1:] for g in got] == [
        (0, (1, ()), (0, [])),
        (1, (2, (1,)), (1, [])),
        (1, (3, (1,)), (2, [1])),
        (1, (4, (1,)), (3, [1])),
    ]
    other = SessionPins(pinned_inputs={"read": dict(reference)})  # equal, another object
    again = _turns_with_seeded_cache(bodies, [same, same, other, other])
    assert [(g[1], g[3]) for g in again] == [(0, (0, [])), (1, (1, [])), (1, (0, [])), (1, (3, [1]))]
    assert [g[0] for g in got] == [a[0] for a in again]
