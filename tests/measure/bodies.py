"""Request bodies for measurement tests: one short tool-using Anthropic conversation and its
variants, one per divergence cause."""

from __future__ import annotations

import copy
from typing import Any

MODEL = "claude-sonnet-4-6"

BASE: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 64,
    "tools": [{"name": "read", "description": "Read a file", "input_schema": {"type": "object"}}],
    "system": [
        {"type": "text", "text": "You are a careful assistant."},
        {"type": "text", "text": "cwd: /home/u/project", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "user", "content": "Open main.py"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "main.py"}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": "print(1)",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ],
}
"""Blocks: 0 tools[0], 1 system[0], 2 system[1] (marker), 3 messages[0].content,
4 messages[1].content[0] (tool_use), 5 messages[2].content[0] (tool_result, marker)."""


def variant(name: str) -> dict[str, Any]:
    """`BASE` changed the way the divergence cause `name` describes (a deep copy)."""
    body = copy.deepcopy(BASE)
    if name == "none":
        body["messages"][2]["content"][0].pop("cache_control")
        body["messages"] += [
            {"role": "assistant", "content": "It prints 1."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}],
            },
        ]
    elif name == "model_changed":
        body["model"] = "claude-opus-4-8"
    elif name == "tools_changed":
        body["tools"][0]["description"] = "Read one file"
    elif name == "params_changed":
        body["tool_choice"] = {"type": "any"}
    elif name in ("system_changed", "system_volatile_text"):
        body["system"][1]["text"] = "cwd: /home/u/other"
    elif name == "messages_changed":
        body["messages"][2]["content"][0]["content"] = "print(2)"
    elif name == "history_rewritten":
        body["messages"][0]["content"] = "Open app.py"
    elif name != "identical":
        raise ValueError(name)
    return body


def record_for(adapter: Any, body: dict[str, Any]) -> Any:
    """The `SessionRecord` the session stage keeps after sending `body` (its adapter's marker
    rules: `proxy.divergence.read_rules`)."""
    from proxy.divergence import marker_positions, params_digest, read_rules
    from proxy.prefix import chain_blocks
    from proxy.store.codec import SessionRecord

    blocks = adapter.prefix_blocks(body)
    chain = chain_blocks(blocks)
    return SessionRecord(
        chain=chain.chain,
        ends=chain.ends,
        model=body["model"],
        params_digest=params_digest(adapter, body),
        breakpoints=marker_positions([b.value for b in blocks], body, read_rules(adapter, body)),
    )
