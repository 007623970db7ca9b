"""The oracle's normalisation: each request's *stable form*, the best an ideal proxy could send.

The oracle (`oracle.py`) bounds cache reads over two forms of every request and keeps the larger
bound: the **raw form** (the client's body without any cache marker) and the **stable form**
built here. The stable form is what a proxy that knows the whole trace could send without
changing what the model is told, only where and in which bytes:

1. **Tools**: each tool definition is identified by its JSON with keys sorted and markers
   removed; tools are sent in the order they were first seen anywhere in the trace, each with
   the bytes of its first appearance (so shuffling and key reordering cost nothing).
2. **System prompt** (Anthropic `system`, the leading Chat `system`/`developer` messages,
   Responses `instructions`), split into lines (`\\n`): a line present in every request of the
   trace is *shared*, one present in every request of its session is *session-stable*, any other
   line is *volatile*. The stable form's system is the shared lines, then the session-stable
   lines (each group in original order; Anthropic: two text blocks, OpenAI: one string joined
   with `\\n`). Volatile lines are moved, joined with `\\n`, to the end of the newest message.
3. **History**: per session and index, a message (or input item) whose masked digest equals the
   one the session sent at that index before, with every earlier index also unchanged, is sent
   with the bytes of its first sending (including volatile lines appended to it then). The
   masked digest is xxh3-128 of the item's JSON with keys sorted, markers removed and every
   `MASKS` match (ISO-8601 timestamps, UUIDs) replaced by a fixed token. Anything else is new
   content: it and every later index get new first bytes.
4. Everything else in the body (model, parameters, headers) is the client's.

Sessions: the first of `SESSION_HEADERS` present, else `metadata.user_id`, `prompt_cache_key`
or `user` in the body, else one session for the whole trace.

This module shares no code with `proxy/pipeline/` (the oracle judges the pipeline).
"""

from __future__ import annotations

import copy
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Final

import orjson
import xxhash

from proxy.workloads.trace import Trace, TraceRequest

SESSION_HEADERS: Final = ("x-claude-code-session-id", "x-session-id")
MASKS: Final = (
    re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
    re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
)
"""Spans a proxy may keep at their first-sent value in earlier messages."""
_MARKER_KEYS: Final = frozenset({"cache_control", "prompt_cache_breakpoint"})


@dataclass(frozen=True, slots=True)
class Forms:
    """The two forms of one request."""

    raw: dict[str, Any]
    """The client's body without cache markers."""
    stable: dict[str, Any]
    """The stable form (module docstring)."""


def strip_markers(value: Any) -> Any:
    """A copy of `value` without `cache_control` / `prompt_cache_breakpoint` anywhere."""
    if isinstance(value, dict):
        return {k: strip_markers(v) for k, v in value.items() if k not in _MARKER_KEYS}
    if isinstance(value, list):
        return [strip_markers(v) for v in value]
    return value


def _mask(value: Any) -> Any:
    if isinstance(value, str):
        for pattern in MASKS:
            value = pattern.sub("\x00", value)
        return value
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value


def masked_digest(value: Any) -> bytes:
    """Digest of `value` with keys sorted, markers removed and `MASKS` spans masked."""
    return xxhash.xxh3_128_digest(orjson.dumps(_mask(strip_markers(value)), option=orjson.OPT_SORT_KEYS))


def session_of(request: TraceRequest) -> str:
    """The request's session key (module docstring)."""
    lowered = {k.lower(): v for k, v in request.headers.items()}
    for name in SESSION_HEADERS:
        if lowered.get(name):
            return f"h:{lowered[name]}"
    body = request.body
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        return f"m:{metadata['user_id']}"
    for key in ("prompt_cache_key", "user"):
        if isinstance(body.get(key), str):
            return f"{key}:{body[key]}"
    return "-"


# --- provider shapes --------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _leading_system(messages: list[Any]) -> int:
    n = 0
    while (
        n < len(messages)
        and isinstance(messages[n], dict)
        and messages[n].get("role") in ("system", "developer")
    ):
        n += 1
    return n


def system_texts(path: str, body: dict[str, Any]) -> list[str]:
    """The system prompt's texts (one per block / leading message)."""
    if path == "/v1/messages":
        system = body.get("system")
        if isinstance(system, str):
            return [system]
        if isinstance(system, list):
            return [str(b.get("text", "")) for b in system if isinstance(b, dict)]
        return []
    if path == "/v1/chat/completions":
        messages = body.get("messages") or []
        return [_text_of(m.get("content")) for m in messages[: _leading_system(messages)]]
    instructions = body.get("instructions")
    return [instructions] if isinstance(instructions, str) and instructions else []


def items_of(path: str, body: dict[str, Any]) -> list[Any]:
    """The conversation items after the system prompt."""
    if path == "/v1/messages":
        return list(body.get("messages") or [])
    if path == "/v1/chat/completions":
        messages = body.get("messages") or []
        return list(messages[_leading_system(messages) :])
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return list(items) if isinstance(items, list) else []


def tools_of(body: dict[str, Any]) -> list[Any]:
    tools = body.get("tools")
    return list(tools) if isinstance(tools, list) else []


def append_text(path: str, item: Any, extra: str) -> Any:
    """A copy of `item` with `extra` appended as a last text part (or line)."""
    item = copy.deepcopy(item)
    if not isinstance(item, dict):
        return item
    part = "input_text" if path == "/v1/responses" else "text"
    if item.get("type") == "function_call_output":
        item["output"] = f"{item.get('output', '')}\n\n{extra}"
        return item
    content = item.get("content")
    if isinstance(content, list):
        content.append({"type": part, "text": extra})
    elif isinstance(content, str):
        item["content"] = (
            [{"type": "text", "text": content}, {"type": "text", "text": extra}]
            if path == ("/v1/messages")
            else f"{content}\n\n{extra}"
        )
    else:
        item["content"] = extra
    return item


def build(
    path: str, body: dict[str, Any], tools: list[Any], system: list[str], items: list[Any]
) -> dict[str, Any]:
    """A marker-free body with the given tools, system groups and items."""
    out = {k: v for k, v in body.items() if k != "cache_control"}
    groups = [g for g in system if g]
    if path == "/v1/messages":
        if groups:
            out["system"] = [{"type": "text", "text": g} for g in groups]
        else:
            out.pop("system", None)
        out["messages"] = items
    elif path == "/v1/chat/completions":
        head = body.get("messages") or []
        role = head[0].get("role", "system") if head and _leading_system(head) else "system"
        out["messages"] = ([{"role": role, "content": "\n".join(groups)}] if groups else []) + items
    else:
        if groups:
            out["instructions"] = "\n".join(groups)
        else:
            out.pop("instructions", None)
        out["input"] = items
    if tools:
        out["tools"] = tools
    return strip_markers(out)


# --- the normaliser ---------------------------------------------------------------------


def _line_sets(trace: Trace) -> tuple[list[list[str]], set[str], dict[str, set[str]], list[str]]:
    lines = [[line for t in system_texts(r.path, r.body) for line in t.split("\n")] for r in trace.requests]
    sessions = [session_of(r) for r in trace.requests]
    with_system = [set(ls) for ls in lines if ls]
    shared = set.intersection(*with_system) if with_system else set()
    per_session: dict[str, set[str]] = {}
    for ls, s in zip(lines, sessions, strict=True):
        if ls:
            per_session[s] = per_session[s] & set(ls) if s in per_session else set(ls)
    return lines, shared, per_session, sessions


def stable_forms(trace: Trace) -> list[Forms]:
    """Raw and stable forms of every request of `trace`, in order (module docstring)."""
    lines, shared, per_session, sessions = _line_sets(trace)
    first_tool: dict[bytes, Any] = {}
    history: dict[str, list[tuple[bytes, Any]]] = defaultdict(list)
    out = []
    for request, req_lines, session in zip(trace.requests, lines, sessions, strict=True):
        path, body = request.path, request.body
        for tool in tools_of(body):
            first_tool.setdefault(masked_digest(tool), strip_markers(tool))
        keys = [masked_digest(t) for t in tools_of(body)]
        present = set(keys)
        tools = [t for k, t in first_tool.items() if k in present]
        stable_set = per_session.get(session, set())
        groups = [
            "\n".join(line for line in req_lines if line in shared),
            "\n".join(line for line in req_lines if line in stable_set and line not in shared),
        ]
        volatile = "\n".join(line for line in req_lines if line not in stable_set and line not in shared)
        items = _replayed(path, items_of(path, body), history[session], volatile)
        out.append(
            Forms(
                strip_markers({k: v for k, v in body.items() if k != "cache_control"}),
                build(path, body, tools, groups, items),
            )
        )
    return out


def _replayed(path: str, items: list[Any], sent: list[tuple[bytes, Any]], volatile: str) -> list[Any]:
    """Items with first-sent bytes where unchanged; updates the session's `sent` list."""
    result = []
    intact = True
    for k, item in enumerate(items):
        digest = masked_digest(item)
        if intact and k < len(sent) and sent[k][0] == digest:
            result.append(sent[k][1])
            continue
        intact = False
        del sent[k:]
        value = strip_markers(item)
        if volatile and k == len(items) - 1:
            value = append_text(path, value, volatile)
        sent.append((digest, value))
        result.append(value)
    if intact and volatile and result:
        result[-1] = append_text(path, result[-1], volatile)
    return result
