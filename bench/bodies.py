"""Deterministic request bodies for benchmarks (no randomness: same bytes every run)."""

from __future__ import annotations

from typing import Any

import orjson


def anthropic_body(target_bytes: int) -> dict[str, Any]:
    """An Anthropic Messages body of about `target_bytes` bytes: a system prompt, a few tools
    and a long agent history of text, tool_use and tool_result blocks."""
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are a careful coding agent. " * 40}],
        "tools": [
            {
                "name": f"tool_{i}",
                "description": f"Tool number {i} does a thing. " * 4,
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            }
            for i in range(8)
        ],
        "messages": [{"role": "user", "content": "Start the task."}],
    }
    turn = 0
    while len(orjson.dumps(body)) < target_bytes:
        call_id = f"toolu_{turn:06d}"
        body["messages"].append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {turn}: reading a file."},
                    {"type": "tool_use", "id": call_id, "name": "tool_1", "input": {"path": f"src/f{turn}.py"}},
                ],
            }
        )
        body["messages"].append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call_id, "content": f"line {turn}\n" * 120},
                ],
            }
        )
        turn += 1
    body["messages"].append({"role": "user", "content": "Continue."})
    return body


def small_body() -> dict[str, Any]:
    """About 1 KB."""
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Summarise this paragraph please. " * 28}],
    }
