"""The record builder's leading unchanged sidecars found by columns (`unchanged_sidecars`) are
exactly what the element walk finds: the same sidecars, the previous record's very objects
where it reused them, for appended, edited, truncated and re-sent histories."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.pipeline.replay import Masker, stored_columns, view_messages
from proxy.pipeline.session import build_sidecars, unchanged_sidecars
from proxy.providers import ANTHROPIC
from proxy.rules import load_rules, volatile_patterns

MASKER = Masker(volatile_patterns(load_rules()))
_TEXT = st.sampled_from(["hi", "ok", "run it", "2026-12-03 10:00", "done", "x" * 40])
_MESSAGE = st.builds(
    lambda role, texts: {"role": role, "content": [{"type": "text", "text": t} for t in texts]},
    st.sampled_from(["user", "assistant"]),
    st.lists(_TEXT, min_size=1, max_size=3),
)


def body(messages: list[Any]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": messages}


def record_of(messages: list[Any]) -> tuple[Any, ...]:
    view = view_messages(ANTHROPIC, body(messages), MASKER)
    return build_sidecars(messages, view, {}, ())


@given(
    st.lists(_MESSAGE, min_size=1, max_size=12),
    st.lists(_MESSAGE, max_size=4),
    st.integers(0, 12),
    st.sampled_from(["append", "edit", "redate", "truncate", "copy", "resent"]),
)
@settings(max_examples=150, deadline=None)
def test_columns_find_what_the_walk_finds(first: list[Any], more: list[Any], at: int, how: str) -> None:
    previous = record_of(first)
    messages = [*first, *more]
    if how == "edit" and messages:
        i = at % len(messages)
        messages[i] = {**messages[i], "content": [{"type": "text", "text": f"edited {at}"}]}
    elif how == "redate":  # another timestamp: the masked digest is the same, the bytes are not
        for i in range(at % len(messages), len(messages)):
            text = orjson.dumps(messages[i]).replace(b"2026-12-03 10:00", b"2026-12-04 11:30")
            messages[i] = orjson.loads(text)
    elif how == "truncate":
        messages = messages[: at % (len(messages) + 1)] or messages[:1]
    elif how == "copy":  # the same bytes in new objects: not the objects the view digested
        messages = copy.deepcopy(messages)
    view = view_messages(ANTHROPIC, body(messages), MASKER)
    # "resent": the array sent holds other objects than the ones the view digested (replay's)
    sent = copy.deepcopy(messages) if how == "resent" else list(messages)
    columns = stored_columns(previous)
    walked = build_sidecars(sent, view, {}, previous)
    fast = build_sidecars(sent, view, {}, previous, columns)
    assert fast == walked
    assert [a is p for a, p in zip(fast, previous, strict=False)] == [
        b is p for b, p in zip(walked, previous, strict=False)
    ]
    kept = unchanged_sidecars(sent, view, previous, columns)
    assert all(fast[i] is previous[i] for i in range(kept))
    common = next((i for i, (a, b) in enumerate(zip(first, messages, strict=False)) if a != b), None)
    limit = min(len(first), len(messages)) if common is None else common
    assert kept <= limit


def test_an_appended_turn_keeps_every_earlier_sidecar_and_walks_the_new_ones() -> None:
    first = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    previous = record_of(first)
    messages = [*first, {"role": "user", "content": "next"}]
    view = view_messages(ANTHROPIC, body(messages), MASKER)
    columns = stored_columns(previous)
    assert unchanged_sidecars(messages, view, previous, columns) == 2
    out = build_sidecars(messages, view, {}, previous, columns)
    assert (out[0] is previous[0], out[1] is previous[1], out[2].position, out[2].value) == (
        True,
        True,
        2,
        b'{"role":"user","content":"next"}',
    )
