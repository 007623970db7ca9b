"""Differential attack on the reuse paths for a new session re-sending a recent conversation:
a process that reuses (incremental) and one that reuses nothing (full) given the same request
sequence send the same bytes, record the same records and count the same metrics."""

from __future__ import annotations

import copy
import os
from typing import Any, Final

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.exchange import Exchange
from proxy.pipeline.session import masker_for
from proxy.providers import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from tests.sessions.test_fast_paths import run_exchange
from tests.sessions.test_incremental_parse import _counters, _paired, _same


async def send(services: Any, adapter: Any, raw: bytes, key: str = "key-a") -> Exchange:
    """One exchange of tenant `key` (its credential in both providers' headers)."""
    return await run_exchange(services, adapter, raw, {"x-api-key": key, "authorization": f"Bearer {key}"})


def turn_anthropic(k: int) -> list[dict[str, Any]]:
    call = f"toolu_{k:05d}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Step {k}: reading the next file."},
                {"type": "tool_use", "id": call, "name": "read", "input": {"path": f"src/m{k}.py"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": f"x = {k}\n" * 300}]},
    ]


def body_anthropic(turns: int) -> dict[str, Any]:
    messages: list[Any] = [{"role": "user", "content": "Start."}]
    for k in range(turns):
        messages.extend(turn_anthropic(k))
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "You are a careful agent. " * 300}],
        "tools": [{"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}],
        "messages": messages,
    }


def body_chat(turns: int) -> dict[str, Any]:
    messages: list[Any] = [
        {"role": "system", "content": "You are a careful agent. " * 300},
        {"role": "user", "content": "Start."},
    ]
    for k in range(turns):
        call = f"call_{k:05d}"
        messages.append(
            {
                "role": "assistant",
                "content": f"Step {k}",
                "tool_calls": [
                    {"id": call, "type": "function", "function": {"name": "read", "arguments": f'{{"path":"m{k}.py"}}'}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call, "content": f"x = {k}\n" * 300})
    return {
        "model": "gpt-5",
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
        "messages": messages,
    }


def body_responses(turns: int) -> dict[str, Any]:
    items: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": "Start."}]}]
    for k in range(turns):
        call = f"call_{k:05d}"
        items.append({"type": "function_call", "call_id": call, "name": "read", "arguments": f'{{"path":"m{k}.py"}}'})
        items.append({"type": "function_call_output", "call_id": call, "output": f"x = {k}\n" * 300})
    return {
        "model": "gpt-5",
        "instructions": "You are a careful agent. " * 300,
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
        "input": items,
    }


def body_anthropic_messages_first(turns: int) -> dict[str, Any]:
    """Claude Code's key order: the message array before the system prompt and tools."""
    body = body_anthropic(turns)
    return {"model": body["model"], "messages": body["messages"], **{k: v for k, v in body.items() if k != "messages"}}


PROVIDERS = {
    "anthropic": (ANTHROPIC, body_anthropic, "messages"),
    "anthropic_messages_first": (ANTHROPIC, body_anthropic_messages_first, "messages"),
    "chat": (OPENAI_CHAT, body_chat, "messages"),
    "responses": (OPENAI_RESPONSES, body_responses, "input"),
}


def _marker(provider: str) -> dict[str, Any]:
    return {"cache_control": {"type": "ephemeral"}}


def mutate(provider: str, body: dict[str, Any], op: str, at: int) -> dict[str, Any]:
    adapter, _, key = PROVIDERS[provider]
    body = copy.deepcopy(body)
    items = body[key]
    n = len(items)
    i = at % n
    item = items[i]
    if op == "first":  # a new first (user) message
        first = 1 if provider == "chat" else 0
        if provider == "responses":
            items[first] = {"role": "user", "content": [{"type": "input_text", "text": f"Start again ({at})."}]}
        else:
            items[first] = {"role": "user", "content": f"Start again ({at})."}
    elif op == "marker_add":
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list) and content and isinstance(content[-1], dict):
            content[-1] = {**content[-1], **_marker(provider)}
        elif isinstance(content, str):
            item["content"] = [
                {"type": "text" if provider != "responses" else "input_text", "text": content, **_marker(provider)}
            ]
        elif isinstance(item, dict):
            item.update(_marker(provider))
    elif op == "marker_remove":
        for it in items:
            if isinstance(it, dict):
                it.pop("cache_control", None)
                c = it.get("content")
                if isinstance(c, list):
                    for b in c:
                        if isinstance(b, dict):
                            b.pop("cache_control", None)
    elif op == "marker_message":  # a marker on the message object itself
        if isinstance(item, dict):
            item["cache_control"] = {"type": "ephemeral"}
    elif op == "edit":
        if isinstance(item, dict) and isinstance(item.get("content"), str):
            item["content"] = item["content"] + " (edited)"
        elif isinstance(item, dict) and isinstance(item.get("content"), list) and item["content"]:
            b = item["content"][0]
            if isinstance(b, dict) and "text" in b:
                b["text"] = b["text"] + " (edited)"
            elif isinstance(b, dict) and "content" in b:
                b["content"] = str(b["content"]) + " (edited)"
        elif isinstance(item, dict) and "output" in item:
            item["output"] = item["output"] + " (edited)"
        elif isinstance(item, dict) and "arguments" in item:
            item["arguments"] = '{"path":"edited.py"}'
    elif op == "unknown_block":
        if isinstance(item, dict) and isinstance(item.get("content"), list):
            item["content"].append(
                {"type": "mystery", "content": [{"type": "text", "text": "n", "cache_control": {"type": "ephemeral"}}]}
            )
        elif provider == "responses":
            items.insert(i, {"type": "mystery_item", "data": "q"})
        elif isinstance(item, dict):
            item["content"] = [{"type": "mystery", "x": 1}]
    elif op == "unknown_type_value":
        if isinstance(item, dict) and isinstance(item.get("content"), list) and item["content"]:
            item["content"][0] = {**item["content"][0], "type": 7}
    elif op == "duplicate":
        items.insert(i, copy.deepcopy(item))
    elif op == "shrink":
        del items[max(2, n - 1 - at % 5) :]
    elif op == "drop_middle":
        if n > 4:
            del items[i]
    elif op == "system_message" and provider == "chat":
        items.insert(i or 1, {"role": "system", "content": f"note {at}"})
    elif op == "developer" and provider == "chat":
        items.insert(i or 1, {"role": "developer", "content": f"note {at}"})
    elif op == "append":
        if provider.startswith("anthropic"):
            items.extend(turn_anthropic(1000 + at))
        else:
            items.append(
                {"role": "user", "content": f"more {at}"}
                if provider == "chat"
                else {"role": "user", "content": [{"type": "input_text", "text": f"more {at}"}]}
            )
    elif op == "role_swap":
        if isinstance(item, dict) and "role" in item and item["role"] in ("user", "assistant"):
            item["role"] = "assistant" if item["role"] == "user" else "user"
    elif op == "non_dict":
        items.insert(i, 7)
    elif op == "reorder_keys":
        if isinstance(item, dict):
            items[i] = dict(reversed(list(item.items())))
    elif op == "stamp":
        if isinstance(item, dict) and isinstance(item.get("content"), str):
            item["content"] = item["content"] + f" at 2026-01-0{at % 9 + 1}T10:{at % 60:02d}:00Z"
        elif isinstance(item, dict) and isinstance(item.get("content"), list) and item["content"]:
            b = item["content"][0]
            if isinstance(b, dict) and isinstance(b.get("text"), str):
                b["text"] = b["text"] + f" at 2026-01-0{at % 9 + 1}T10:{at % 60:02d}:00Z"
    elif op == "odd_role":
        if isinstance(item, dict):
            item["role"] = 5
    elif op == "system_edit":
        if provider.startswith("anthropic"):
            body["system"] = [{"type": "text", "text": f"You are agent {at}. " * 300}]
        elif provider == "responses":
            body["instructions"] = f"You are agent {at}. " * 300
        else:
            items[0] = {"role": "system", "content": f"You are agent {at}. " * 300}
    elif op == "nulls_add":  # an SDK's model_dump() form of the message
        if isinstance(item, dict):
            if provider == "chat" and item.get("role") == "assistant":
                item.update({"refusal": None, "audio": None, "function_call": None, "annotations": None})
                item.setdefault("tool_calls", None)
            elif provider == "responses":
                item["status"] = None
            content = item.get("content")
            if isinstance(content, list):
                for b in content:
                    if isinstance(b, dict):
                        b["citations" if provider != "responses" else "logprobs"] = None
            elif provider == "chat" and item.get("role") == "tool":
                item["name"] = None
    elif op == "nulls_remove":
        for it in items:
            if isinstance(it, dict):
                for k2 in [k2 for k2, v in it.items() if v is None]:
                    del it[k2]
                c = it.get("content")
                if isinstance(c, list):
                    for b in c:
                        if isinstance(b, dict):
                            for k2 in [k2 for k2, v in b.items() if v is None]:
                                del b[k2]
    elif op == "null_deep":
        if isinstance(item, dict) and isinstance(item.get("content"), list):
            for b in item["content"]:
                if isinstance(b, dict) and isinstance(b.get("input"), dict):
                    b["input"] = {**b["input"], "x": None}
        elif isinstance(item, dict) and "arguments" in item:
            item["arguments"] = item["arguments"][:-1] + ',"x":null}'
    elif op == "null_content":
        if isinstance(item, dict) and "content" in item:
            item["content"] = None
    elif op == "null_role":
        if isinstance(item, dict):
            item["role"] = None
    elif op == "null_type":
        if isinstance(item, dict) and isinstance(item.get("content"), list) and item["content"]:
            if isinstance(item["content"][0], dict):
                item["content"][0]["type"] = None
        elif isinstance(item, dict) and "type" in item:
            item["type"] = None
    elif op == "session":
        if provider.startswith("anthropic"):
            body["metadata"] = {"user_id": f"s-{at}"}
        else:
            body["prompt_cache_key"] = f"s-{at}"
    return body


OPS = [
    "first",
    "marker_add",
    "marker_remove",
    "marker_message",
    "edit",
    "unknown_block",
    "unknown_type_value",
    "duplicate",
    "shrink",
    "drop_middle",
    "system_message",
    "developer",
    "append",
    "role_swap",
    "non_dict",
    "session",
    "reorder_keys",
    "odd_role",
    "system_edit",
    "system_edit",
    "stamp",
    "first",
    "nulls_add",  # model_dump() forms (proxy.nulls), and nulls that are data or malformed
    "nulls_add",
    "nulls_remove",
    "null_deep",
    "null_content",
    "null_role",
    "null_type",
]

FORMATS = st.sampled_from(["plain", "plain", "plain", "indent", "escaped_key", "space_after", "escaped_null_key"])


def render(body: dict[str, Any], fmt: str) -> bytes:
    if fmt == "indent":
        return orjson.dumps(body, option=orjson.OPT_INDENT_2)
    raw = orjson.dumps(body)
    if fmt == "escaped_key":
        return raw.replace(b'"role":', b'"r\\u006fle":', 1)
    if fmt == "escaped_null_key":
        return raw.replace(b'":null', b'" : null', 1)
    if fmt == "space_after":
        return raw[:-1] + b" }"
    return raw


STEP = st.tuples(
    st.integers(0, 3),  # base: 0 the original, else the body sent `k` steps ago
    st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 10_000)), min_size=0, max_size=3),
    FORMATS,
    st.sampled_from(["key-a", "key-a", "key-a", "key-b"]),
)


async def run_sequence(
    provider: str, mode: str, turns: int, steps: list[Any], parsed_bytes: int | None = None
) -> list[Exchange]:
    """Send `steps` to a reusing and a non-reusing process alike (`parsed_bytes`: the reusing
    one's `RawPrefixIndex.max_parsed_bytes`); the reusing one's exchanges."""
    adapter, make, _ = PROVIDERS[provider]
    incremental, full = _paired(mode)
    if parsed_bytes is not None:
        assert incremental.sessions is not None
        masker_for(incremental.sessions, incremental).raw_index.max_parsed_bytes = parsed_bytes
    sent = []
    base = make(turns)
    if provider.startswith("anthropic"):
        base["metadata"] = {"user_id": "s-base"}
    history = [base]
    for k, (back, ops, fmt, key) in enumerate([(0, [], "plain", "key-a"), *steps]):
        body = history[-back] if back and back <= len(history) else history[0]
        for op, at in ops:
            body = mutate(provider, body, op, at)
        raw = render(body, fmt)
        a = await send(incremental, adapter, raw, key)
        b = await send(full, adapter, raw, key)
        sent.append(a)
        _same(a, b)
        assert a.session_id == b.session_id and a.tenant == b.tenant, k
        if a.tenant is not None and a.session_id is not None:
            ra = await incremental.store.load(a.tenant, a.session_id)
            rb = await full.store.load(b.tenant, b.session_id)
            assert ra == rb, (k, ops, fmt)
        history.append(body)
    assert _counters(incremental) == _counters(full)
    return sent


ATTACK: Final = settings(
    max_examples=int(os.environ.get("BRK_N", "12")),  # BRK_N=300: a longer attack
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
"""How many sequences each attack draws (`BRK_N`), with no deadline."""


def sequences(min_steps: int, max_steps: int) -> Any:
    """`given(provider, mode, turns, steps)` of `min_steps` to `max_steps` steps."""
    return given(
        st.sampled_from(list(PROVIDERS)),
        st.sampled_from(["observe", "optimise"]),
        st.integers(30, 36),
        st.lists(STEP, min_size=min_steps, max_size=max_steps),
    )


@ATTACK
@sequences(1, 6)
async def test_reuse_is_invisible(provider: str, mode: str, turns: int, steps: list[Any]) -> None:
    """Any sequence of bodies derived from recent ones (new first messages, markers added,
    removed or on the message, edits inside the reused stretch, blocks of unknown kind, odd
    roles, duplicates, shrinking arrays, system edits, re-ordered keys, volatile stamps,
    whitespace and escaped keys, two tenants) is sent, recorded and counted alike."""
    await run_sequence(provider, mode, turns, steps)


FEW_FIT: Final = 210_000
"""Kept parsed bodies of two of the sequences' bodies (85-101 KB) and, half again, the newest
one turned away (`rawprefix.MAX_RECENT`): the admission turns most new sessions away."""


@ATTACK
@sequences(2, 8)
async def test_reuse_is_invisible_when_few_bodies_fit(provider: str, mode: str, turns: int, steps: list[Any]) -> None:
    """The same attack where the kept bodies hold two: the bodies read around an edit are
    often ones the admission turned away."""
    await run_sequence(provider, mode, turns, steps, FEW_FIT)


async def test_sessions_in_turn_whose_bodies_are_not_kept_read_the_one_just_turned_away() -> None:
    """Four sessions of one conversation (their own first messages) appending the same turns in
    turn, where the kept bodies hold two: the two sessions turned away read their messages from
    the body of the one just before them (the held ones' array ends are other turns'), all as
    the full path sends and records them."""
    sessions = [(0, [("first", n), ("session", n)], "plain", "key-a") for n in range(4)]
    rounds = [(4, [("append", r)], "plain", "key-a") for r in range(3) for _ in range(4)]
    sent = await run_sequence("anthropic", "optimise", 30, [*sessions, *rounds], FEW_FIT)
    paths = [
        "own" if m.kept is not None and m.around is None else "around" if m.around is not None else "whole"
        for m in (a.raw_match for a in sent[5:])
        if m is not None
    ]
    # sessions 2 and 3 stay kept (the newest when the budget filled); 0 reads nothing of 1's
    # previous turn, 1 reads all of 0's body but its first message
    assert paths == ["whole", "around", "own", "own"] * 3


def _malformed(services: Any) -> list[str]:
    return [line for line in _counters(services) if line.startswith("promptcache_malformed_parts_total")]


def _system_edited(body: dict[str, Any]) -> dict[str, Any]:
    """`body` under another system prompt: its first bytes differ, so no kept body shares them
    and the session stage starts from the body `parse` took the messages from (`around`)."""
    return {**body, "system": [{"type": "text", "text": "You are another agent. " * 300}]}


@pytest.mark.parametrize("mode", ["observe", "optimise"])
@pytest.mark.parametrize("where", ["message", "system"])
@pytest.mark.parametrize("second", ["append", "system", "first"])
async def test_blocks_of_no_known_kind_are_counted_as_a_full_scan_counts_them(
    mode: str, where: str, second: str
) -> None:
    """A block whose `type` is not a string is counted (`promptcache_malformed_parts_total`) as
    often as in a process that reuses nothing, when the layout cache starts from a kept body's
    scans (`LayoutCache.seed`): their leading runs adopted (`_adopt`) or a key's scan taken as it
    is were not counted (a new session re-sending a conversation under another system prompt,
    and an appended turn: 1 where the full path counts 2)."""
    incremental, full = _paired(mode)
    base = body_anthropic(32)
    if where == "message":
        base["messages"][5]["content"][0] = {**base["messages"][5]["content"][0], "type": 7}
    else:
        base["system"] = [*base["system"], {"type": 7, "text": "odd"}]
    following = {
        "append": lambda b: mutate("anthropic", b, "append", 3),
        "system": _system_edited,
        "first": lambda b: mutate("anthropic", b, "first", 3),
    }[second](base)
    if where == "system" and second == "system":
        following["system"] = [*following["system"], {"type": 7, "text": "odd"}]
    for body in (base, following):
        raw = orjson.dumps(body)
        _same(await send(incremental, ANTHROPIC, raw), await send(full, ANTHROPIC, raw))
    assert _malformed(incremental) == _malformed(full)
    assert _counters(incremental) == _counters(full)


@pytest.mark.parametrize("mode", ["observe", "optimise"])
@pytest.mark.parametrize("second", ["append", "first"])
async def test_messages_of_non_string_role_are_counted_as_a_full_view_counts_them(mode: str, second: str) -> None:
    """A Chat message whose `role` is not a string is counted once per request by the view
    (`Masker.examine_all`, identity-optional keys) in a process that reuses nothing; the
    elements a recent body's results are reused for (the leading ones by prefix, the trailing
    ones `parse` took from a kept body) were not walked, so not counted."""
    incremental, full = _paired(mode)
    base = body_chat(32)
    base["messages"][5] = {**base["messages"][5], "role": 5}
    following = mutate("chat", base, second, 3)
    for body in (base, following):
        raw = orjson.dumps(body)
        _same(await send(incremental, OPENAI_CHAT, raw), await send(full, OPENAI_CHAT, raw))
    assert _malformed(incremental) == _malformed(full)
