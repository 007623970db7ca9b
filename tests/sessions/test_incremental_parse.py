"""The incremental parse and budget counts (`proxy.pipeline.rawprefix.parse_tail`,
`chunk_counts`): a body that continues a recent one of its tenant byte for byte is parsed from
its new bytes only, its budget counted from its new chunks only, and the request is the same as
with a full parse: the same value and key order, the same bytes upstream, the same session
record, measurement and metrics."""

from __future__ import annotations

import copy
from array import array
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from proxy.exchange import Exchange
from proxy.pipeline.parse import reused_parse
from proxy.pipeline.rawprefix import CHUNK, MIN_BYTES, RawPrefixIndex, chunk_counts, match_raw
from proxy.pipeline.replay import RawBody, view_messages
from proxy.pipeline.session import masker_for
from proxy.providers import ANTHROPIC
from proxy.services import Services
from tests.sessions.test_fast_paths import _send, _services
from tests.sessions.test_rawprefix import _body, _masker, _turn
from tests.sessions.test_rawprefix import _edited as edited_body

SCOPE = "tenant\x00/v1/messages"
SLOW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EDITS = st.sampled_from(
    [
        "append",
        "same",
        "edit_middle",
        "marker",
        "reformat",
        "truncate",
        "append",
        "trailing_key",
        "trailing_duplicate",
        "escaped_duplicate",
        "duplicate",
        "number",
        "number_longer",
        "trailing_comma",
        "cut",
    ]
)


def _edited(raw: bytes, edit: str, at: int) -> bytes:
    """The next request's raw body after `edit` of the one before (`raw`): the edits of
    `test_rawprefix`, and bodies whose bytes after the array (or its last element) change."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = _body(30)
    if not isinstance(body.get("messages"), list) or not all(isinstance(m, dict) for m in body["messages"]):
        body = _body(30)
    if edit in ("append", "edit_middle", "marker", "truncate", "reformat", "duplicate", "stamp"):
        return edited_body(body, edit, at)
    dumped = orjson.dumps(body)
    if edit == "trailing_key":  # a key after the array
        return dumped[:-1] + b',"stream":false}'
    if edit == "trailing_duplicate":  # a later duplicate of a key before the array
        return dumped[:-1] + b',"model":"claude-opus-4-6"}'
    if edit == "escaped_duplicate":  # `messages` again, spelt with an escape
        return dumped[:-1] + b',"m\\u0065ssages":[{"role":"user","content":"other"}]}'
    if edit == "number":  # a number as the last element (not a message: the upstream says so)
        return dumped[:-2] + b",7]}"
    if edit == "number_longer":  # the same bytes up to the number's end, a longer number
        return raw[:-2] + b".5]}" if raw.endswith(b",7]}") else dumped[:-2] + b",7.5]}"
    if edit == "trailing_comma":
        return dumped[:-2] + b",]}"
    if edit == "cut":
        return dumped[: len(dumped) - 1 - at % 50]
    return dumped


def _full(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _checked(got: Any, expected: Any) -> Any:
    """The body a request goes on with: `got` (a reused parse, `None` when none was made) must
    be `expected` (the full parse, `None` for no JSON) in value and key order at every depth;
    `None` when the bytes are not a JSON object (then nothing was reused)."""
    if not isinstance(expected, dict):
        assert got is None
        return None
    if got is not None:
        assert got == expected
        assert orjson.dumps(got) == orjson.dumps(expected)  # key order, at every depth
    return got if got is not None else expected


@SLOW
@given(st.lists(st.tuples(EDITS, st.integers(0, 10_000)), min_size=1, max_size=7), st.integers(30, 40))
def test_reused_parse_is_the_full_parse(edits: list[tuple[str, int]], turns: int) -> None:
    masker = _masker()
    raw = orjson.dumps(_body(turns))
    for edit, at in [("same", 0), *edits]:
        raw = _edited(raw, edit, at) if edit != "same" else raw
        expected = _full(raw)
        match = match_raw(masker.raw_index, SCOPE, raw)
        if match is None:  # under MIN_BYTES: not indexed, parsed whole
            assert len(raw) < MIN_BYTES
            continue
        kept = masker.raw_index.parsed(match.state) if match.state is not None else None
        before = copy.deepcopy(list(kept.elements)) if kept is not None else None
        got = reused_parse(raw, match)
        if kept is not None:
            assert list(kept.elements) == before  # the earlier elements are not edited
        body = _checked(got, expected)
        if body is not None and isinstance(body.get("messages"), list):
            view_messages(ANTHROPIC, body, masker, raw=RawBody(raw, SCOPE, match))


def test_an_appended_turn_is_parsed_from_its_new_bytes() -> None:
    """Turn 2 = turn 1 + one round trip: the earlier messages are turn 1's objects."""
    masker = _masker()
    first = orjson.dumps(_body(30))
    body = orjson.loads(first)
    view_messages(ANTHROPIC, body, masker, raw=RawBody(first, SCOPE, match_raw(masker.raw_index, SCOPE, first)))
    second_body = {**body, "messages": [*body["messages"], *_turn(30)]}
    second = orjson.dumps(second_body)
    match = match_raw(masker.raw_index, SCOPE, second)
    assert match is not None
    got = reused_parse(second, match)
    assert got == second_body
    n = len(body["messages"])
    assert all(a is b for a, b in zip(got["messages"][:n], body["messages"], strict=True))
    assert got["messages"][n] is not second_body["messages"][n]  # the new ones are parsed


@SLOW
@given(st.lists(st.tuples(EDITS, st.integers(0, 10_000)), min_size=1, max_size=6), st.integers(30, 40))
def test_chunk_counts_are_the_full_counts(edits: list[tuple[str, int]], turns: int) -> None:
    index = RawPrefixIndex()
    masker = _masker()
    masker.raw_index = index
    raw = orjson.dumps(_body(turns))
    for edit, at in [("same", 0), *edits]:
        raw = _edited(raw, edit, at) if edit != "same" else raw
        match = match_raw(index, SCOPE, raw)
        if match is None:
            continue
        nodes, values, n, v = chunk_counts(raw, match.state, match.shared)
        brackets = raw.count(b"{") + raw.count(b"[")
        assert (n, v) == (brackets, brackets + raw.count(b","))
        assert len(nodes) == len(values) == len(raw) // CHUNK
        assert nodes[-1] == raw[: len(nodes) * CHUNK].count(b"{") + raw[: len(nodes) * CHUNK].count(b"[")
        match.nodes, match.values = nodes, values
        body = _full(raw)
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            view_messages(ANTHROPIC, body, masker, raw=RawBody(raw, SCOPE, match))


def _without_reuse(services: Services) -> Services:
    """`services` whose raw-prefix index keeps nothing: every request takes the full path."""
    assert services.sessions is not None
    masker_for(services.sessions, services).raw_index = RawPrefixIndex(0, 0, 0)
    return services


def _paired(mode: str) -> tuple[Services, Services]:
    """`(incremental, full)`: services of `mode` reusing recent bodies and reusing nothing, on
    one fixed clock (arrivals and pacing are recorded)."""
    incremental, full = _services(mode), _without_reuse(_services(mode))
    for services in (incremental, full):
        assert services.sessions is not None
        services.sessions.clock = lambda: 1_800_000_000.0
    return incremental, full


def _counters(services: Services) -> list[str]:
    """The metrics exposition without timings (which differ between any two runs)."""
    text = generate_latest(services.metrics.registry).decode()
    return [line for line in text.splitlines() if "_seconds" not in line and "duration" not in line]


def _same(a: Exchange, b: Exchange) -> None:
    assert a.outgoing == b.outgoing
    assert a.failed_stage == b.failed_stage
    assert a.body == b.body and (a.body is None or list(a.body) == list(b.body or {}))
    assert a.measurement == b.measurement
    assert a.history_rewritten == b.history_rewritten and a.replayed == b.replayed


CONVERSATION = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "append",
                "append",
                "append",
                "edit_middle",
                "marker",
                "truncate",
                "trailing_key",
                "trailing_duplicate",
                "escaped_duplicate",
                "reformat",
                "same",
            ]
        ),
        st.integers(0, 10_000),
    ),
    min_size=2,
    max_size=6,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONVERSATION, st.integers(30, 36), st.sampled_from(["observe", "optimise"]))
async def test_incremental_path_sends_and_records_what_the_full_path_does(
    edits: list[tuple[str, int]], turns: int, mode: str
) -> None:
    incremental, full = _paired(mode)
    raw = orjson.dumps(_body(turns))
    for edit, at in [("same", 0), *edits]:
        raw = _edited(raw, edit, at) if edit != "same" else raw
        body = orjson.loads(raw)
        a = await _send_raw(incremental, raw)
        b = await _send_raw(full, raw)
        _same(a, b)
        assert a.session_id == b.session_id and a.tenant == b.tenant
        assert incremental.store is not None and full.store is not None
        assert a.tenant is not None and a.session_id is not None
        assert await incremental.store.load(a.tenant, a.session_id) == await full.store.load(b.tenant, b.session_id)
        assert body == orjson.loads(raw)
    assert _counters(incremental) == _counters(full)


async def _send_raw(services: Services, raw: bytes) -> Exchange:
    return await _send(services, ANTHROPIC, orjson.loads(raw), raw=raw)


async def test_an_appended_turn_through_the_stages_reuses_the_earlier_objects() -> None:
    """In both modes the second request's earlier messages are the first request's objects,
    their layout runs too, and its pipeline budget counts come from the earlier body's chunks."""
    for mode in ("observe", "optimise"):
        services = _services(mode)
        first = orjson.dumps(_body(30))
        second = orjson.dumps({**orjson.loads(first), "messages": [*orjson.loads(first)["messages"], *_turn(30)]})
        a = await _send_raw(services, first)
        b = await _send_raw(services, second)
        assert a.body is not None and b.body is not None and b.raw_match is not None
        assert b.raw_match.state is not None and b.raw_match.shared >= len(first) - 2
        assert (mode, b.body["messages"][0] is a.body["messages"][0]) == (mode, True)
        # laid out from the first new message on: the earlier messages' runs are turn 1's
        assert a.client_runs is not None and b.client_runs is not None
        first_runs, second_runs = a.client_runs["messages"][1], b.client_runs["messages"][1]
        shared = sum(1 for x, y in zip(first_runs, second_runs, strict=False) if x is y)
        assert (mode, shared) == (mode, len(first_runs))
        if mode == "observe":  # optimise rewrites it (copy-on-write)
            assert b.body == orjson.loads(second)


def test_an_escaped_duplicate_array_key_is_not_taken_for_the_array() -> None:
    """`"m\\u0065ssages"` after the array replaces it: neither the view nor the parse reuses
    the earlier elements for it (the view was wrong before: it reused their digests)."""
    masker, plain = _masker(), _masker()
    first = orjson.dumps(_body(30))
    view_messages(ANTHROPIC, orjson.loads(first), masker, raw=RawBody(first, SCOPE))
    second = first[:-1] + b',"m\\u0065ssages":[{"role":"user","content":"other"}]}'
    assert orjson.loads(second)["messages"] == [{"role": "user", "content": "other"}]
    match = match_raw(masker.raw_index, SCOPE, second)
    assert match is not None and match.state is not None and match.kept is not None
    assert reused_parse(second, match) is None
    got = view_messages(ANTHROPIC, orjson.loads(second), masker, raw=RawBody(second, SCOPE, match))
    expected = view_messages(ANTHROPIC, orjson.loads(second), plain)
    assert (got.digests, got.exact, got.boundaries) == (expected.digests, expected.exact, expected.boundaries)


def _grown_then_edited() -> tuple[bytes, bytes, bytes]:
    """Three raw bodies of one session: 30 round trips, one more appended, then message 3 of
    that one replaced by a short text."""
    first = orjson.dumps(_body(30))
    second_body = {**orjson.loads(first), "messages": [*orjson.loads(first)["messages"], *_turn(30)]}
    edited = [*second_body["messages"]]
    edited[3] = {"role": edited[3]["role"], "content": "changed"}
    return first, orjson.dumps(second_body), orjson.dumps({**second_body, "messages": edited})


def _budget_services(mode: str, max_blocks: int) -> Services:
    from prometheus_client import CollectorRegistry

    from proxy.metrics import Metrics
    from proxy.rules import load_rules
    from proxy.session_identity import SessionState, upstream_hosts
    from proxy.settings import Settings
    from proxy.store import RecordStore
    from proxy.store.memory import MemoryStore

    s = Settings(mode=mode, pipeline_budget_blocks=max_blocks)
    services = Services(settings=s, metrics=Metrics(CollectorRegistry()), rules=load_rules(s.rules_dir))
    services.store = RecordStore(MemoryStore(), services.metrics)
    services.sessions = SessionState(b"k" * 32, (), upstream_hosts(s))
    return services


async def test_blocks_are_counted_from_the_state_when_the_earlier_body_is_no_longer_kept() -> None:
    """With the parsed bodies no longer kept (many sessions of a tenant interleaved: the
    `Kept` entries are gone, the states are not), the budget check still takes the counts of
    the leading elements from the matched state (`rawprefix.known_counts`: 61 of them for an
    appended turn, 3 before an edit of message 3, none when the new bytes name the array key
    again) and the counts are the full ones (156, 154)."""
    from proxy.pipeline.budget import block_counts
    from proxy.pipeline.rawprefix import known_counts

    first, second, third = _grown_then_edited()
    for mode in ("observe", "optimise"):
        services = _budget_services(mode, 10_000)
        assert services.sessions is not None
        masker_for(services.sessions, services).raw_index.max_parsed_bytes = 0  # nothing kept parsed
        a = await _send_raw(services, first)
        b = await _send_raw(services, second)
        c = await _send_raw(services, third)
        got = []
        for ex, raw in ((b, second), (c, third)):
            match = ex.raw_match
            assert match is not None and match.kept is None and match.state is not None
            key, known = known_counts(raw, match.state, match.shared)
            assert match.counts is not None
            assert list(match.counts[1]) == list(block_counts(orjson.loads(raw)["messages"]))
            assert list(known) == list(match.state.counts[: len(known)])
            got.append((key, len(known), match.counts[1][-1]))
        assert (mode, got) == (mode, [("messages", 61, 156), ("messages", 3, 154)])
        assert a.raw_match is not None and a.raw_match.state is None
        assert b.raw_match is not None and b.raw_match.state is not None
        duplicate = second[:-1] + b',"messages":[]}'
        assert known_counts(duplicate, b.raw_match.state, b.raw_match.shared) == ("", array("q"))
        assert known_counts(second, None, 0) == ("", array("q"))


async def test_blocks_of_an_appended_turn_are_counted_from_the_earlier_counts() -> None:
    """The pipeline budget's block count (`budget.count_blocks`) of a body that continues a
    recent one: the reused elements' counts are that body's, only the new ones are walked, and
    the total is the full count (153 blocks for 61 messages, 158 after one more round trip, 156
    when message 3 of those loses its two blocks), over the budget exactly when the full count is."""
    from proxy.pipeline.budget import block_counts, count_blocks

    first, second, third = _grown_then_edited()
    for mode in ("observe", "optimise"):
        services = _budget_services(mode, 10_000)
        a = await _send_raw(services, first)
        b = await _send_raw(services, second)
        c = await _send_raw(services, third)
        assert [count_blocks(orjson.loads(raw)) for raw in (first, second, third)] == [153, 158, 156]
        got = []
        for ex in (a, b, c):
            assert ex.raw_match is not None and ex.raw_match.counts is not None and ex.body is not None
            items, counts = ex.raw_match.counts
            assert items == orjson.loads(ex.raw)["messages"]
            assert list(counts) == list(block_counts(orjson.loads(ex.raw)["messages"]))
            got.append((ex.raw_match.reused, counts[-1]))
        assert got == [(0, 151), (61, 156), (3, 154)]
        assert a.over_budget is None and b.over_budget is None and c.over_budget is None
        tight = _budget_services(mode, 157)
        over = [(await _send_raw(tight, raw)).over_budget for raw in (first, second, third)]
        assert over == [None, "body of 158 blocks is over pipeline_budget_blocks (157)", None]
