"""Key-order pinning: the fast paths of `order_like` and of tool-call input pinning give what
the plain recursive walk gives (an oracle kept here), on any JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.canonicalise import SessionPins, canonicalise_body, order_like
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
