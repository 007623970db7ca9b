"""The hot-path twins agree with the straightforward definitions, on generated bodies.

Each reference below is the plain definition (what the code computed before it was made
incremental): `prefix_blocks` + per-block `orjson.dumps` for the chain, `strip_markers` + sorted
dumps + masking for message digests, `orjson.loads(upstream bytes)` for the body sent, and a
record built from those. The fast paths must give the very same values, including when memos
are warm (a second request) and when replay rewrote messages.
"""

from __future__ import annotations

import asyncio
import copy
import re
from typing import Any

import orjson
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry

from proxy.divergence import (
    Prompt,
    find_divergence,
    kind_positions,
    lookback_positions,
    marked_positions,
    marker_positions,
    params_digest,
    predict,
    read_predictor,
    read_rules,
    request_model,
)
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.pipeline import run_request_stages
from proxy.pipeline.replay import Masker, mask_strings, span_pattern, strip_markers, view_messages
from proxy.pipeline.session import sent_markers, update_pins
from proxy.prefix import MARKER_KEYS, PrefixChain, RunBlocks, chain_blocks, scan_prompt
from proxy.providers import ANTHROPIC, route
from proxy.providers.base import Usage
from proxy.response import run_response_stages
from proxy.rules import load_rules, volatile_patterns
from proxy.services import Services
from proxy.session_identity import SessionState, upstream_hosts
from proxy.settings import Settings
from proxy.store import RecordStore
from proxy.store.codec import Sidecar
from proxy.store.memory import MemoryStore
from tests.pipeline.reference_blocks import anthropic_blocks, openai_blocks
from tests.pipeline.strategies import anthropic_bodies, openai_bodies

MESSAGES = "/v1/messages"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PATTERNS = volatile_patterns(load_rules())


# --- references --------------------------------------------------------------------------------


def _old_strip(value: Any) -> Any:
    if not isinstance(value, dict) or not (MARKER_KEYS & value.keys() or "content" in value):
        return value
    out = {k: v for k, v in value.items() if k not in MARKER_KEYS}
    content = out.get("content")
    if isinstance(content, list) and any(isinstance(p, dict) and MARKER_KEYS & p.keys() for p in content):
        out["content"] = [
            {k: v for k, v in p.items() if k not in MARKER_KEYS} if isinstance(p, dict) else p for p in content
        ]
    return out


def ref_chain(blocks: list[Any]) -> PrefixChain:
    out, ends, previous, total, last = bytearray(), [], b"", 0, None
    for block in blocks:
        value = block.value
        data = orjson.dumps(value) if isinstance(value, str) else orjson.dumps(_old_strip(value))
        boundary = b"1" if block.message_index != last else b"0"
        last = block.message_index
        head = f"{block.section}\x00{block.role or ''}\x00".encode() + boundary
        # a string is digested as the text block it is shorthand for, a block object without its
        # null-valued keys (proxy.prefix)
        if isinstance(value, str):
            keyed = orjson.dumps({"type": "text", "text": value})
        elif isinstance(value, dict):
            keyed = orjson.dumps(_old_strip({k: v for k, v in value.items() if v is not None}))
        else:
            keyed = data
        previous = xxhash.xxh3_128_digest(previous + xxhash.xxh3_128_digest(head + b"\x00" + keyed))
        out += previous
        total += len(data)
        ends.append(total)
    return PrefixChain(bytes(out), tuple(ends))


def _shorthand(value: Any) -> Any:
    """String content as the one text block it is shorthand for (proxy.prefix.canonical_value)."""
    if isinstance(value, str):
        return {"type": "text", "text": value}
    if isinstance(value, dict) and "role" in value and isinstance(value.get("content"), str):
        return {**value, "content": [{"type": "text", "text": value["content"]}]}
    return value


def ref_nulls_absent(item: Any) -> Any:
    """A message without the null-valued keys its API reads as absent (`proxy.nulls`, the
    adapters' `identity_nulls`): its own and those of its `content` blocks."""
    if not isinstance(item, dict):
        return item
    out = {k: v for k, v in item.items() if v is not None}
    if isinstance(out.get("content"), list):
        out["content"] = [
            {k: v for k, v in p.items() if v is not None} if isinstance(p, dict) else p for p in out["content"]
        ]
    return out


def ref_digests(value: Any, patterns: Any) -> tuple[bytes, bytes]:
    stripped = _shorthand(strip_markers(value))
    exact = xxhash.xxh3_128_digest(orjson.dumps(stripped, option=orjson.OPT_SORT_KEYS))
    spans = tuple(span_pattern(p) for p in patterns)
    if not spans:
        return exact, exact
    masked = orjson.dumps(mask_strings(stripped, spans), option=orjson.OPT_SORT_KEYS)
    return exact, xxhash.xxh3_128_digest(masked)


def reference_blocks(adapter: Any, body: dict[str, Any]) -> list[Any]:
    """The independent body walk (not the layout the fast paths share)."""
    return (anthropic_blocks if adapter.name == "anthropic" else openai_blocks)(adapter.api_path, body)


def ref_view(adapter: Any, body: dict[str, Any], patterns: Any) -> tuple[Any, ...]:
    head = xxhash.xxh3_128()
    array_key, system = None, set()
    tools = []
    for block in reference_blocks(adapter, body):
        if block.message_index is None:
            if block.section == "tools":  # the tool set: order does not count
                tools.append(ref_digests(block.value, patterns)[1])
            else:
                head.update(block.section.encode() + b"\x00" + ref_digests(block.value, patterns)[1])
            continue
        if array_key is None:
            array_key = block.path.split("[", 1)[0].split(".", 1)[0]
        if block.section == "system":
            system.add(block.message_index)
    items = body.get(array_key) if array_key is not None else None
    elements = items if isinstance(items, list) else ([] if items is None else [items])
    optional = {"tool": {"name"}} if adapter.api_path == "/v1/chat/completions" else {}
    nulls = adapter.identity_nulls is not None
    pairs = [
        (
            ref_digests(item, patterns)[0],
            ref_digests(
                (ref_nulls_absent if nulls else dict)(
                    {k: v for k, v in item.items() if k not in optional[item["role"]]}
                ),
                patterns,
            )[1],
        )
        if isinstance(item, dict) and item.get("role") in optional
        else (ref_digests(item, patterns)[0], ref_digests(ref_nulls_absent(item) if nulls else item, patterns)[1])
        for item in elements
    ]
    digests = tuple(p[1] for p in pairs)
    for position in sorted(system):
        head.update(b"system-message\x00" + digests[position])
    for digest in sorted(tools):
        head.update(b"tools\x00" + digest)
    head_digest = head.digest()
    boundaries, previous = [], head_digest
    for digest in digests:
        previous = xxhash.xxh3_128_digest(previous + digest)
        boundaries.append(previous)
    keys = tuple(xxhash.xxh3_128_digest(orjson.dumps(strip_markers(item))) for item in elements)
    return (array_key, head_digest, digests, tuple(p[0] for p in pairs), frozenset(system), tuple(boundaries), keys)


def _view_tuple(view: Any) -> tuple[Any, ...]:
    return (
        view.array_key,
        view.head,
        view.digests,
        view.exact,
        view.system_positions,
        view.boundaries,
        view.keys,
    )


# --- pure twins --------------------------------------------------------------------------------


def _check_scan(adapter: Any, body: dict[str, Any]) -> None:
    blocks = reference_blocks(adapter, body)
    whole = scan_prompt(adapter.layout(body))
    per_key = scan_prompt(
        [run for key in adapter.prefix_keys if key in body for run in adapter.layout({key: body[key]})]
    )
    for scan in (whole, per_key):
        assert scan.chain == ref_chain(blocks)
        assert list(scan.blocks) == blocks and len(scan.blocks) == len(blocks)
        assert [scan.blocks[i] for i in range(-len(blocks), 0)] == blocks
        assert scan.kinds == [b.kind for b in blocks]
        assert all(v is b.value for v, b in zip(scan.values, blocks, strict=True))
        rules = read_rules(adapter, body)
        assert marked_positions(scan.marked, scan.values, body, rules) == marker_positions(
            [b.value for b in blocks], body, rules
        )
        assert kind_positions(scan.kinds, rules.run_kinds) == lookback_positions(blocks, rules.run_kinds)
        assert scan.tools == sum(1 for b in blocks if b.section == "tools")
        assert all(b.section == "tools" for b in blocks[: scan.tools])
    assert list(RunBlocks(adapter.layout(body))) == blocks
    assert chain_blocks(blocks) == ref_chain(blocks)


@FAST
@given(anthropic_bodies())
def test_scan_prompt_is_chain_of_prefix_blocks_anthropic(body: dict[str, Any]) -> None:
    _check_scan(ANTHROPIC, body)


@FAST
@given(openai_bodies())
def test_scan_prompt_is_chain_of_prefix_blocks_openai(case: tuple[str, dict[str, Any]]) -> None:
    _check_scan(route(case[0])[0], case[1])


def _check_view(adapter: Any, body: dict[str, Any]) -> None:
    for patterns in (PATTERNS, (re.compile(r"\d+"),), ()):
        masker = Masker(patterns)
        expected = ref_view(adapter, body, patterns)
        cold = view_messages(adapter, body, masker)
        warm = view_messages(adapter, copy.deepcopy(body), masker, adapter.layout(body))
        assert _view_tuple(cold) == expected
        assert _view_tuple(warm) == expected
        # the bytes each element's key digests, kept for its sidecar (one serialisation each)
        items = body.get(expected[0]) if expected[0] is not None else None
        if isinstance(items, list):
            stripped = tuple(orjson.dumps(strip_markers(item)) for item in items)
            assert cold.stripped == stripped and warm.stripped == stripped
            assert tuple(xxhash.xxh3_128_digest(data) for data in stripped) == expected[6]
        else:
            assert cold.stripped == () and warm.stripped == ()


@FAST
@given(anthropic_bodies())
def test_view_matches_reference_anthropic(body: dict[str, Any]) -> None:
    _check_view(ANTHROPIC, body)


@FAST
@given(openai_bodies())
def test_view_matches_reference_openai(case: tuple[str, dict[str, Any]]) -> None:
    _check_view(route(case[0])[0], case[1])


def test_examine_memo_is_bounded_and_content_keyed() -> None:
    masker = Masker([re.compile(r"\d+")], memo_size=3)
    a = {"role": "user", "content": "turn 1"}
    first = masker.examine(a)
    for i in range(10):
        masker.examine({"role": "user", "content": f"x{i}"})
    assert len(masker._exact) == 3 and len(masker._memo) == 3
    assert masker.examine(copy.deepcopy(a)) == first  # recomputed after eviction: same values
    edited = {"role": "user", "content": "turn 1!"}
    assert masker.examine(edited)[0] != first[0]


# --- the whole request path --------------------------------------------------------------------


def _services(mode: str) -> Services:
    s = Settings(mode=mode)
    metrics = Metrics(CollectorRegistry())
    services = Services(settings=s, metrics=metrics, rules=load_rules(s.rules_dir))
    services.store = RecordStore(MemoryStore(), metrics)
    services.sessions = SessionState(b"k" * 32, (), upstream_hosts(s))
    return services


async def run_exchange(services: Services, adapter: Any, raw: bytes, headers: dict[str, str]) -> Exchange:
    """Run `raw` with `headers` through the request stages, answer it 200 with a fixed usage,
    run the response stages and flush the store: one whole exchange without a network."""
    ex = Exchange(adapter, adapter.api_path, "", CIMultiDictProxy(CIMultiDict(headers)), raw)
    await run_request_stages(ex, services)
    ex.status = 200
    ex.usage = Usage(input_none=10, cache_read=20, cache_write_5m=5, output=1, seen=True, response_id="msg_1")
    run_response_stages(ex, services)
    await services.store.flush()
    return ex


async def _send(services: Services, adapter: Any, body: dict[str, Any], raw: bytes | None = None) -> Exchange:
    """Run `body` (sent as `raw` when given) through the request and response stages."""
    headers = {"x-api-key": "key-a", "prompt_cache_key": "x"}
    return await run_exchange(services, adapter, orjson.dumps(body) if raw is None else raw, headers)


async def _check_request_path(adapter: Any, first: dict[str, Any], second: dict[str, Any]) -> None:
    for mode in ("optimise", "observe"):
        services = _services(mode)
        previous = None
        for body in (first, second, second):
            ex = await _send(services, adapter, body)
            assert ex.failed_stage is None
            sent = orjson.loads(ex.outgoing)
            blocks = adapter.prefix_blocks(sent)
            chain = ref_chain(blocks)
            assert ex.sent_chain == chain
            # the measurement, from the reference chain and blocks of the bytes sent
            got = ex.measurement
            expected = find_divergence(
                previous,
                chain,
                blocks,
                request_model(sent),
                params_digest(adapter, sent),
                history_rewritten=ex.history_rewritten is not None,
                is_volatile=None,
            )
            assert (got.divergence.block_index, got.divergence.byte_offset) == (
                expected.block_index,
                expected.byte_offset,
            )
            assert got.divergence.shared_blocks == expected.shared_blocks
            assert got.prompt_blocks == len(blocks) and got.prompt_bytes == chain.total_bytes
            model = request_model(sent)
            rules = read_rules(adapter, sent, services.rules.min_tokens(model))
            markers = marker_positions([b.value for b in blocks], sent, rules)
            if previous is not None and got.divergence.cause not in ("model_changed", "params_changed"):
                reference = Prompt(chain, blocks, [b.kind for b in blocks], markers, model, b"")
                assert (got.predicted_breakpoint, got.predicted_read_tokens) == predict(
                    previous,
                    reference,
                    got.divergence.shared_blocks,
                    rules,
                    read_predictor(adapter, sent, len(blocks), rules.min_tokens),
                )
            # the record, from the reference view of the client's body and the bytes sent
            record = await services.store.load(ex.tenant, ex.session_id)
            assert record is not None
            assert (record.chain, record.ends) == (chain.chain, chain.ends)
            assert (record.breakpoints, record.ttls) == sent_markers(blocks, sent, markers)
            pins = update_pins(ex.session_pins, blocks, adapter.tool_shape)
            segments = record.pins.get("pinned_segments")  # the pin stage's (proxy.pipeline.pins)
            assert {k: v for k, v in record.pins.items() if k != "pinned_segments"} == pins
            assert segments == (ex.pinned_segments or None)
            if segments:
                # first-seen: the client's own lines (pins run after reorder, so in reorder's
                # order: a pinned `stable` rule, the billing header, can lead a sorted block)
                client_text = orjson.dumps(first).decode()
                assert mode == "optimise"
                assert all(
                    orjson.dumps(line).decode()[1:-1] in client_text
                    for text in segments.values()
                    for line in text.split("\n")
                )
            client = orjson.loads(ex.raw)
            array_key, _, digests, exact, system, _, _ = ref_view(adapter, client, PATTERNS)
            items = sent.get(array_key) if array_key else None
            # reorder may drop leading system messages whose every line moved onto the newest
            # user message: the client's element i after its head is the sent element i - dropped
            dropped = len(digests) - len(items) if isinstance(items, list) else 0
            head = len(system)
            is_aligned = dropped == 0 or (0 < dropped <= head and system == frozenset(range(head)))
            if isinstance(client.get(array_key), list) and isinstance(items, list) and is_aligned:
                expected_sidecars = tuple(
                    Sidecar(i, digests[i], orjson.dumps(strip_markers(items[i - dropped])), exact[i])
                    for i in range(len(digests))
                    if i not in system
                )
                assert record.sidecars == expected_sidecars
                assert all(s.sent_digest() == xxhash.xxh3_128_digest(s.value) for s in record.sidecars)
            else:
                assert record.sidecars == ()
            previous = record


def _next_turn(body: dict[str, Any], key: str, reply: Any, ask: Any) -> dict[str, Any]:
    """The same conversation one turn later, the first message's keys reordered (replay)."""
    later = copy.deepcopy(body)
    items = later.get(key)
    if not isinstance(items, list):
        return later
    if items and isinstance(items[0], dict):
        items[0] = dict(reversed(list(items[0].items())))
    items += [reply, ask]
    return later


@FAST
@given(anthropic_bodies(), st.booleans())
def test_request_path_matches_reference_anthropic(body: dict[str, Any], marked: bool) -> None:
    ask: dict[str, Any] = {
        "role": "user",
        "content": [{"type": "text", "text": "Current time: 2026-11-30T01:02:03Z go"}],
    }
    if marked:
        ask["content"][0]["cache_control"] = {"type": "ephemeral"}
    second = _next_turn(body, "messages", {"role": "assistant", "content": "ok"}, ask)
    asyncio.run(_check_request_path(ANTHROPIC, body, second))


@FAST
@given(openai_bodies())
def test_request_path_matches_reference_openai(case: tuple[str, dict[str, Any]]) -> None:
    path, body = case
    key = "input" if path == "/v1/responses" else "messages"
    second = _next_turn(body, key, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"})
    asyncio.run(_check_request_path(route(path)[0], body, second))


def test_a_first_request_stores_the_bytes_its_view_serialised() -> None:
    """A session's first record holds, per message, the very bytes the message view produced
    (`MessageView.stripped`): each message is serialised once per request, not again when its
    sidecar is built; a message the planner marked is stored without its marker."""
    services = _services("optimise")
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 16,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "read a.py " * 300}]},
            {"role": "assistant", "content": [{"type": "text", "text": "done " * 300}]},
            {"role": "user", "content": "and b.py?"},
        ],
    }
    ex = asyncio.run(_send(services, ANTHROPIC, body))
    view = ex.message_view
    assert view is not None and ex.failed_stage is None
    assert view.stripped == tuple(orjson.dumps(m) for m in body["messages"])
    record = asyncio.run(services.store.load(ex.tenant, ex.session_id))
    assert record is not None
    sent = orjson.loads(ex.outgoing)["messages"]
    assert [s.value for s in record.sidecars] == [orjson.dumps(strip_markers(m)) for m in sent]
    # the planner put its markers on the last two messages (copies); the first is the client's object
    assert [i for i, m in enumerate(sent) if m != body["messages"][i]] == [1, 2]
    assert record.sidecars[0].value is view.stripped[0]
