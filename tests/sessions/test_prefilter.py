"""`proxy.pipeline.prefilter`: a text the prefilter rejects never holds a match (soundness), and
filtered masking equals unfiltered masking."""

from __future__ import annotations

import copy
import re

import orjson
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.prefilter import needs
from proxy.pipeline.replay import Masker, mask_filtered, mask_strings, span_pattern
from proxy.prefix import canonical_value
from proxy.rules import load_rules, volatile_patterns
from tests.pipeline.strategies import LINES

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RULE_SPANS = tuple(span_pattern(p) for p in volatile_patterns(load_rules()))
EXTRA = tuple(
    re.compile(p, f)
    for p, f in [
        (r"ab(?i:cd)EF\d", 0),
        (r"(?i)x(?-i:Yz)", 0),
        (r"(foo|bar\d)+baz", 0),
        (r"(?:k|q)?token", re.IGNORECASE),
        (r"[0-9]{2}|zz", 0),
        (r"(?=abc)abc", 0),
        (r"(a)\1", 0),
        (r"(?>at)om", 0),
    ]
)
PATTERNS = RULE_SPANS + EXTRA
# Letters of the patterns' literals in both cases, digits, separators, and characters whose
# case folding differs between `re` and `str.lower` (Kelvin sign, long s, dotted I).
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFKTXYZ0123456789 -:_=%/.\n\u212a\u017f\u0130"
words = st.sampled_from(
    ["token", "TOKENS used", "context", "Current time", "2026-11-29T20:09", "epoch", "request_id:",
     "x-anthropic-billing-header:", "total cost", "abcdEF7", "xYz", "bar1baz", "atom", "aa"]
)
texts = st.lists(st.one_of(st.text(ALPHABET, max_size=12), words, st.sampled_from(LINES)), max_size=8).map("".join)


@FAST
@given(texts)
def test_a_rejected_text_never_matches(text: str) -> None:
    for pattern in PATTERNS:
        need = needs(pattern)
        if need is not None and not need.admits(text):
            assert pattern.search(text) is None, (pattern.pattern, text)


def test_the_packaged_rules_get_conditions() -> None:
    assert all(needs(p) is not None for p in RULE_SPANS)
    assert needs(re.compile(r"(?=abc)")) is None  # a lookahead alone: no condition, always run


@FAST
@given(st.lists(texts, max_size=4))
def test_filtered_masking_is_masking(values: list[str]) -> None:
    value = {"content": [{"type": "text", "text": t} for t in values], "role": "user"}
    filters = tuple((p, needs(p)) for p in PATTERNS)
    assert mask_filtered(value, filters) == mask_strings(value, PATTERNS)


def test_a_budget_charges_every_string_looked_at_and_stops_walking_once_spent() -> None:
    """100,000 tiny blocks held the loop for seconds in the prefilter alone (no pattern ran):
    each string now costs `LINE_SCAN_COST`, and a spent budget returns the rest unwalked."""
    from proxy.rules import LINE_SCAN_COST, Budget

    filters = tuple((p, needs(p)) for p in RULE_SPANS)
    stamp = "at 2026-11-29T20:07:13Z"
    value = [stamp, "b1", "b2", stamp]
    budget = Budget(3 * LINE_SCAN_COST + len(stamp))  # the first stamp's run and three looks
    out = mask_filtered(value, filters, budget)
    assert out[0] != stamp and out[1:] == ["b1", "b2", stamp]
    assert (budget.left, budget.is_spent) == (0, True)
    many = [f"b{i}" for i in range(100_000)]
    spent = Budget(10 * LINE_SCAN_COST)
    assert mask_filtered(many, filters, spent) == many
    assert (spent.left, spent.is_spent) == (0, True)


@FAST
@given(st.lists(texts, max_size=4), st.integers(min_value=0, max_value=2_000))
def test_a_value_no_filter_admits_as_a_whole_is_never_masked(values: list[str], chars: int) -> None:
    """`may_mask` checks a message's strings once, joined: when it says no, filtered masking
    leaves every string as it is and charges the budget exactly as walking them would."""
    from proxy.pipeline.replay import _strings_of, may_mask
    from proxy.rules import LINE_SCAN_COST, Budget

    value = {"role": "user", "content": [{"type": "text", "text": t} for t in values]}
    strings: list[str] = []
    _strings_of(value, strings)
    assert strings == ["user", *[s for t in values for s in ("text", t)]]
    filters = tuple((p, needs(p)) for p in PATTERNS)
    if not may_mask(filters, strings):
        budget = Budget(chars)
        assert mask_filtered(value, filters, budget) == value
        walked = min(len(strings), chars // LINE_SCAN_COST)
        assert (budget.left, budget.is_spent) == (chars - walked * LINE_SCAN_COST, walked < len(strings))


def test_may_mask_is_one_check_per_message() -> None:
    from proxy.pipeline.replay import may_mask

    filters = tuple((p, needs(p)) for p in RULE_SPANS)
    assert not may_mask(filters, ["user", "tool_result", "toolu_000012", "line 12\nline 12\n"])
    assert may_mask(filters, ["user", "text", "Current time: 2026-11-29T20:09:13Z"])
    # one string holds the date, another the time: joined they admit the timestamp rule (sound)
    assert may_mask(filters, ["2026-11-29", "20:09"])
    assert may_mask(filters, ["Zeit: 2026-11-29 20:09 \u00fcber"])  # non-ASCII: always run
    assert not may_mask(filters, [])


@FAST
@given(st.lists(st.lists(texts, max_size=3), min_size=1, max_size=4), st.integers(min_value=0, max_value=3_000))
def test_masked_digests_and_budget_are_those_of_walking_every_string(messages: list[list[str]], chars: int) -> None:
    """The masker's digests (one `may_mask` check per message first) equal masking every
    string with every filter, and the request's budget ends in the same state."""
    import orjson
    import xxhash

    from proxy.pipeline.replay import Masker
    from proxy.prefix import canonical_value
    from proxy.rules import Budget

    # distinct messages (a repeated one is a memo hit: not walked, not charged)
    values = [
        {"role": "user", "id": "a" * i, "content": [{"type": "text", "text": t} for t in texts]}
        for i, texts in enumerate(messages)
    ]
    masker = Masker(volatile_patterns(load_rules()))
    budget = masker.begin(chars)
    got = [masker.examine(v)[1] for v in values]
    reference = Budget(chars)
    filters = tuple((p, needs(p)) for p in RULE_SPANS)
    expected = [
        xxhash.xxh3_128_digest(
            orjson.dumps(mask_filtered(canonical_value(v), filters, reference), option=orjson.OPT_SORT_KEYS)
        )
        for v in values
    ]
    assert got == expected
    assert budget is not None and (budget.left, budget.is_spent) == (reference.left, reference.is_spent)


def test_nothing_masked_returns_the_value_itself_and_a_masked_copy_leaves_it_alone() -> None:
    filters = tuple((span, needs(span)) for span in RULE_SPANS)
    calm = {"role": "user", "content": [{"type": "text", "text": "Summarise this paragraph please."}]}
    assert mask_filtered(calm, filters) is calm
    dated = {
        "role": "user",
        "content": [{"type": "text", "text": "Now: 2026-11-29T20:09:13Z"}, {"type": "text", "text": "calm"}],
    }
    before = copy.deepcopy(dated)
    out = mask_filtered(dated, filters)
    assert dated == before  # the input is never edited
    assert out["content"][0]["text"] == "Now: \x00volatile\x00"
    assert out["content"][1] is dated["content"][1]  # what nothing touched is shared
    assert out == mask_strings(before, RULE_SPANS)


def test_an_unmasked_message_digests_as_its_exact_bytes_and_a_masked_one_does_not() -> None:
    patterns = volatile_patterns(load_rules())
    calm = {"role": "user", "content": "Summarise this paragraph please."}
    exact, masked = Masker(patterns).digests(calm)
    assert masked == exact == _sorted_digest(canonical_value(calm))
    dated = {"role": "user", "content": "Now: 2026-11-29T20:09:13Z"}
    exact, masked = Masker(patterns).digests(dated)
    assert exact == _sorted_digest(canonical_value(dated))
    assert masked == _sorted_digest(mask_strings(canonical_value(dated), RULE_SPANS)) != exact


def _sorted_digest(value: object) -> bytes:
    return xxhash.xxh3_128_digest(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


GATE_WORDS = st.sampled_from(
    ["trace", "epoch", "tracepoch", "unix time", "timestamp", "session", "token", "request", "span", "id",
     "x-anthropic-billing-header:", "cost", "budget", "total", "context", "local", "current", "system", "time",
     "TOKEN", "Epoch", '"', "\\", "\t", "\u00e9", "text", "ex", "7", "-", ":"]
)
gate_texts = st.lists(st.one_of(GATE_WORDS, st.text(ALPHABET, max_size=6)), max_size=6).map("".join)
gate_values = st.one_of(
    gate_texts,
    st.builds(
        lambda role, parts, extra: {"role": role, "content": parts, **extra},
        gate_texts,
        st.one_of(gate_texts, st.lists(st.builds(lambda t: {"type": "text", "text": t}, gate_texts), max_size=3)),
        st.dictionaries(
            gate_texts,
            st.one_of(gate_texts, st.integers(-(2**31), 2**31), st.lists(gate_texts, max_size=2)),
            max_size=2,
        ),
    ),
)


@FAST
@given(st.lists(gate_values, min_size=1, max_size=5))
def test_a_value_the_literal_gate_rejects_is_one_may_mask_rejects_and_masking_leaves(values: list[object]) -> None:
    """`LiteralGate` (one pass over a batch of values' bytes) rejects a value only when
    `may_mask` on its strings says no, so masking it changes nothing."""
    from proxy.pipeline.prefilter import LiteralGate
    from proxy.pipeline.replay import _strings_of, may_mask

    filters = tuple((p, needs(p)) for p in RULE_SPANS)
    gate = LiteralGate([n for _, n in filters])
    assert gate.is_active
    verdicts = gate.rejects([orjson.dumps(v) for v in values])
    for value, is_rejected in zip(values, verdicts, strict=True):
        if is_rejected:
            canonical = canonical_value(value)
            strings: list[str] = []
            _strings_of(canonical, strings)
            assert not may_mask(filters, strings), value
            assert mask_filtered(canonical, filters) is canonical


def test_the_literal_gate_sees_a_literal_a_leftmost_match_overlaps() -> None:
    """`tracepoch`: the pass reports `trace` and resumes after it, yet `epoch` (which starts
    inside it) still counts as present, so the epoch rule's value is not rejected."""
    from proxy.pipeline.prefilter import LiteralGate

    gate = LiteralGate([needs(p) for p in RULE_SPANS])
    values = ["tracepoch 1234567890", "trace only", "calm words only", "epoch 7", "Epoch", "caf\u00e9 epoch 7"]
    assert gate.rejects([orjson.dumps(v) for v in values]) == [False, True, True, False, True, False]
    # a filter without conditions (a lookahead alone) may admit anything: nothing is rejected
    unconditioned = LiteralGate([needs(RULE_SPANS[0]), needs(re.compile(r"(?=abc)"))])
    assert not unconditioned.is_active
    assert unconditioned.rejects([b'"calm"']) == [False]


@FAST
@given(st.lists(st.lists(gate_values, min_size=1, max_size=3), min_size=1, max_size=3), st.integers(0, 3_000))
def test_gated_masker_digests_and_budget_equal_the_ungated_ones(requests: list[list[object]], chars: int) -> None:
    """The masker with its gate and one without it (`LiteralGate` inactive) give the same
    digests and leave the request's budget in the same state, request after request (memo hits)."""
    from proxy.pipeline.prefilter import LiteralGate

    gated, plain = Masker(volatile_patterns(load_rules())), Masker(volatile_patterns(load_rules()))
    plain.gate = LiteralGate([])
    assert gated.gate.is_active and not plain.gate.is_active
    for values in requests:
        results = []
        for masker in (gated, plain):
            budget = masker.begin(chars)
            assert budget is not None
            results.append((masker.examine_all(values), budget.left, budget.is_spent))
        assert results[0] == results[1]


def test_the_literal_gate_sees_a_longer_literal_that_starts_where_a_reported_one_does() -> None:
    """`time` comes first in the pass and is reported at the start of `timestamp` (leftmost
    first): `timestamp` is still present, so its rule's value is not rejected."""
    from proxy.pipeline.prefilter import LiteralGate

    gate = LiteralGate([needs(re.compile(r"time\d")), needs(re.compile(r"timestamp"))])
    values = ["a timestamp", "a time", "a time7", "timestam"]
    assert gate.rejects([orjson.dumps(v) for v in values]) == [False, True, False, True]


def test_the_key_separators_are_not_a_colon_the_strings_hold() -> None:
    """The date rule needs a digit, a `-` and a `:`: the 1 KB bench message (digits and `-`,
    its only `:` the separators after its keys) is rejected; a `:` in any string (a key too), or after an
    escaped quote, is present."""
    from proxy.pipeline.prefilter import LiteralGate, holds_string_colon

    gate = LiteralGate([needs(p) for p in RULE_SPANS])
    calm = {"role": "user", "content": "Request r1-observe-17. " + "Summarise this paragraph please. " * 28}
    values = [calm, {"role": "user", "content": "at 2026-11-29 20:09"}, {"a:b": "7-1"}, {"k": 'x"', "n": "7-"}]
    assert gate.rejects([orjson.dumps(v) for v in values]) == [True, False, False, True]  # a key's `:` counts
    assert [holds_string_colon(orjson.dumps(v)) for v in values] == [False, True, True, False]
    assert holds_string_colon(orjson.dumps({"k": 'x":'})) is True
    assert holds_string_colon(orjson.dumps({"k\\": "v"})) is True  # a key ending in a backslash: counted
    assert holds_string_colon(b"{}") is False


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**31), 2**31), gate_texts),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(gate_texts, inner, max_size=3)),
    max_leaves=8,
)


@FAST
@given(json_values)
def test_a_colon_in_any_string_is_seen(value: object) -> None:
    """`holds_string_colon` is True whenever a string of `value` (key or value) holds a `:`."""
    from proxy.pipeline.prefilter import holds_string_colon

    def strings(v: object) -> list[str]:
        if isinstance(v, str):
            return [v]
        if isinstance(v, list):
            return [s for x in v for s in strings(x)]
        if isinstance(v, dict):
            return [*v, *(s for x in v.values() for s in strings(x))]
        return []

    if any(":" in s for s in strings(value)):
        assert holds_string_colon(orjson.dumps(value))


prefix_words = st.sampled_from(["time", "timestamp", "times", "stamp", "tam", "mest", "7", ":", "-", " ", "x"])
prefix_patterns = (r"time\d", r"timestamp", r"stamp:", r"(?i)mestx", r"ta-m")


@FAST
@given(st.lists(st.lists(prefix_words, max_size=8).map("".join), min_size=1, max_size=4))
def test_a_value_the_gate_rejects_holds_no_match_of_overlapping_literals(values: list[str]) -> None:
    """Literals that are prefixes of each other, or overlap at their ends: a value the gate
    rejects holds no match of any pattern."""
    from proxy.pipeline.prefilter import LiteralGate

    patterns = [re.compile(p) for p in prefix_patterns]
    gate = LiteralGate([needs(p) for p in patterns])
    assert gate.is_active
    for value, is_rejected in zip(values, gate.rejects([orjson.dumps(v) for v in values]), strict=True):
        if is_rejected:
            assert not any(p.search(value) for p in patterns), value
