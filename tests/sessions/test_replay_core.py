"""Replay's pure core: marker stripping, masking, message views, mismatch, splice."""

from __future__ import annotations

import copy
import re

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.pipeline.replay import (
    MARKER_WALK_PARTS,
    MASK,
    Masker,
    first_mismatch,
    has_markers,
    has_markers_in,
    span_pattern,
    splice,
    strip_markers,
    sub_lines,
    view_messages,
)
from proxy.prefix import may_hold_marker
from proxy.providers import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from proxy.rules import load_rules, volatile_patterns
from proxy.store.codec import Sidecar

MASKER = Masker(volatile_patterns(load_rules()))

_MARKER_TEXT = st.sampled_from(["a", '"cache_control"', "prompt_cache_breakpoint", '{"cache_control": 1}'])
_MARKER = st.sampled_from(["cache_control", "prompt_cache_breakpoint", "type", "text"])
_LEAF = st.one_of(_MARKER_TEXT, st.integers(-1000, 1000), st.none())
_PART = st.dictionaries(
    _MARKER, st.one_of(_LEAF, st.lists(st.dictionaries(_MARKER, _LEAF, max_size=3), max_size=3)), max_size=3
)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"])},
    optional={
        "content": st.one_of(_MARKER_TEXT, st.lists(st.one_of(_PART, _LEAF), max_size=MARKER_WALK_PARTS + 4)),
        "cache_control": _LEAF,
    },
)


@given(st.one_of(_MESSAGE, _LEAF, st.lists(_PART, max_size=3)))
def test_has_markers_in_is_the_bytes_prefilter_then_the_walk(message: object) -> None:
    """Property: `has_markers_in(m, dumps(m))` is `may_hold_marker(dumps(m)) and has_markers(m)`,
    with markers at the message, part and nested-part levels, marker names inside strings, and
    content lists on both sides of `MARKER_WALK_PARTS`."""
    data = orjson.dumps(message)
    assert has_markers_in(message, data) is (may_hold_marker(data) and has_markers(message))


def test_has_markers_in_finds_a_marker_on_the_last_of_many_parts() -> None:
    parts: list[dict[str, object]] = [{"type": "text", "text": str(i)} for i in range(MARKER_WALK_PARTS + 3)]
    parts[-1] = {**parts[-1], "cache_control": {"type": "ephemeral"}}
    message = {"role": "user", "content": parts}
    assert has_markers_in(message, orjson.dumps(message)) is True
    unmarked = {"role": "user", "content": parts[:-1]}
    assert has_markers_in(unmarked, orjson.dumps(unmarked)) is False


def test_strip_markers_is_copy_on_write() -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
            {
                "type": "tool_result",
                "tool_use_id": "t",
                "content": [{"type": "text", "text": "r", "cache_control": {}}],
            },
            {"type": "text", "text": "plain"},
        ],
    }
    before = copy.deepcopy(message)
    stripped = strip_markers(message)
    assert message == before
    assert stripped == {
        "role": "user",
        "content": [
            {"type": "text", "text": "a"},
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r"}]},
            {"type": "text", "text": "plain"},
        ],
    }
    assert stripped["content"][2] is message["content"][2]


def test_span_pattern_masks_the_values_of_the_whole_token_only() -> None:
    pattern = span_pattern(re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}"))
    m = MASK
    assert sub_lines(pattern, "Now: 2026-11-29T20:09:13Z, fix bug 12\nat 2026-11-30 08:00:01 ok") == (
        f"Now: {m} fix bug 12\nat {m} {m} ok"
    )
    anchored = span_pattern(re.compile(r"(?i)^current time:"))
    assert sub_lines(anchored, "x\nCurrent time: 5") == "x\nCurrent time: 5"  # no value in the match
    # One line at a time: `\s*` never reaches across a newline into the next line.
    spaced = span_pattern(re.compile(r"^\s*id: \d"))
    assert sub_lines(spaced, "\n\n  id: 7\n") == f"\n\n  id: {m}\n"
    ids = span_pattern(re.compile(r"request_id=\w+"))
    assert sub_lines(ids, "request_id=3f2a9c1b7e4d ok") == f"{m} ok"  # a token holding a digit is a value


def test_words_a_volatile_pattern_spans_are_never_masked() -> None:
    # `\D{0,20}` in the packaged usage-counters rule spans words: an edit of them is a rewrite
    counters = span_pattern(re.compile(r"(?i)budget remaining\D{0,20}\d+"))
    before = sub_lines(counters, "Budget remaining for marketing: 5000 USD")
    assert before == f"Budget remaining for marketing: {MASK} USD"
    assert sub_lines(counters, "Budget remaining for engineering: 5000 USD") != before
    assert sub_lines(counters, "Budget remaining for marketing: 7000 USD") == before
    # a value that grows a digit group or a decimal still masks the same (one mask per token)
    usage = span_pattern(re.compile(r"(?i)context used:\s*\d[\d,]* tokens of \d+ \(\d"))
    assert sub_lines(usage, "Context used: 1,046 tokens of 200000 (0.5%)") == sub_lines(
        usage, "Context used: 546 tokens of 200000 (0%)"
    )


def test_masked_digest_ignores_timestamps_markers_and_key_order_only() -> None:
    a = {"role": "user", "content": [{"type": "text", "text": "Time: 2026-11-29T20:09:13Z\nfix the bug"}]}
    b = {
        "content": [
            {
                "text": "Time: 2026-11-30T08:00:00Z\nfix the bug",
                "type": "text",
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "role": "user",
    }
    c = {"role": "user", "content": [{"type": "text", "text": "Time: 2026-11-29T20:09:13Z\nfix the bugs"}]}
    d = {"role": "user", "content": [{"type": "text", "text": "Time: 2026-11-29T20:09:13Z fix the bugs"}]}
    assert MASKER.digest(a) == MASKER.digest(b)
    assert MASKER.digest(a) != MASKER.digest(c)
    assert MASKER.digest(c) != MASKER.digest(
        {**c, "content": [{"type": "text", "text": "Time: X\nfix the bugs"}]}
    )
    assert MASKER.digest(d) != MASKER.digest(
        {**d, "content": [{"type": "text", "text": "Time: 2026-11-29T20:09:13Z fix it"}]}
    )
    assert len(MASKER.digest(a)) == 16


def test_masker_memo_is_bounded() -> None:
    masker = Masker([re.compile(r"\d+")], memo_size=2)
    for i in range(5):
        masker.digest({"text": f"n{i}"})
    assert len(masker._memo) == 2
    assert masker.digest({"text": "n1"}) == masker.digest({"text": "n2"})


def test_view_anthropic() -> None:
    body = {
        "tools": [{"name": "t", "input_schema": {}}],
        "system": "You are helpful. Current time: 2026-11-29T20:09:13Z",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
    }
    view = view_messages(ANTHROPIC, body, MASKER)
    later = {**body, "system": "You are helpful. Current time: 2026-11-29T21:00:00Z"}
    assert view.array_key == "messages" and view.is_list and len(view.digests) == 2
    assert view.system_positions == frozenset()
    assert view_messages(ANTHROPIC, later, MASKER).boundaries == view.boundaries
    other_tools = {**body, "tools": [{"name": "u", "input_schema": {}}]}
    assert view_messages(ANTHROPIC, other_tools, MASKER).head != view.head


def test_view_openai_chat_and_responses() -> None:
    chat = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]}
    view = view_messages(OPENAI_CHAT, chat, MASKER)
    assert view.array_key == "messages" and view.system_positions == frozenset({0})
    responses = {"instructions": "be brief", "input": "hello"}
    view = view_messages(OPENAI_RESPONSES, responses, MASKER)
    assert view.array_key == "input" and not view.is_list and len(view.digests) == 1


def sidecars_for(items: list[dict], masker: Masker = MASKER) -> tuple[Sidecar, ...]:
    return tuple(Sidecar(i, masker.digest(m), orjson.dumps(strip_markers(m))) for i, m in enumerate(items))


SENT = [
    {"role": "user", "content": [{"type": "text", "text": "at 2026-11-29T20:09:13Z: start"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    {"role": "user", "content": "next"},
]


def test_splice_replays_earlier_messages_and_never_the_newest() -> None:
    client = [
        {"role": "user", "content": [{"type": "text", "text": "at 2026-11-30T10:00:00Z: start"}]},
        {"content": [{"text": "ok", "type": "text"}], "role": "assistant"},
        {"role": "user", "content": "next"},
        {"role": "assistant", "content": "sure"},
        {"role": "user", "content": "go"},
    ]
    before = copy.deepcopy(client)
    digests = [MASKER.digest(m) for m in client]
    result = splice(client, digests, sidecars_for(SENT), frozenset())
    assert client == before
    assert result.replayed == 2
    assert [orjson.dumps(m) for m in result.items[:3]] == [orjson.dumps(m) for m in SENT]
    assert result.items[2] is client[2]  # identical bytes: left as is
    assert result.items[3:] == client[3:]
    # the newest message is never replaced, even when it matches a sidecar
    same = [SENT[0]]
    assert splice(same, [MASKER.digest(SENT[0])], sidecars_for(SENT), frozenset()).items is None


def test_first_mismatch_and_limit() -> None:
    client = [
        SENT[0],
        {"role": "assistant", "content": [{"type": "text", "text": "edited"}]},
        SENT[2],
        {"role": "user", "content": "new"},
    ]
    digests = [MASKER.digest(m) for m in client]
    stored = sidecars_for(SENT)
    assert first_mismatch(digests, stored, frozenset()) == 1
    assert first_mismatch(digests, stored, frozenset({1})) is None
    assert first_mismatch(digests[:1], stored, frozenset()) is None
    result = splice(client, digests, stored, frozenset(), limit=1)
    assert result.items is None and result.replayed == 0


def test_seeded_pairs_are_used_instead_of_masking() -> None:
    masker = Masker([re.compile(r"\d+")])
    message = {"role": "user", "content": "turn 7"}
    exact, masked = masker.digests(message)
    fresh = Masker([re.compile(r"\d+")])
    fresh.seed([Sidecar(0, b"\x09" * 16, b"{}", exact)])
    assert fresh.digests(message) == (exact, b"\x09" * 16)  # from the seed: no masking ran
    assert masked != b"\x09" * 16
    unmasked = Masker(())
    unmasked.seed([Sidecar(0, b"\x09" * 16, b"{}", exact)])
    assert unmasked.digests(message) == (exact, exact)
