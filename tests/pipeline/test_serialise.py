"""serialise (`proxy.pipeline.serialise.dumps_reusing`): the client's own elements copied from its
raw body give exactly `orjson.dumps` of the body, whatever the stages changed around them."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.pipeline.rawprefix import locate, top_level_start
from proxy.pipeline.serialise import dumps_reusing

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
MESSAGES = st.lists(st.dictionaries(st.sampled_from(["role", "content", "x"]), JSON, min_size=1), max_size=8)
KINDS = ["replace", "copy", "insert", "drop", "head", "key_after", "drop_head"]
EDITS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 99)), max_size=5)


def _located(client: dict[str, Any], key: str) -> tuple[bytes, int, list[int]]:
    """The client's compact raw body and its elements' start and end offsets (as the session
    stage finds them: `rawprefix.top_level_start`, `locate`)."""
    raw = orjson.dumps(client)
    dumped = [orjson.dumps(e) for e in client[key]]
    start = top_level_start(raw, key, dumped[0])
    assert start is not None
    return raw, start, locate(raw, dumped, start)


def _edit(client: dict[str, Any], key: str, edits: list[tuple[str, int]]) -> dict[str, Any]:
    """A sent body the way stages make one: copy-on-write, client elements kept as objects."""
    body = dict(client)
    items = list(body[key])
    for edit, at in edits:
        i = at % (len(items) + 1)
        if edit == "replace" and i < len(items):
            items[i] = {"role": "user", "content": [{"type": "text", "text": f"new {at}", "cache_control": {}}]}
        elif edit == "copy" and i < len(items):
            items[i] = dict(items[i])  # an equal copy: dumped again, the same bytes
        elif edit == "insert":
            items.insert(i, {"role": "user", "content": f"moved {at}"})
        elif edit == "drop" and i < len(items):
            del items[i]
        elif edit == "head":
            body["system"] = [{"type": "text", "text": f"system {at}"}]
        elif edit == "key_after":
            body = {**body, "stream": bool(at % 2)}
        elif edit == "drop_head":
            body.pop("model", None)
    body[key] = items
    return body


@settings(max_examples=300, deadline=None)
@given(MESSAGES.filter(bool), EDITS, st.integers(0, 2), st.sampled_from(["messages", "input"]))
def test_dumps_reusing_is_orjson_dumps(messages: list[Any], edits: list[tuple[str, int]], shift: int, key: str) -> None:
    client = {"model": "m", "max_tokens": 8, key: messages}
    raw, start, ends = _located(client, key)
    assert len(ends) == len(messages)
    body = _edit(client, key, edits)
    if shift:  # reorder dropped leading messages: the sent array is the client's after them
        body[key] = body[key][shift:]
    assert dumps_reusing(body, key, messages, raw, start, ends, shift) == orjson.dumps(body)
    # fewer located elements (locate stopped early): the rest is dumped
    assert dumps_reusing(body, key, messages, raw, start, ends[: len(ends) // 2], shift) == orjson.dumps(body)


def test_only_elements_that_are_the_clients_objects_come_from_the_raw_bytes() -> None:
    """Element 1 is the client's object: its bytes are copied (here deliberately not its
    compact dump, to see which path wrote it); element 0 is an equal copy: dumped again."""
    a, b = {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}
    raw = b'{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"B"}]}'
    start, ends = 13, [42, 77]
    assert raw[start : ends[0]] == orjson.dumps(a) and raw[ends[0]] == ord(",") and raw[ends[1] :] == b"]}"
    got = dumps_reusing({"model": "m", "messages": [dict(a), b]}, "messages", [a, b], raw, start, ends)
    assert got == b'{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"B"}]}'


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_the_recursion_limit_is_the_whole_dumps() -> None:
    """orjson refuses nesting past 254 levels from the body's root: a new element deep enough
    to fail inside the body fails here too, though it would dump alone."""
    client = {"messages": [{"role": "user", "content": "a"}]}
    raw, start, ends = _located(client, "messages")
    for depth in (250, 251, 252, 253):
        body = {"messages": [client["messages"][0], {"content": _nested(depth)}]}
        try:
            expected: bytes | None = orjson.dumps(body)
        except TypeError:
            expected = None
        if expected is None:
            orjson.dumps(body["messages"][1])  # alone it dumps
            with pytest.raises(TypeError):
                dumps_reusing(body, "messages", client["messages"], raw, start, ends)
        else:
            assert dumps_reusing(body, "messages", client["messages"], raw, start, ends) == expected
    with pytest.raises(TypeError):
        dumps_reusing({"messages": [], 1: 2}, "messages", (), raw, start, ends)  # type: ignore[dict-item]
