"""Anthropic Messages response shapes: the JSON body and the SSE event sequence.

Contract (docs/provider-rules.md 1.10; platform.claude.com/docs/en/build-with-claude/streaming):
- `message_body` is a `Message` as the official SDK parses it: `id`, `type`, `role`, `model`,
  `content`, `stop_reason`, `stop_sequence`, `usage` (input side from the cache plan).
- `sse_events` yields `event: NAME` / `data: JSON` frames in the standard order: `message_start`
  (usage with the input side and a placeholder `output_tokens: 1`), `content_block_start`, `ping`,
  `content_block_delta`..., `content_block_stop`, `message_delta` (cumulative usage: final
  `output_tokens` plus the input-side counters repeated), `message_stop`.
- Streamed and non-streamed usage carry the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from proxy.sim.anthropic import Usage
from proxy.sim.replies import Conversation, Reply, functions
from proxy.sim.tokens import TokenCounter


def conversation(body: Mapping[str, Any]) -> Conversation:
    """Reply-relevant facts of a Messages request.

    The last user-authored text is read from the last message after skipping trailing
    `role: system` messages: a mid-conversation system instruction (docs/provider-rules.md 1.8; Claude Code
    appends its environment this way on a session's first turn) is not the user speaking and
    carries no tool results. A user message with `tool_result` blocks, or an assistant message
    last (prefill), gives no text, so the marker rules do not fire.
    """
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    turns = sum(1 for m in messages if m.get("role") == "user")
    names = (str(t["name"]) for t in body.get("tools") or [] if isinstance(t, dict) and "name" in t)
    tools = functions(*names)
    while messages and messages[-1].get("role") == "system":
        messages.pop()
    last_text: str | None = None
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "user":
        content = last.get("content")
        if isinstance(content, str):
            last_text = content
        elif isinstance(content, list) and not any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        ):
            last_text = "\n".join(
                str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
            )
    return Conversation(turns, tools, last_text)


def content_blocks(reply: Reply, tool_id: str) -> list[dict[str, Any]]:
    if reply.tool_call is not None:
        call = reply.tool_call
        value = call.input if isinstance(call.input, dict) else {}
        return [{"type": "tool_use", "id": tool_id, "name": call.name, "input": value}]
    return [{"type": "text", "text": reply.text or ""}]


def output_tokens(reply: Reply, counter: TokenCounter) -> int:
    """Output tokens: the text, or the tool name plus the JSON input."""
    if reply.tool_call is not None:
        return counter.count(reply.tool_call.name) + counter.count(reply.tool_call.arguments)
    return counter.count(reply.text or "")


def stop_reason(reply: Reply) -> str:
    return "tool_use" if reply.tool_call is not None else "end_turn"


def message_body(
    msg_id: str, model: str, content: list[dict[str, Any]], stop: str, usage: Usage, out_tokens: int
) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage.as_dict(out_tokens),
    }


def _frame(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def stream_events(
    msg_id: str, model: str, content: list[dict[str, Any]], stop: str, usage: Usage, out_tokens: int
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events of a streamed reply as `(name, data)`, in order."""
    start = message_body(msg_id, model, [], stop, usage, 1)
    start["stop_reason"] = None
    yield ("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(content):
        if block["type"] == "tool_use":
            empty = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}]
        else:
            empty = {"type": "text", "text": ""}
            text = str(block["text"])
            cut = text.find(" ", len(text) // 2)
            parts = [text] if cut < 0 else [text[:cut], text[cut:]]
            deltas = [{"type": "text_delta", "text": p} for p in parts]
        yield ("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty})
        if index == 0:
            yield ("ping", {"type": "ping"})
        for delta in deltas:
            yield ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield ("content_block_stop", {"type": "content_block_stop", "index": index})
    final = usage.as_dict(out_tokens)
    delta_usage = {
        "input_tokens": final["input_tokens"],
        "cache_creation_input_tokens": final["cache_creation_input_tokens"],
        "cache_read_input_tokens": final["cache_read_input_tokens"],
        "output_tokens": out_tokens,
    }
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": delta_usage,
        },
    )
    yield ("message_stop", {"type": "message_stop"})


def sse_events(
    msg_id: str, model: str, content: list[dict[str, Any]], stop: str, usage: Usage, out_tokens: int
) -> Iterator[bytes]:
    """The SSE frames of a streamed reply."""
    for name, data in stream_events(msg_id, model, content, stop, usage, out_tokens):
        yield _frame(name, data)
