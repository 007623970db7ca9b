"""Hypothesis strategies for Anthropic and OpenAI request bodies, and content fingerprints.

Bodies mix what the pipeline must handle: system text with timestamps, cwd lines, billing
headers and memory sections; markers (legal, illegal, null, top-level, 1h after 5m); empty text;
thinking blocks; tool_result content with markers; shuffled tool schemas.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import orjson
from hypothesis import strategies as st

from proxy.pipeline.blocks import BlockView
from proxy.pipeline.breakpoints import PlanContext
from proxy.providers.base import ProviderAdapter

ANTHROPIC_MARKER_KEY = "cache_control"
OPENAI_MARKER_KEY = "prompt_cache_breakpoint"

LINES = [
    "You are a careful coding agent.",
    "Always answer briefly.",
    "Current time: 2026-11-29T20:09:13Z",
    "Working directory: /home/alice/project",
    "Today's date: 2026-11-29",
    "Session id: 3f0c2a9e-7b1d-4c55-9a0e-1f2d3c4b5a69",
    "x-anthropic-billing-header: cc_version=2.1.3; cch=9a8b7;",
    "# Memory",
    "- prefers tabs",
    "<env>",
    "Platform: linux",
    "</env>",
    "Tokens used: 1234 of 200000",
    "Use the tools when they help.",
    "<context>",
    "</context>",
    "## Todo (updated 2026-12-01T09:30:00Z)",
    "- [ ] write the tests",
    "### Details",
    "```",
    "# Current time: 2026-12-01T09:31:00Z",
    "",
    "   ",
]

texts = st.lists(st.sampled_from(LINES), min_size=0, max_size=6).map("\n".join)
nonempty_texts = st.lists(st.sampled_from(LINES[:-2]), min_size=1, max_size=4).map("\n".join)
markers = st.sampled_from(
    [
        None,
        None,
        None,
        {"type": "ephemeral"},
        {"type": "ephemeral", "ttl": "5m"},
        {"type": "ephemeral", "ttl": "1h"},
        "null",
    ]
)

contexts = st.one_of(
    st.none(),
    st.builds(
        PlanContext,
        st.lists(st.integers(0, 12), max_size=3).map(tuple),
        st.sampled_from(["5m", "1h"]),
        st.sampled_from(["5m", "1h"]),
        st.integers(0, 2),  # tail_misses: 1 and more skip the newest message's tail
    ),
)
"""A `PlanContext` (previous markers, TTLs, tail misses) or none, for the planner's properties."""

def _with_marker(block: dict[str, Any], marker: Any, key: str) -> dict[str, Any]:
    if marker is None:
        return block
    return {**block, key: None if marker == "null" else marker}


@st.composite
def schemas(draw: st.DrawFn) -> dict[str, Any]:
    props = draw(st.lists(st.sampled_from(["path", "query", "limit", "mode"]), unique=True, max_size=4))
    order = draw(st.permutations(["type", "properties", "required"]))
    parts = {"type": "object", "properties": {p: {"type": "string"} for p in props}, "required": props[:1]}
    return {k: parts[k] for k in order}


@st.composite
def anthropic_tools(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(
        st.lists(st.sampled_from(["read", "write", "bash", "grep", "glob"]), unique=True, max_size=4)
    )
    return [
        _with_marker(
            {"name": n, "description": f"{n} tool", "input_schema": draw(schemas())},
            draw(markers),
            ANTHROPIC_MARKER_KEY,
        )
        for n in names
    ]


@st.composite
def anthropic_block(draw: st.DrawFn, role: str) -> dict[str, Any]:
    key = ANTHROPIC_MARKER_KEY
    kinds = ["text", "text", "image"] + (["tool_result"] if role == "user" else ["tool_use", "thinking"])
    kind = draw(st.sampled_from(kinds))
    if kind == "text":
        block: dict[str, Any] = {"type": "text", "text": draw(st.one_of(st.just(""), nonempty_texts))}
    elif kind == "image":
        block = {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        }
    elif kind == "tool_use":
        args = draw(st.permutations([("path", "a.py"), ("limit", 3), ("mode", "r")]))
        block = {
            "type": "tool_use",
            "id": f"tu_{draw(st.integers(0, 99))}",
            "name": "read",
            "input": dict(args),
        }
    elif kind == "thinking":
        block = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    else:
        inner = draw(
            st.one_of(
                st.just("ok"),
                st.lists(
                    st.builds(
                        lambda t, m: _with_marker({"type": "text", "text": t}, m, key),
                        nonempty_texts,
                        markers,
                    ),
                    min_size=1,
                    max_size=2,
                ),
            )
        )
        block = {"type": "tool_result", "tool_use_id": "tu_1", "content": inner}
    return _with_marker(block, draw(markers), key)


@st.composite
def anthropic_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(["claude-sonnet-4-6", "claude-opus-5", "claude-x"])),
        "max_tokens": 64,
    }
    n = draw(st.integers(1, 5))
    messages = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        if draw(st.booleans()):
            content: Any = draw(st.one_of(st.just(""), nonempty_texts))
        else:
            content = draw(st.lists(anthropic_block(role), min_size=1, max_size=4))
        messages.append({"role": role, "content": content})
    parts = {"messages": messages}
    if draw(st.booleans()):
        parts["tools"] = draw(anthropic_tools())
    system_kind = draw(st.sampled_from(["none", "string", "list"]))
    if system_kind == "string":
        parts["system"] = draw(texts)
    elif system_kind == "list":
        parts["system"] = [
            _with_marker({"type": "text", "text": t}, draw(markers), ANTHROPIC_MARKER_KEY)
            for t in draw(st.lists(texts, min_size=1, max_size=3))
        ]
    for k in draw(st.permutations(list(parts))):
        body[k] = parts[k]
    top = draw(markers)
    if top is not None:
        body["cache_control"] = None if top == "null" else top
    return body


@st.composite
def openai_part(draw: st.DrawFn, text_type: str, role: str) -> dict[str, Any]:
    part: dict[str, Any] = {"type": text_type, "text": draw(st.one_of(st.just(""), nonempty_texts))}
    marker = draw(st.sampled_from([None, None, None, {"mode": "explicit"}, "null"]))
    if role == "assistant" and text_type == "text" and draw(st.booleans()):
        part = {"type": "text", "text": part["text"] or "done"}
    return _with_marker(part, marker, OPENAI_MARKER_KEY)


@st.composite
def openai_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/responses"]))
    is_responses = path == "/v1/responses"
    text_type = "input_text" if is_responses else "text"
    model = draw(st.sampled_from(["gpt-4o", "gpt-5.1", "gpt-5.6", "gpt-6-mini"]))
    items: list[Any] = []
    for _ in range(draw(st.integers(0, 2))):
        role = draw(st.sampled_from(["system", "developer"]))
        content = draw(st.one_of(texts, st.lists(openai_part(text_type, role), min_size=1, max_size=3)))
        item = {"role": role, "content": content}
        if is_responses and draw(st.booleans()):
            item["id"] = f"msg_head_{len(items)}"  # item ids are unique (docs/provider-rules.md 9)
        items.append(item)
    for i in range(draw(st.integers(1, 4))):
        role = "user" if i % 2 == 0 else "assistant"
        if role == "assistant" and not is_responses and draw(st.booleans()):
            items.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "read", "arguments": '{"b":1,"a":2}'},
                        }
                    ],
                }
            )
            items.append({"role": "tool", "tool_call_id": "call_1", "content": draw(nonempty_texts)})
            continue
        if role == "assistant" and is_responses:
            items.append({"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"})
            items.append({"type": "function_call_output", "call_id": "c1", "output": "ok"})
            continue
        content = draw(
            st.one_of(nonempty_texts, st.lists(openai_part(text_type, role), min_size=1, max_size=3))
        )
        items.append({"role": role, "content": content})
    body: dict[str, Any] = {"model": model}
    if draw(st.booleans()):
        tools = [
            {"type": "function", "function": {"name": n, "parameters": draw(schemas())}}
            for n in draw(st.lists(st.sampled_from(["read", "bash"]), unique=True, max_size=2))
        ]
        if is_responses:
            tools = [
                {"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
                for t in tools
            ]
        body["tools"] = tools
    if is_responses:
        if draw(st.booleans()):
            body["instructions"] = draw(texts)
        body["input"] = draw(st.one_of(st.just(items), nonempty_texts)) if items else draw(nonempty_texts)
    else:
        body["messages"] = items
    if draw(st.booleans()):
        body["prompt_cache_options"] = {"mode": draw(st.sampled_from(["implicit", "explicit"]))}
    return path, body


# --- fingerprints -----------------------------------------------------------------------------


def _strip(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [_strip(v, key) for v in value]
    return value


def _canon(value: Any, key: str) -> bytes:
    return orjson.dumps(_strip(value, key), option=orjson.OPT_SORT_KEYS)


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


TEXT_KINDS = ("text", "input_text")
TAG_LINE = re.compile(r"\s*</?[A-Za-z_][\w.:-]*(\s[^<>]*)?>\s*")
"""A line holding only an opening or closing tag: reorder may repeat it (a wrapper goes
wherever its content goes), so the fingerprint counts whether it is present, not how often."""


def _text_lines(out: Counter, value: Any) -> None:
    """Lines of a string or of the text parts of a list; other parts as canonical blocks."""
    if isinstance(value, str):
        out.update(("line", line) for line in _lines(value))
    elif isinstance(value, list):
        for part in value:
            if (
                isinstance(part, dict)
                and part.get("type") in TEXT_KINDS
                and isinstance(part.get("text"), str)
            ):
                out.update(("line", line) for line in _lines(part["text"]))
            else:
                out[("block", "part", _canon(part, ""))] += 1


def content_fingerprint(adapter: ProviderAdapter, body: dict[str, Any], key: str) -> Counter:
    """Multiset of what the model sees: lines of text (system, messages, tool outputs), and
    every other block in canonical form (sorted keys, markers removed). Invariant under the
    pipeline; tag lines (`TAG_LINE`) count once however often they appear."""
    out: Counter = Counter()
    for block in adapter.prefix_blocks(body):
        value = block.value
        if isinstance(value, str):
            out.update(("line", line) for line in _lines(value))
        elif (
            isinstance(value, dict) and value.get("type") in TEXT_KINDS and isinstance(value.get("text"), str)
        ):
            out.update(("line", line) for line in _lines(value["text"]))
            extra = {k: v for k, v in value.items() if k not in ("type", "text", key)}
            if extra:
                out[("extra", _canon(extra, key))] += 1
        elif isinstance(value, dict) and block.kind == "function_call_output":
            _text_lines(out, value.get("output"))
            rest = {k: v for k, v in value.items() if k != "output"}
            out[("block", block.kind, _canon(rest, key))] += 1
        elif value is not None:
            out[("block", block.kind, _canon(value, key))] += 1
    for item in list(out):
        if item[0] == "line" and TAG_LINE.fullmatch(item[1]):
            out[item] = 1
    return out


def count_markers(adapter: ProviderAdapter, body: dict[str, Any], key: str) -> int:
    """Markers in `body`: on blocks, inside `content` of blocks, and at the top level."""
    total = 1 if body.get(key) is not None else 0
    for block in adapter.prefix_blocks(body):
        value = block.value
        if isinstance(value, dict):
            total += value.get(key) is not None
            inner = value.get("content")
            if isinstance(inner, list):
                total += sum(1 for p in inner if isinstance(p, dict) and p.get(key) is not None)
    return total


def flatten_layout(adapter: ProviderAdapter, body: dict[str, Any]) -> list[tuple]:
    view = BlockView(adapter.layout(body))
    out = []
    for i in range(view.size):
        run, _ = view.locate(i)
        out.append(
            (run.section, _dotted(view.path(i)), view.kind(i), id(view.value(i)), run.message, run.role)
        )
    return out


def _dotted(path: tuple) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
