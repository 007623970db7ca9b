"""Property tests over generated Anthropic and OpenAI requests: each core and the chain.

For every generated body: the caller's object is untouched (byte for byte), applying the
rewrite to its own output changes nothing, content is preserved (only moved), at most
`max_markers` markers, TTL order holds, and no marker sits where the provider rejects one.
"""

from __future__ import annotations

import copy

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.breakpoints import place_breakpoints
from proxy.pipeline.canonicalise import canonicalise_body
from proxy.pipeline.reorder import reorder_body
from proxy.providers import ANTHROPIC, route
from proxy.providers.openai_request import has_breakpoints
from proxy.settings import UpstreamCapabilities
from tests.pipeline.helpers import RULES, STAYING_RULES, optimise
from tests.pipeline.reference_blocks import anthropic_blocks, openai_blocks
from tests.pipeline.strategies import (
    ANTHROPIC_MARKER_KEY,
    OPENAI_MARKER_KEY,
    anthropic_bodies,
    content_fingerprint,
    contexts,
    count_markers,
    flatten_layout,
    openai_bodies,
)

MESSAGES = "/v1/messages"
FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
rule_sets = st.sampled_from([RULES, STAYING_RULES])
min_tokens = st.sampled_from([0, 8, None])
capabilities = st.sampled_from(
    [
        UpstreamCapabilities(),
        UpstreamCapabilities(strip_ttl=True, strip_scope=True, no_tool_message_markers=True),
    ]
)


def _bytes(value: object) -> bytes:
    return orjson.dumps(value)


def _assert_anthropic_legal(body: dict) -> None:
    key = ANTHROPIC_MARKER_KEY
    ttls = []
    for block in ANTHROPIC.prefix_blocks(body):
        value = block.value
        if not isinstance(value, dict):
            continue
        inner = value.get("content")
        if isinstance(inner, list):
            assert not any(isinstance(p, dict) and key in p for p in inner), (
                "marker inside tool_result.content"
            )
        marker = value.get(key)
        assert key not in value or marker is not None, "cache_control: null"
        if marker is None:
            continue
        assert block.kind not in ("thinking", "redacted_thinking")
        if block.kind == "text":
            assert value.get("text"), "marker on empty text"
        ttls.append(marker.get("ttl", "5m"))
    assert key not in body, "top-level marker left"
    assert "1h" not in ttls[ttls.index("5m") :] if "5m" in ttls else True, f"1h after 5m: {ttls}"


@FAST
@given(anthropic_bodies())
def test_layout_is_prefix_blocks_anthropic(body: dict) -> None:
    blocks = anthropic_blocks(MESSAGES, body)
    expected = [(b.section, b.path, b.kind, id(b.value), b.message_index, b.role) for b in blocks]
    assert flatten_layout(ANTHROPIC, body) == expected
    assert [(b.section, b.path, b.kind, id(b.value), b.message_index, b.role)
            for b in ANTHROPIC.prefix_blocks(body)] == expected


@FAST
@given(openai_bodies())
def test_layout_is_prefix_blocks_openai(case: tuple[str, dict]) -> None:
    path, body = case
    blocks = openai_blocks(path, body)
    expected = [(b.section, b.path, b.kind, id(b.value), b.message_index, b.role) for b in blocks]
    assert flatten_layout(route(path)[0], body) == expected
    assert [(b.section, b.path, b.kind, id(b.value), b.message_index, b.role)
            for b in route(path)[0].prefix_blocks(body)] == expected


def _per_key(adapter, body: dict) -> list:
    runs = []
    for key in adapter.prefix_keys:
        if key in body:
            runs.extend(adapter.layout({key: body[key]}))
    return [(r.section, r.key, id(r.value), r.is_list, r.kind, r.role, r.message) for r in runs]


def _whole(adapter, body: dict) -> list:
    return [
        (r.section, r.key, id(r.value), r.is_list, r.kind, r.role, r.message)
        for r in adapter.layout(body)
    ]


@FAST
@given(anthropic_bodies(), openai_bodies())
def test_layout_per_prefix_key_is_the_whole_layout(body: dict, case: tuple[str, dict]) -> None:
    assert _per_key(ANTHROPIC, body) == _whole(ANTHROPIC, body)
    path, openai_body = case
    assert _per_key(route(path)[0], openai_body) == _whole(route(path)[0], openai_body)


@FAST
@given(anthropic_bodies(), rule_sets, min_tokens)
def test_shared_layout_cache_changes_nothing(body: dict, rules, minimum) -> None:
    shared, plan = optimise(ANTHROPIC, body, rules, min_tokens=minimum)
    alone, plan_alone = optimise(ANTHROPIC, body, rules, min_tokens=minimum, shared_cache=False)
    assert _bytes(shared) == _bytes(alone) and plan == plan_alone


@FAST
@given(anthropic_bodies(), rule_sets, min_tokens, capabilities, contexts)
def test_pipeline_anthropic(body: dict, rules, minimum, caps, context) -> None:
    before = _bytes(body)
    snapshot = copy.deepcopy(body)
    out, plan = optimise(ANTHROPIC, body, rules, min_tokens=minimum, caps=caps, context=context)
    assert _bytes(body) == before and body == snapshot, "input mutated"
    again, plan2 = optimise(ANTHROPIC, out, rules, min_tokens=minimum, caps=caps, context=context)
    assert _bytes(again) == _bytes(out), "not idempotent"
    assert plan2.positions == plan.positions and plan2.injected == plan2.moved == plan2.dropped == 0
    key = ANTHROPIC_MARKER_KEY
    assert count_markers(ANTHROPIC, out, key) <= 4
    _assert_anthropic_legal(out)
    assert content_fingerprint(ANTHROPIC, out, key) == content_fingerprint(
        ANTHROPIC, body, key
    )
    roles = [m["role"] for m in body["messages"]]
    assert [m["role"] for m in out["messages"]] == roles
    blocks = ANTHROPIC.prefix_blocks(out)
    assert [i for i, b in enumerate(blocks) if isinstance(b.value, dict) and b.value.get(key)] == list(
        plan.positions
    )
    if caps.strip_ttl:
        assert all("ttl" not in b.value.get(key, {}) for b in blocks if isinstance(b.value, dict))
    if caps.no_tool_message_markers:
        assert not any(b.kind == "tool_result" and b.value.get(key) for b in blocks)


@FAST
@given(openai_bodies(), rule_sets, min_tokens)
def test_pipeline_openai(case: tuple[str, dict], rules, minimum) -> None:
    path, body = case
    before = _bytes(body)
    out, plan = optimise(route(path)[0], body, rules, min_tokens=minimum)
    assert _bytes(body) == before, "input mutated"
    again, _ = optimise(route(path)[0], out, rules, min_tokens=minimum)
    assert _bytes(again) == _bytes(out), "not idempotent"
    key = OPENAI_MARKER_KEY
    assert content_fingerprint(route(path)[0], out, key) == content_fingerprint(route(path)[0], body, key)
    assert out.get("prompt_cache_key") == body.get("prompt_cache_key", out.get("prompt_cache_key"))
    items = out.get("input") if path == "/v1/responses" else None
    if isinstance(items, list):  # no repeated item id (docs/provider-rules.md 9)
        ids = [item["id"] for item in items if isinstance(item, dict) and "id" in item]
        assert len(ids) == len(set(ids))
    if not has_breakpoints(body["model"]):
        assert count_markers(route(path)[0], out, key) <= count_markers(route(path)[0], body, key)
        return
    assert count_markers(route(path)[0], out, key) <= 4
    for block in route(path)[0].prefix_blocks(out):
        if isinstance(block.value, dict) and block.value.get(key) is not None:
            assert block.role in ("user", "system", "developer", "tool")
            assert block.kind in (
                "text",
                "input_text",
                "image_url",
                "input_audio",
                "file",
                "input_image",
                "input_file",
            )


@FAST
@given(anthropic_bodies(), rule_sets)
def test_each_core_is_idempotent_and_pure(body: dict, rules) -> None:
    before = _bytes(body)
    canonical, _ = canonicalise_body(ANTHROPIC, body)
    assert _bytes(canonicalise_body(ANTHROPIC, canonical)[0]) == _bytes(canonical)
    reordered, plan = reorder_body(ANTHROPIC, canonical, rules)
    again, plan2 = reorder_body(ANTHROPIC, reordered, rules)
    assert _bytes(again) == _bytes(reordered) and plan2.tiers == plan.tiers and not plan2.changed
    marked, _ = place_breakpoints(ANTHROPIC, body)
    assert _bytes(place_breakpoints(ANTHROPIC, marked)[0]) == _bytes(marked)
    assert _bytes(body) == before


@FAST
@given(openai_bodies(), rule_sets)
def test_each_core_is_idempotent_and_pure_openai(case: tuple[str, dict], rules) -> None:
    path, body = case
    before = _bytes(body)
    canonical, _ = canonicalise_body(route(path)[0], body)
    assert _bytes(canonicalise_body(route(path)[0], canonical)[0]) == _bytes(canonical)
    reordered, _ = reorder_body(route(path)[0], canonical, rules)
    assert _bytes(reorder_body(route(path)[0], reordered, rules)[0]) == _bytes(reordered)
    marked, _ = place_breakpoints(route(path)[0], body)
    assert _bytes(place_breakpoints(route(path)[0], marked)[0]) == _bytes(marked)
    assert _bytes(body) == before
