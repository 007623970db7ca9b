"""Anthropic Messages, request side: marker policy, layout, and system/tool rewriters.

The pure functions behind `AnthropicMessagesAdapter`'s request-side methods (the adapter delegates
here). Every rewriter is copy-on-write: new containers along the changed path, the caller's
objects untouched.

Provider rules (platform.claude.com/docs/en/build-with-claude/prompt-caching; docs/provider-rules.md):

- a marker is `cache_control: {"type": "ephemeral"}`, optionally with `ttl` `5m` | `1h`; a bare
  marker is 5m (1.2). At most 4 per request, the top-level automatic one included (1.1, 1.4);
- markers are allowed on tool definitions, system text blocks and message content blocks (1.3),
  rejected on `thinking` / `redacted_thinking`, on empty text, and inside `tool_result.content`
  (1.3, section 7: the fix is the `tool_result` block itself), and on a `tool_use` called by
  the code-execution tool (`caller.type` `code_execution_...`) or its `tool_result`: those are
  not rendered in the model's context (1.3, programmatic tool calling);
- a read walks back 20 positions from a breakpoint, counting the breakpoint; a run of consecutive
  `tool_use` blocks is one position, and so is a run of `tool_result` blocks (1.5);
- `system` is a string or a list of text blocks; only list blocks carry markers (1.2);
- in a user message answering tool calls the `tool_result` blocks come first (tool-use guide:
  "tool_result blocks must come FIRST in the content array"), so inserted text goes after them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import compress, count
from operator import is_not
from typing import Any, Final

from proxy.providers.base import HiddenCalls, JSONObject, MarkerPolicy, Run, SystemPart, SystemUnit, ToolShape

MARKER_KEY: Final = "cache_control"

POLICY: Final = MarkerPolicy(
    key=MARKER_KEY,
    max_markers=4,
    kinds=frozenset(
        {
            "tool",
            "text",
            "image",
            "document",
            "search_result",
            "tool_use",
            "tool_result",
            "server_tool_use",
            "web_search_tool_result",
            "web_fetch_tool_result",
            "code_execution_tool_result",
            "bash_code_execution_tool_result",
            "text_editor_code_execution_tool_result",
            "container_upload",
            "tool_reference",
            "mcp_tool_use",
            "mcp_tool_result",
        }
    ),
    forbidden_kinds=frozenset({"thinking", "redacted_thinking"}),
    text_kinds=frozenset({"text"}),
    nested_kinds=frozenset({"tool_result"}),
    tool_kinds=frozenset({"tool_result"}),
    lookback=20,
    run_kinds=frozenset({"tool_use", "tool_result"}),
    has_ttl=True,
    template=(("type", "ephemeral"),),
    top_level_key=MARKER_KEY,
    hidden_calls=HiddenCalls("code_execution"),
)

TOOL_SHAPE: Final = ToolShape(name_path=("name",), schema_path=("input_schema",), call_kinds=frozenset({"tool_use"}))
PREFIX_KEYS: Final = ("tools", "system", "messages")


def layout(body: JSONObject) -> list[Run]:
    """Runs in render order; flattened they are `AnthropicMessagesAdapter.prefix_blocks`."""
    runs: list[Run] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        runs.append(Run("tools", ("tools",), tools, True, "tool"))
    system = body.get("system")
    if isinstance(system, str):
        runs.append(Run("system", ("system",), system, False, "text"))
    elif isinstance(system, list):
        runs.append(Run("system", ("system",), system, True))
    messages = body.get("messages")
    if isinstance(messages, list):
        runs.extend(_message_runs(messages))
    return runs


def relayout(key: str, value: Any, previous: Any, runs: list[Run]) -> tuple[list[Run], int] | None:
    """`layout({key: value})` given `runs == layout({key: previous})`, and how many leading
    runs are `runs`' own: a message's run depends only on the message and its index, so the
    runs of the messages `value` shares with `previous` (the same objects at the same
    positions: bodies are copy-on-write) are reused and only the others are laid out. `None`
    (lay out from scratch) for other keys, when a previous message was not an object (runs and
    messages would not line up), or when most of many messages changed."""
    if key != "messages" or type(value) is not list or type(previous) is not list or len(runs) != len(previous):
        return None
    shared = min(len(value), len(previous))
    changed = list(compress(count(), map(is_not, value, previous)))
    if len(changed) > 8 and len(changed) * 4 > shared:
        return None
    out = runs[:shared]
    for m in changed:
        message = value[m]
        if not isinstance(message, dict):
            return None
        out[m] = _message_run(m, message)
    if len(value) > shared:
        out.extend(_message_runs(value, shared))
    return out, changed[0] if changed else shared


_RUN_FIELDS: Final = ("section", "key", "value", "is_list", "kind", "role", "message")
if tuple(f.name for f in dataclasses.fields(Run)) != _RUN_FIELDS:  # _message_run sets each one
    raise RuntimeError(f"Run fields changed: update _message_run ({_RUN_FIELDS})")
_KEYS: Final = tuple(("messages", m, "content") for m in range(1024))
"""`Run.key` of message `m`'s content, shared (tuples are immutable; no content in them)."""
_new = object.__new__


def _message_run(m: int, message: JSONObject) -> Run:
    """The run of message `m` (built without the dataclass `__init__`: `layout` makes one per
    message, ~300 ns each with `Run(...)`)."""
    role = message.get("role")
    if type(role) is not str:
        role = role if isinstance(role, str) else None
    content = message.get("content")
    run = _new(Run)
    run.section = "messages"
    run.key = _KEYS[m] if m < len(_KEYS) else ("messages", m, "content")
    run.value = content
    if type(content) is list or isinstance(content, list):
        run.is_list = True
        run.kind = None
    else:
        run.is_list = False
        run.kind = "text"
    run.role = role
    run.message = m
    return run


def _message_runs(messages: list[Any], start: int = 0) -> list[Run]:
    """The runs of `messages[start:]` (the hot loop of `layout`; `_message_run` inlined)."""
    runs: list[Run] = []
    append = runs.append
    keys = _KEYS if len(messages) <= len(_KEYS) else [("messages", m, "content") for m in range(len(messages))]
    m = start - 1
    for message in messages[start:] if start else messages:
        m += 1
        if type(message) is not dict and not isinstance(message, dict):
            continue
        role = message.get("role")
        if type(role) is not str:
            role = role if isinstance(role, str) else None
        content = message.get("content")
        run = _new(Run)
        run.section = "messages"
        run.key = keys[m]
        run.value = content
        if type(content) is list or isinstance(content, list):
            run.is_list = True
            run.kind = None
        else:
            run.is_list = False
            run.kind = "text"
        run.role = role
        run.message = m
        append(run)
    return runs


def as_block_list(run: Run) -> tuple[Any, tuple[str | int, ...]] | None:
    """A string `system` or string message content as `[{"type": "text", "text": ...}]`."""
    if run.is_list or not isinstance(run.value, str):
        return None
    return [{"type": "text", "text": run.value}], (0,)


def system_units(body: JSONObject) -> list[SystemUnit]:
    """One unit per system block: the string, or each element of the list."""
    system = body.get("system")
    if isinstance(system, str):
        return [SystemUnit(system)]
    if not isinstance(system, list):
        return []
    units = []
    for part in system:
        if isinstance(part, dict):
            text = part.get("text")
            is_text = part.get("type") == "text" and isinstance(text, str)
            units.append(SystemUnit(text if is_text else None, part.get(MARKER_KEY)))
        else:
            units.append(SystemUnit(None))
    return units


def _text_block(text: str, marker: Any) -> JSONObject:
    block: JSONObject = {"type": "text", "text": text}
    if marker is not None:
        block[MARKER_KEY] = marker
    return block


def _piece(source: Any, part: SystemPart) -> Any:
    if part.whole:
        return source
    block = {k: v for k, v in source.items() if k != MARKER_KEY}
    block["text"] = part.text
    if part.marker is not None:
        block[MARKER_KEY] = part.marker
    return block


def with_system(body: JSONObject, parts: Sequence[SystemPart]) -> JSONObject:
    """`body` with `system` rebuilt from `parts`; a string stays a string when it stays one
    unmarked piece; no part left removes the key."""
    system = body.get("system")
    if not parts:
        return {k: v for k, v in body.items() if k != "system"}
    if isinstance(system, str):
        if len(parts) == 1 and parts[0].marker is None:
            return {**body, "system": parts[0].text}
        return {**body, "system": [_text_block(p.text, p.marker) for p in parts]}
    if not isinstance(system, list):
        return body
    return {**body, "system": [_piece(system[p.source], p) for p in parts]}


def with_user_text(body: JSONObject, texts: Sequence[str]) -> JSONObject | None:
    """`texts` as text blocks at the head of the newest user message, after its leading
    `tool_result` blocks; `None` without a user message."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for m in range(len(messages) - 1, -1, -1):
        message = messages[m]
        if isinstance(message, dict) and message.get("role") == "user":
            break
    else:
        return None
    blocks = [{"type": "text", "text": text} for text in texts]
    content = message.get("content")
    if isinstance(content, str):
        new_content = [*blocks, {"type": "text", "text": content}] if content else blocks
    elif isinstance(content, list):
        head = 0
        while head < len(content) and isinstance(content[head], dict):
            if content[head].get("type") != "tool_result":
                break
            head += 1
        new_content = [*content[:head], *blocks, *content[head:]]
    else:
        return None
    new_messages = list(messages)
    new_messages[m] = {**message, "content": new_content}
    return {**body, "messages": new_messages}


PING_TEXT: Final = "."
"""The user turn a cut prefix ends with when its last kept message is not the user's (one or
two tokens, uncached)."""
_CALL_KINDS: Final = frozenset({"tool_use", "server_tool_use"})
_RESULT_KINDS: Final = frozenset({"tool_result"})


def prefix_request(body: JSONObject, last: int) -> JSONObject | None:
    """A request carrying `body`'s prefix up to prefix block `last` (its last marker) and
    nothing after it: the messages after the one holding `last` dropped, that message's content
    cut after the block, and, when the cut leaves a message other than the user's last, a
    one-token user turn (`PING_TEXT`) so the request still asks for an answer. The kept blocks
    are the same objects, so their bytes (and the cache entry they hash to) are the ones sent.

    `body` itself when nothing follows `last`; `None` (send the body whole) when `last` is not
    in the messages, or when the cut would orphan a tool call from its result (a kept
    `tool_use` whose `tool_result` is dropped, or a dropped `tool_result` whose call is kept:
    both 400 on the API, tool-use guide)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    start = 0
    for run in layout(body):
        size = len(run)
        if last < start + size:
            break
        start += size
    else:
        return None
    m = run.message
    if run.section != "messages" or m is None:
        return None
    message = messages[m]
    content = message.get("content")
    kept: Any = content
    cut_content = False
    if run.is_list and isinstance(content, list):
        pos = last - start
        kept, dropped = content[: pos + 1], content[pos + 1 :]
        cut_content = bool(dropped)
        if any(isinstance(b, dict) and b.get("type") in _RESULT_KINDS for b in dropped):
            return None
    if m == len(messages) - 1 and not cut_content:
        return body
    role = message.get("role")
    if role != "user" and isinstance(kept, list):
        if any(isinstance(b, dict) and b.get("type") in _CALL_KINDS for b in kept):
            return None
    new_messages = [*messages[:m], {**message, "content": kept} if cut_content else message]
    if role != "user":
        new_messages.append({"role": "user", "content": PING_TEXT})
    return {**body, "messages": new_messages}
