"""The forensic map of a request made from the session's previous map (`proxy.history.prompt_map`
with `previous`): equal to the map made from nothing, for growing, edited and reshaped bodies of
all three APIs, with and without the rules' classifier."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.history import PromptMap, _reused, prompt_map
from proxy.pipeline.segments import classifier_for
from proxy.prefix import PromptScan, scan_prompt
from proxy.providers import route
from proxy.rules import load_rules
from tests.pipeline.strategies import anthropic_bodies, nonempty_texts, openai_bodies

CLASSIFIER = classifier_for(load_rules())


def _fields(m: PromptMap) -> tuple[Any, ...]:
    return (tuple(m.ends), list(m.kinds), m.runs, m.ttls, m.tiers, m.is_budget_spent, m.blocks())


def _scan(path: str, body: dict[str, Any]) -> PromptScan:
    return scan_prompt(route(path)[0].layout(body))


def _array_key(body: dict[str, Any]) -> str:
    return "input" if isinstance(body.get("input"), list) else "messages"


@st.composite
def edits(draw: st.DrawFn, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The session's next body: grown, with a message's content grown, an empty message put
    in, a message or the system prompt changed, or the same again."""
    out = copy.deepcopy(body)
    key = _array_key(out)
    items = out.get(key)
    if not isinstance(items, list):
        return out
    kind = draw(st.sampled_from(["append", "append", "grow_last", "insert_empty", "change", "system", "same"]))
    text = draw(nonempty_texts)
    if kind == "append":
        for _ in range(draw(st.integers(1, 3))):
            items.append({"role": "user" if len(items) % 2 == 0 else "assistant", "content": text})
    elif kind == "grow_last" and items and isinstance(items[-1], dict):
        content = items[-1].get("content")
        text_type = "input_text" if path == "/v1/responses" else "text"
        if isinstance(content, list):
            content.append({"type": text_type, "text": text})
        else:
            items[-1]["content"] = [{"type": text_type, "text": text}]
    elif kind == "insert_empty" and items:
        at = draw(st.integers(0, len(items)))
        items.insert(at, {"role": "user", "content": []})
    elif kind == "change" and items:
        at = draw(st.integers(0, len(items) - 1))
        if isinstance(items[at], dict):
            items[at] = {**items[at], "content": text}
    elif kind == "system":
        field = "system" if path == "/v1/messages" else "instructions"
        if path == "/v1/chat/completions":
            items.insert(0, {"role": "system", "content": text})
        else:
            out[field] = text
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), api=st.sampled_from(["anthropic", "openai"]), classified=st.booleans())
def test_a_map_from_the_previous_map_equals_the_map_from_nothing(
    data: st.DataObject, api: str, classified: bool
) -> None:
    if api == "anthropic":
        path, body = "/v1/messages", data.draw(anthropic_bodies())
    else:
        path, body = data.draw(openai_bodies())
    classifier = CLASSIFIER if classified else None
    previous = prompt_map(_scan(path, body), None, classifier)
    for _ in range(data.draw(st.integers(1, 4))):
        body = data.draw(edits(path, body))
        scan = _scan(path, body)
        again = prompt_map(scan, "5m", classifier, None, previous)
        assert _fields(again) == _fields(prompt_map(scan, "5m", classifier))
        previous = again


def test_an_appended_turn_takes_the_earlier_runs_and_walks_the_new_ones() -> None:
    first = {
        "model": "m",
        "system": "You are a careful coding agent.\nCurrent time: 2026-11-29T20:09:13Z",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "fix it"}, {"type": "text", "text": "now"}]},
            {"role": "assistant", "content": "ok"},
        ],
    }
    grown = copy.deepcopy(first)
    grown["messages"] += [{"role": "user", "content": "and the tests"}, {"role": "assistant", "content": "done"}]
    one = prompt_map(_scan("/v1/messages", first), None, CLASSIFIER)
    scan = _scan("/v1/messages", grown)
    runs, tiers, at = _reused(one, scan, CLASSIFIER)
    assert (runs, tiers, at) == (
        [("system", None, None, 0, 1), ("messages", "user", 0, 1, 2), ("messages", "assistant", 1, 3, 1)],
        {0: "volatile"},
        4,
    )
    two = prompt_map(scan, None, CLASSIFIER, None, one)
    assert two.runs == (*runs, ("messages", "user", 2, 4, 1), ("messages", "assistant", 3, 5, 1))
    assert _fields(two) == _fields(prompt_map(scan, None, CLASSIFIER))
    # The last message grew a block: its run is no longer shared, the runs before it are.
    longer = copy.deepcopy(grown)
    longer["messages"][-1] = {
        "role": "assistant",
        "content": [{"type": "text", "text": "done"}, {"type": "text", "text": "!"}],
    }
    assert _reused(two, _scan("/v1/messages", longer), CLASSIFIER)[2] == 5
    # An empty message put in before the last two shifts their numbers: not shared.
    shifted = copy.deepcopy(grown)
    shifted["messages"].insert(2, {"role": "user", "content": []})
    assert _reused(two, _scan("/v1/messages", shifted), CLASSIFIER)[2] == 0
    # Another classifier, or none, shares nothing.
    assert _reused(two, scan, None) == ([], {}, 0)
