"""The incremental parse around an edit (`proxy.pipeline.rawprefix.parse_around`): a body whose
message array ends with a recent body's last elements byte for byte, after an edit before them
(a new session re-sending a recent conversation under another first message, system note or
session id), is parsed from the bytes before and after those elements only; they are the
earlier objects, their digests the earlier ones, and the request is the same as with a full
parse: the same value and key order, the same view, bytes upstream, record and metrics."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.parse import reused_parse
from proxy.pipeline.rawprefix import MIN_BYTES, match_raw
from proxy.pipeline.replay import CLEAN_COLUMN, RawBody, view_messages
from proxy.prefix import PromptScan, scan_prompt
from proxy.providers import ANTHROPIC
from tests.sessions.test_incremental_parse import _checked, _counters, _full, _paired, _same, _send_raw
from tests.sessions.test_rawprefix import _body, _masker, _turn, _view_fields

SCOPE = "tenant\x00/v1/messages"
SLOW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _with_session(body: dict[str, Any], session: str) -> dict[str, Any]:
    """`body` with a session id after its message array (as Claude Code's `metadata.user_id`)."""
    out = {k: v for k, v in body.items() if k != "metadata"}
    out["metadata"] = {"user_id": session}
    return out


EDITS = st.sampled_from(
    [
        "first",
        "system",
        "session",
        "middle",
        "append",
        "first",
        "duplicate_after",
        "escaped_duplicate_after",
        "number_end",
        "reformat",
        "cut",
        "same",
    ]
)


def _edited(raw: bytes, edit: str, at: int) -> bytes:
    """The next raw body after `edit` of `raw` (a body of `_body` shape, or anything)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or len(body["messages"]) < 10:
        body = _with_session(_body(30), "s-0")  # a replaced array (a duplicate key): start again
    messages = list(body["messages"])
    if edit == "first":
        messages[0] = {"role": "user", "content": f"Start again ({at})."}
    elif edit == "middle":
        i = at % len(messages)
        messages[i] = {
            "role": messages[i].get("role", "user") if isinstance(messages[i], dict) else "user",
            "content": f"changed {at}",
        }
    elif edit == "append":
        messages.extend(_turn(len(messages)))
    new = {**body, "messages": messages}
    if edit == "system":
        new["system"] = [{"type": "text", "text": f"You are agent {at}. " * 40}]
    if edit == "session":
        new = _with_session(new, f"s-{at}")
    dumped = orjson.dumps(new)
    if edit == "duplicate_after":
        return dumped[:-1] + b',"messages":[{"role":"user","content":"other"}]}'
    if edit == "escaped_duplicate_after":
        return dumped[:-1] + b',"m\\u0065ssages":[{"role":"user","content":"other"}]}'
    if edit == "number_end":
        at_end = dumped.rfind(b"]")
        return dumped[:at_end] + b",7" + dumped[at_end:] if at_end > 0 else dumped
    if edit == "reformat":
        return orjson.dumps(new, option=orjson.OPT_INDENT_2)
    if edit == "cut":
        return dumped[: len(dumped) - 1 - at % 50]
    return dumped


def test_a_new_session_resending_a_conversation_reuses_all_but_its_first_message() -> None:
    """Session b re-sends session a's 61 messages under another first message and session id:
    messages 1..60 are a's objects, only message 0 and the bytes after the array are parsed,
    and the view is the one a full parse gives."""
    masker, plain = _masker(), _masker()
    first_body = _with_session(_body(30), "session-a")
    first = orjson.dumps(first_body)
    parsed_first = orjson.loads(first)
    match_a = match_raw(masker.raw_index, SCOPE, first)
    view_messages(ANTHROPIC, parsed_first, masker, raw=RawBody(first, SCOPE, match_a))
    messages = [{"role": "user", "content": "Start again."}, *first_body["messages"][1:]]
    second = orjson.dumps({**_with_session({**first_body, "messages": messages}, "session-b")})
    assert second[:100] == first[:100] and len(second) == len(first) + 6
    match = match_raw(masker.raw_index, SCOPE, second)
    assert match is not None and match.state is None  # no shared first chunk: the prefix path has nothing
    got = reused_parse(second, match)
    assert got is not None and orjson.dumps(got) == second
    assert match.suffix is not None and (match.suffix.first, match.suffix.delta) == (1, 6)
    assert all(a is b for a, b in zip(got["messages"][1:], parsed_first["messages"][1:], strict=True))
    assert got["messages"][0] is not parsed_first["messages"][0]
    view = view_messages(ANTHROPIC, got, masker, raw=RawBody(second, SCOPE, match))
    assert _view_fields(view) == _view_fields(view_messages(ANTHROPIC, orjson.loads(second), plain))
    # what the view keeps for the record builder: each reused message's own bytes, from the body
    assert view.stripped[1:] == tuple(orjson.dumps(m) for m in messages[1:])


def test_reused_messages_holding_markers_are_left_for_the_record_builder_to_strip() -> None:
    """The reused messages' bytes go to the record builder as they are, but those holding a
    cache marker (`None`: their sidecar's bytes are dumped without it), as a full view says;
    which ones hold a marker is known from the kept body (`CLEAN_COLUMN`), over two new
    sessions in a row (the second reuses what the first one's view kept)."""
    masker = _masker()
    base = _with_session(_body(30), "session-a")
    marked = {5, 60}
    for i in marked:
        content = base["messages"][i]["content"]
        content[-1] = {**content[-1], "cache_control": {"type": "ephemeral"}}
    raw = orjson.dumps(base)
    parsed = orjson.loads(raw)
    view_messages(ANTHROPIC, parsed, masker, raw=RawBody(raw, SCOPE, match_raw(masker.raw_index, SCOPE, raw)))
    for n, session in enumerate(("session-b", "session-c")):
        messages = [{"role": "user", "content": f"Start again ({n})."}, *base["messages"][1:]]
        raw = orjson.dumps(_with_session({**base, "messages": messages}, session))
        match = match_raw(masker.raw_index, SCOPE, raw)
        assert match is not None
        got = reused_parse(raw, match)
        assert got is not None and match.suffix is not None and match.suffix.first == 1
        view = view_messages(ANTHROPIC, got, masker, raw=RawBody(raw, SCOPE, match))
        assert view.stripped == (
            orjson.dumps(messages[0]),
            *(None if i in marked else orjson.dumps(m) for i, m in enumerate(messages[1:], 1)),
        )
        assert match.fresh is not None
        assert match.fresh.state.columns[CLEAN_COLUMN] == bytes(0 if i in marked else 1 for i in range(61))


def test_a_body_of_another_scope_reuses_nothing() -> None:
    """The same bytes from another tenant (scope) find no kept body: parsed whole."""
    masker = _masker()
    first = orjson.dumps(_with_session(_body(30), "session-a"))
    match_a = match_raw(masker.raw_index, SCOPE, first)
    view_messages(ANTHROPIC, orjson.loads(first), masker, raw=RawBody(first, SCOPE, match_a))
    second = _edited(first, "first", 1)
    match = match_raw(masker.raw_index, "other\x00/v1/messages", second)
    assert match is not None
    assert reused_parse(second, match) is None and match.suffix is None and match.around is None


@SLOW
@given(st.lists(st.tuples(EDITS, st.integers(0, 10_000)), min_size=1, max_size=7), st.integers(30, 40))
def test_parse_and_view_around_an_edit_are_the_full_ones(edits: list[tuple[str, int]], turns: int) -> None:
    masker = _masker()
    raw = orjson.dumps(_with_session(_body(turns), "s-0"))
    for edit, at in [("same", 0), *edits]:
        raw = _edited(raw, edit, at) if edit != "same" else raw
        expected = _full(raw)
        match = match_raw(masker.raw_index, SCOPE, raw)
        if match is None:  # under MIN_BYTES (a cut body of one message): not indexed
            assert len(raw) < MIN_BYTES
            continue
        kept = [copy.deepcopy(list(k.elements)) for k in masker.raw_index._parsed.values()]
        got = reused_parse(raw, match)
        assert [list(k.elements) for k in masker.raw_index._parsed.values()] == kept  # never edited
        body = _checked(got, expected)
        if body is not None and isinstance(body.get("messages"), list):
            view = view_messages(ANTHROPIC, body, masker, raw=RawBody(raw, SCOPE, match))
            assert _view_fields(view) == _view_fields(view_messages(ANTHROPIC, orjson.loads(raw), _masker()))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(EDITS, st.integers(0, 10_000)), min_size=2, max_size=5),
    st.integers(30, 34),
    st.sampled_from(["observe", "optimise"]),
)
async def test_requests_around_an_edit_send_and_record_what_the_full_path_does(
    edits: list[tuple[str, int]], turns: int, mode: str
) -> None:
    incremental, full = _paired(mode)
    raw = orjson.dumps(_with_session(_body(turns), "s-0"))
    for edit, at in [("same", 0), *edits]:
        raw = _edited(raw, edit, at) if edit != "same" else raw
        if not isinstance(_full(raw), dict):
            continue
        a = await _send_raw(incremental, raw)
        b = await _send_raw(full, raw)
        _same(a, b)
        assert a.session_id == b.session_id and a.tenant == b.tenant
        assert incremental.store is not None and full.store is not None
        if a.tenant is not None and a.session_id is not None:
            assert await incremental.store.load(a.tenant, a.session_id) == await full.store.load(b.tenant, b.session_id)
    assert _counters(incremental) == _counters(full)


def _scan_fields(scan: PromptScan) -> tuple[Any, ...]:
    return (scan.chain, scan.values, scan.kinds, scan.marked, scan.tools, scan.digests)


def test_a_scan_around_a_kept_body_chains_its_block_digests() -> None:
    """Body b holds body a's message objects after another first message: scanning b with a's
    scan (`around`) gives the full scan, the blocks of a's objects taking a's block digests (a's
    digests replaced by others change exactly those blocks' digests), the others not."""
    masker = _masker()
    first = orjson.dumps(_with_session(_body(30), "session-a"))
    a = orjson.loads(first)
    view_messages(ANTHROPIC, a, masker, raw=RawBody(first, SCOPE, match_raw(masker.raw_index, SCOPE, first)))
    second = _edited(first, "first", 7)
    match = match_raw(masker.raw_index, SCOPE, second)
    assert match is not None
    b = reused_parse(second, match)
    assert b is not None and match.suffix is not None and match.suffix.first == 1
    around = scan_prompt(ANTHROPIC.layout(a))
    assert len(around.digests) == 16 * len(around.values) == 16 * 93  # tools 1, system 1, message 0, 30 x 3 turn blocks
    runs = ANTHROPIC.layout(b)
    got = scan_prompt(runs, around=around)
    assert _scan_fields(got) == _scan_fields(scan_prompt(ANTHROPIC.layout(orjson.loads(second))))
    # messages 1..60 (blocks 3..92) are a's objects: their digests are a's; the tools, the
    # system prompt (parsed anew with the bytes before the array) and message 0 are digested
    other = replace(around, digests=bytes(len(around.digests)))
    altered = scan_prompt(runs, around=other)
    blocks = range(len(got.values))
    differing = [i for i in blocks if altered.digests[16 * i : 16 * i + 16] != got.digests[16 * i : 16 * i + 16]]
    assert differing == list(range(3, 93))


def test_a_scan_around_copies_the_markers_and_kinds_of_the_blocks_it_takes() -> None:
    """Marked blocks among the kept body's objects keep their marks at their new positions
    (b's first message has one block more than a's), as the full scan has them."""
    a = _body(6)
    marked_at = []
    for position in (3, 8):
        message = a["messages"][position]
        if isinstance(message["content"], list):
            message["content"][-1] = {**message["content"][-1], "cache_control": {"type": "ephemeral"}}
            marked_at.append(position)
    assert marked_at
    b = {
        **a,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a new start"}, {"type": "text", "text": "two"}]},
            *a["messages"][1:],
        ],
    }
    around = scan_prompt(ANTHROPIC.layout(a))
    assert around.marked
    got = scan_prompt(ANTHROPIC.layout(b), around=around)
    full = scan_prompt(ANTHROPIC.layout(orjson.loads(orjson.dumps(b))))
    assert _scan_fields(got) == _scan_fields(full)
    assert got.marked == tuple(m + 1 for m in around.marked if m >= 3)  # a's first message held no mark
    # the blocks were taken from `around` (its digests zeroed: the chain changes)
    zeroed = scan_prompt(ANTHROPIC.layout(b), around=replace(around, digests=bytes(len(around.digests))))
    assert zeroed.chain != full.chain and zeroed.marked == full.marked and zeroed.kinds == full.kinds


ARRANGEMENTS = st.lists(
    st.tuples(st.integers(0, 12), st.sampled_from(["same", "same", "rerole", "copy"])), min_size=1, max_size=16
)


@given(arrangement=ARRANGEMENTS, marked=st.sets(st.integers(0, 12), max_size=3))
@settings(max_examples=60, deadline=None)
def test_a_scan_around_any_arrangement_of_a_kept_bodys_objects_is_the_full_scan(
    arrangement: list[tuple[int, str]], marked: set[int]
) -> None:
    """b's messages are a's message objects in any order and repeated, a's contents under the
    other role, or equal copies: the scan with a's scan (`around`: a's blocks taken in stretches,
    broken where b leaves a's order) is the full scan of b's bytes, and neither a's scan nor b
    is changed."""
    a = _body(6)
    for position in marked:
        content = a["messages"][position]["content"]
        if isinstance(content, list):
            content[-1] = {**content[-1], "cache_control": {"type": "ephemeral"}}
    around = scan_prompt(ANTHROPIC.layout(a))
    kept = _scan_fields(around)
    messages: list[Any] = []
    for position, how in arrangement:
        message = a["messages"][position]
        if how == "same":
            messages.append(message)
        elif how == "rerole":  # the very content object in a message of the other role
            other = "assistant" if message["role"] == "user" else "user"
            messages.append({"role": other, "content": message["content"]})
        else:
            messages.append(copy.deepcopy(message))
    b = {**a, "messages": messages}
    sent = copy.deepcopy(b)
    got = scan_prompt(ANTHROPIC.layout(b), around=around)
    assert _scan_fields(got) == _scan_fields(scan_prompt(ANTHROPIC.layout(orjson.loads(orjson.dumps(b)))))
    assert b == sent and _scan_fields(around) == kept


@given(
    changed=st.sets(st.integers(0, 12), max_size=4),
    marked=st.sets(st.integers(0, 12), max_size=3),
    is_system_new=st.booleans(),
    length=st.integers(1, 17),
)
@settings(max_examples=60, deadline=None)
def test_a_scan_around_a_kept_bodys_own_runs_is_the_full_scan(
    changed: set[int], marked: set[int], is_system_new: bool, length: int
) -> None:
    """b keeps a's unchanged values and so a's very run objects (`relayout`, as the session
    stage lays b out from the kept body's runs): the scan with a's scan takes stretches of
    them at once, and is the full scan of b's bytes; a's scan is not changed."""
    a = _body(6)
    for position in marked:
        content = a["messages"][position]["content"]
        if isinstance(content, list):
            content[-1] = {**content[-1], "cache_control": {"type": "ephemeral"}}
    runs_a = ANTHROPIC.layout(a)
    around = scan_prompt(runs_a)
    kept = _scan_fields(around)
    messages = [
        {"role": "user", "content": f"changed {i}"} if i in changed else a["messages"][i % 13] for i in range(length)
    ]
    b = {**a, "messages": messages}
    if is_system_new:
        b["system"] = [{"type": "text", "text": "Another agent."}]
    runs: list[Any] = []
    for key in ANTHROPIC.prefix_keys:
        of_key = [r for r in runs_a if r.key[0] == key]
        if b[key] is a[key]:
            runs.extend(of_key)
        elif key == "messages":
            redone = ANTHROPIC.relayout(key, b[key], a[key], of_key)
            runs.extend(redone[0] if redone is not None else ANTHROPIC.layout({key: b[key]}))
        else:
            runs.extend(ANTHROPIC.layout({key: b[key]}))
    assert any(r in runs_a for r in runs if r.section == "messages") or not set(range(min(length, 13))) - changed
    got = scan_prompt(runs, around=around)
    assert _scan_fields(got) == _scan_fields(scan_prompt(ANTHROPIC.layout(orjson.loads(orjson.dumps(b)))))
    assert got.blocks.starts == scan_prompt(ANTHROPIC.layout(b)).blocks.starts
    assert _scan_fields(around) == kept


@pytest.mark.parametrize("mode", ["observe", "optimise"])
async def test_a_new_session_resending_a_conversation_records_the_earlier_sidecars_and_runs(mode: str) -> None:
    """Session b re-sends session a's conversation under another first message: its record's
    sidecars of the messages sent as the client's objects are a's record's very objects
    (`Kept.sidecars`; in `optimise` the breakpoints stage sends marked copies of the newest),
    the record equals what a process that reuses nothing records, and its messages are laid
    out from a's runs (no body shares its first bytes: the kept body's runs)."""
    incremental, full = _paired(mode)
    first = orjson.dumps(_with_session(_body(30), "session-a"))
    messages = [{"role": "user", "content": "Start again."}, *orjson.loads(first)["messages"][1:]]
    second = orjson.dumps(_with_session({**orjson.loads(first), "messages": messages}, "session-b"))
    records = []
    for services in (incremental, full):
        a = await _send_raw(services, first)
        b = await _send_raw(services, second)
        assert services.store is not None and a.tenant is not None and b.tenant is not None
        assert a.session_id is not None and b.session_id is not None and a.session_id != b.session_id
        records.append(
            (await services.store.load(a.tenant, a.session_id), await services.store.load(b.tenant, b.session_id), a, b)
        )
    (record_a, record_b, a, b), (_, full_b, _, _) = records
    assert record_a is not None and record_b is not None and record_b == full_b
    shared = [x is y for x, y in zip(record_b.sidecars, record_a.sidecars, strict=True)]
    # not a's: the first message, and in `optimise` the two newest (a marker on each, as sent)
    assert [i for i, x in enumerate(shared) if not x] == ([0] if mode == "observe" else [0, 59, 60])
    assert a.client_runs is not None and b.client_runs is not None
    runs_a, runs_b = a.client_runs["messages"][1], b.client_runs["messages"][1]
    assert runs_b[0] is not runs_a[0] and all(x is y for x, y in zip(runs_b[1:], runs_a[1:], strict=True))
