"""Byte-prefix reuse (`proxy.pipeline.rawprefix`): which leading elements are unchanged, and a
message view that is the same with or without it."""

from __future__ import annotations

from functools import partial
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.pipeline import rawprefix
from proxy.pipeline.rawprefix import CHUNK, RawPrefixIndex, RawState, chunk_digests, locate, reusable, shared_prefix
from proxy.pipeline.replay import Masker, MessageView, RawBody, view_messages
from proxy.pipeline.segments import classifier_for, without_volatile
from proxy.providers import ANTHROPIC
from proxy.rules import load_rules, volatile_patterns

RULES = load_rules()
MESSAGES = "/v1/messages"


def _masker() -> Masker:
    return Masker(volatile_patterns(RULES), system_text=partial(without_volatile, classifier_for(RULES)))


def _turn(k: int, stamp: str = "") -> list[dict[str, Any]]:
    call = f"toolu_{k:05d}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Step {k}: reading the next file.{stamp}"},
                {"type": "tool_use", "id": call, "name": "read", "input": {"path": f"src/m{k}.py"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": f"x = {k}\n" * 300}]},
    ]


def _body(turns: int, first: str = "Start.") -> dict[str, Any]:
    messages: list[Any] = [{"role": "user", "content": first}]
    for k in range(turns):
        messages.extend(_turn(k))
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "You are a careful agent. " * 60}],
        "tools": [{"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}],
        "messages": messages,
    }


def _view_fields(view: MessageView) -> tuple[Any, ...]:
    return (view.array_key, view.head, view.digests, view.exact, view.boundaries, view.keys, view.system_positions)


def test_chunk_digests_cover_full_chunks_only() -> None:
    raw = b"a" * (2 * CHUNK + 10)
    digests = chunk_digests(raw)
    assert len(digests) == 32
    assert digests[:16] == digests[16:]
    assert chunk_digests(b"a" * (CHUNK - 1)) == b""


def test_shared_prefix_is_byte_exact_for_an_append_and_chunk_exact_for_an_edit() -> None:
    old = b"x" * (3 * CHUNK + 100) + b"]}"
    state = RawState(chunk_digests(old), old[3 * CHUNK :], (), ())
    appended = old[:-2] + b',{"more":1}]}'
    assert shared_prefix(appended, chunk_digests(appended), state) == len(old) - 2
    edited = old[: CHUNK + 5] + b"y" + old[CHUNK + 6 :]
    assert shared_prefix(edited, chunk_digests(edited), state) == CHUNK
    assert shared_prefix(old, chunk_digests(old), state) == len(old)


def test_locate_finds_compact_elements_and_stops_at_the_first_misplaced_one() -> None:
    elements = [{"a": 1}, {"b": [2, 3]}, "s"]
    raw = b'{"m":1,"messages":' + orjson.dumps(elements) + b"}"
    dumped = [orjson.dumps(e) for e in elements]
    start = rawprefix.top_level_start(raw, "messages", dumped[0])
    assert start == raw.index(b"[{") + 1
    assert locate(raw, dumped, start) == [start + 7, start + 19, start + 23]
    spaced = orjson.dumps({"messages": elements}, option=orjson.OPT_INDENT_2)
    assert rawprefix.top_level_start(spaced, "messages", dumped[0]) is None
    loose = b'{"messages":[{"a":1}, {"b":[2,3]},"s"]}'
    assert locate(loose, dumped, 13) == [20]


def test_a_nested_array_of_the_same_name_is_not_the_top_level_one() -> None:
    first = orjson.dumps({"role": "user", "content": "hi"})
    raw = b'{"metadata":{"messages":[' + first + b']},"messages":[' + first + b"]}"
    start = rawprefix.top_level_start(raw, "messages", first)
    assert start is None  # the first occurrence is nested: no reuse rather than a wrong one


def _separated(size: int, commas: tuple[int, ...]) -> bytes:
    raw = bytearray(b"z" * size)
    for at in commas:
        raw[at] = ord(",")
    return bytes(raw)


def test_reusable_counts_whole_elements_and_refuses_a_duplicate_key() -> None:
    state = RawState(b"", b"", (100, 200, 300), ((1, 2, 3),))
    raw = _separated(400, (100, 200, 300))
    assert reusable(state, 250, raw, "messages") == 2
    assert reusable(state, 99, raw, "messages") == 0
    duplicate = raw[:300] + b',"messages":[]}'
    assert reusable(state, 300, duplicate, "messages") == 0


def test_an_element_whose_next_byte_is_new_and_not_a_separator_is_not_reused() -> None:
    """`[1,2` then `.5`: the shared bytes end element 1's bytes but not its value (2.5)."""
    state = RawState(b"", b"", (100, 200, 300), ((1, 2, 3),))
    raw = _separated(300, (100, 200)) + b".5]}"
    assert reusable(state, 300, raw, "messages") == 2


def test_index_keeps_one_state_per_growing_conversation() -> None:
    masker = _masker()
    for turns in range(1, 8):
        body = _body(20 + turns)
        raw = orjson.dumps(body)
        view_messages(ANTHROPIC, body, masker, raw=RawBody(raw, "tenant\x00/v1/messages"))
    assert len(masker.raw_index) == 1
    state, shared = masker.raw_index.match("tenant\x00/v1/messages", chunk_digests(raw), raw)
    assert state is not None and shared == len(raw)
    assert len(state.ends) == len(body["messages"])
    other, _ = masker.raw_index.match("other\x00/v1/messages", chunk_digests(raw), raw)
    assert other is None  # another scope (tenant) never matches


def test_index_is_bounded() -> None:
    index = RawPrefixIndex(max_states=4, max_per_head=2)
    for i in range(10):
        raw = bytes([i]) * CHUNK
        index.remember("s", RawState(chunk_digests(raw), b"", (1,), ((i,),)))
    assert len(index) == 4
    same_head = b"h" * CHUNK
    for i in range(5):
        index.remember("t", RawState(chunk_digests(same_head + bytes([i]) * CHUNK), b"", (1,), ((i,),)))
    assert len(index) <= 4


def test_kept_bodies_of_more_sessions_than_fit_stay_with_the_ones_that_come_back() -> None:
    index = RawPrefixIndex(max_parsed_bytes=3 * 4 * CHUNK)
    last: dict[int, RawState] = {}
    turns: dict[int, int] = {}

    def turn(session: int) -> bool:
        """One request of `session` (its body a chunk longer each turn), as
        `proxy.pipeline.replay` keeps it; whether its body is kept."""
        turns[session] = turns.get(session, 0) + 1
        raw = bytes([session]) * CHUNK * 3 + bytes([100 + turns[session]]) * CHUNK
        previous = last.get(session)
        had_kept = previous is not None and index.parsed(previous) is not None
        gap = index.since(previous)
        state = last[session] = RawState(chunk_digests(raw), b"", (1,), ((session,),))
        index.remember("t", state, previous)
        kept = index.keep_parsed(state, (), "messages", None, "t", gap, had_kept)
        assert kept is not None and kept.state is state  # this request's, held or not
        return index.parsed(state) is kept

    # a new session counts as away for as many bodies as are kept: session 3 displaces session 0
    assert [turn(s) for s in (0, 1, 2, 3)] == [True, True, True, True]
    # four sessions take turns where three fit: session 0, away 4 bodies, displaces none of the
    # three, idle 3 at most, and they stay kept (plain LRU: none ever reused)
    assert [turn(s) for _ in range(3) for s in (0, 1, 2, 3)] == [False, True, True, True] * 3
    # session 1 stops: a round later session 0, away 3 bodies, takes its place, idle 4
    assert [turn(s) for s in (0, 2, 3)] == [False, True, True]
    assert [turn(s) for s in (0, 2, 3)] == [True, True, True]
    assert index.parsed(last[1]) is None


EDITS = st.sampled_from(["append", "same", "edit_middle", "marker", "reformat", "duplicate", "truncate", "stamp"])


def _edited(body: dict[str, Any], edit: str, at: int) -> bytes:
    messages = list(body["messages"])
    at = at % len(messages)
    if edit == "append":
        messages.extend(_turn(len(messages)))
    elif edit == "edit_middle":
        messages[at] = {"role": messages[at]["role"], "content": "changed"}
    elif edit == "marker":
        marked = {"type": "text", "text": "m", "cache_control": {"type": "ephemeral"}}
        messages[at] = {**messages[at], "content": [marked]}
    elif edit == "truncate":
        messages = messages[: max(1, at)]
    elif edit == "stamp":
        messages.extend(_turn(len(messages), " at 2026-12-01T17:00:00Z"))
    new = {**body, "messages": messages}
    if edit == "reformat":
        return orjson.dumps(new, option=orjson.OPT_INDENT_2)
    if edit == "duplicate":
        return orjson.dumps(new)[:-1] + b',"messages":[{"role":"user","content":"other"}]}'
    return orjson.dumps(new)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(EDITS, st.integers(0, 10_000)), min_size=1, max_size=6), st.integers(25, 40))
def test_view_is_the_same_with_byte_prefix_reuse(edits: list[tuple[str, int]], turns: int) -> None:
    plain, reusing = _masker(), _masker()
    body = _body(turns)
    raw = orjson.dumps(body)
    for edit, at in [("same", 0), *edits]:
        raw = _edited(body, edit, at) if edit != "same" else raw
        parsed = orjson.loads(raw)
        expected = view_messages(ANTHROPIC, orjson.loads(raw), plain)
        got = view_messages(ANTHROPIC, parsed, reusing, raw=RawBody(raw, "t"))
        assert _view_fields(got) == _view_fields(expected)
        assert parsed == orjson.loads(raw)  # the caller's body is not mutated
        body = orjson.loads(raw)
        if edit == "reformat":
            raw = orjson.dumps(body)


def test_every_edited_position_is_walked_again() -> None:
    body = _body(30)
    for at in range(1, len(body["messages"]), 7):
        plain, reusing = _masker(), _masker()
        raw = orjson.dumps(body)
        view_messages(ANTHROPIC, orjson.loads(raw), reusing, raw=RawBody(raw, "t"))
        messages = list(body["messages"])
        messages[at] = {"role": messages[at]["role"], "content": "changed"}
        edited = orjson.dumps({**body, "messages": messages})
        expected = view_messages(ANTHROPIC, orjson.loads(edited), plain)
        got = view_messages(ANTHROPIC, orjson.loads(edited), reusing, raw=RawBody(edited, "t"))
        assert _view_fields(got) == _view_fields(expected)


def test_an_appended_turn_chains_its_boundaries_onto_the_earlier_ones() -> None:
    """The identity boundaries of the reused elements are the recent body's own (not chained
    again) when the head is the same; a tool set sent after the array and changed (the same
    message bytes, another head) chains everything again. Both equal a view without reuse."""
    plain, reusing = _masker(), _masker()
    body = _body(30)
    first = orjson.dumps(body)
    a = view_messages(ANTHROPIC, orjson.loads(first), reusing, raw=RawBody(first, "t"))
    second = orjson.dumps({**body, "messages": [*body["messages"], *_turn(30)]})
    b = view_messages(ANTHROPIC, orjson.loads(second), reusing, raw=RawBody(second, "t"))
    assert _view_fields(b) == _view_fields(view_messages(ANTHROPIC, orjson.loads(second), plain))
    n = len(body["messages"])
    assert len(b.boundaries) == n + 2 and all(x is y for x, y in zip(a.boundaries, b.boundaries[:n], strict=True))
    # tools after the array: the messages' bytes are unchanged, the head is not
    tail_tools = {k: v for k, v in body.items() if k != "tools"}
    tools_last = orjson.dumps({**tail_tools, "tools": body["tools"]})
    c = view_messages(ANTHROPIC, orjson.loads(tools_last), reusing, raw=RawBody(tools_last, "u"))
    other_tools = [{**body["tools"][0], "description": "Read a file, then another."}]
    changed = orjson.dumps({**tail_tools, "messages": [*body["messages"], *_turn(30)], "tools": other_tools})
    d = view_messages(ANTHROPIC, orjson.loads(changed), reusing, raw=RawBody(changed, "u"))
    expected = view_messages(ANTHROPIC, orjson.loads(changed), plain)
    assert _view_fields(d) == _view_fields(expected)
    assert d.head != c.head and d.digests[:n] == c.digests[:n] and d.boundaries[0] != c.boundaries[0]


def _ending_body(first: bytes, last: bytes) -> tuple[bytes, RawState]:
    """A body `{"messages":[first, <3 chunks>, last]}` of string elements and its state, with
    the array end `find_around` looks for (`RawState.anchor`)."""
    elements = [orjson.dumps(first.decode()), orjson.dumps("x" * 3 * CHUNK), orjson.dumps(last.decode())]
    raw = b'{"messages":[' + b",".join(elements) + b"]}"
    ends = tuple(locate(raw, elements, 13))
    rdigests, anchor = rawprefix.array_end(raw, ends)
    full = len(raw) // CHUNK * CHUNK
    return raw, RawState(chunk_digests(raw), raw[full:], ends, ((0, 1, 2),), 13, rdigests=rdigests, anchor=anchor)


def test_the_newest_bodies_the_admission_turned_away_are_read_around_an_edit_only() -> None:
    _, held = _ending_body(b"held body", b"another end")
    _, away = _ending_body(b"session a", b"the end")
    raw_b, _ = _ending_body(b"session bb", b"the end")  # the same conversation under another first message
    index = RawPrefixIndex(max_parsed_bytes=held.size + away.size - 1)  # one of them, and half again
    assert index.keep_parsed(held, ("held",), "messages", None, "t") is not None
    assert index.parsed(held) is not None
    index.keep_parsed(away, ("session a",), "messages", None, "t", gap=50, replaces_kept=False)
    assert index.parsed(away) is None  # turned away: held 1 tick, the session away 50
    found = index.find_around("t", raw_b)
    assert found is not None and found[0].state is away
    assert (found[1], found[2]) == (len(raw_b) - 2, 3 * CHUNK)  # its `]`, the three whole chunks before it
    assert index.find_around("u", raw_b) is None  # another scope's
    others = [_ending_body(b"other %d" % i, b"its end %d" % i)[1] for i in range(rawprefix.MAX_RECENT)]
    for state in others:
        index.keep_parsed(state, (), "messages", None, "t", gap=50, replaces_kept=False)
    assert index.find_around("t", raw_b) is None  # the newest MAX_RECENT turned away are others
    index.keep_parsed(away, ("session a",), "messages", None, "t", gap=50, replaces_kept=False)
    assert index.find_around("t", raw_b) is not None
    index.drop_parsed(away)  # its session's next body replaced it
    assert index.find_around("t", raw_b) is None
    small = RawPrefixIndex(max_parsed_bytes=2 * away.size - 1)  # half of it is under one body
    small.keep_parsed(held, (), "messages", None, "t")
    small.keep_parsed(away, (), "messages", None, "t", gap=50, replaces_kept=False)
    assert small.find_around("t", raw_b) is None
