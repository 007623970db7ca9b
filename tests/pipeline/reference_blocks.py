"""Reference prefix orders: the straightforward body walks `prefix_blocks` was first written as.

Production derives `prefix_blocks` from the adapters' `layout` runs (one definition of the
order); the property tests compare it with these independent walks, so a layout bug cannot
hide behind itself.
"""

from __future__ import annotations

from typing import Any

from proxy.providers.base import Block

RESPONSES_PATH = "/v1/responses"
_SYSTEM_ROLES = frozenset({"system", "developer"})


def _kind(part: Any) -> str:
    if isinstance(part, dict):
        kind = part.get("type")
        if isinstance(kind, str):
            return kind
    return "text" if isinstance(part, str) else "unknown"


def anthropic_blocks(path: str, body: dict[str, Any]) -> list[Block]:
    """Blocks in render order: each tool, each system block, each message content block."""
    blocks: list[Block] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            blocks.append(Block("tools", f"tools[{i}]", "tool", tool))
    system = body.get("system")
    if isinstance(system, str):
        blocks.append(Block("system", "system", "text", system))
    elif isinstance(system, list):
        for i, part in enumerate(system):
            blocks.append(Block("system", f"system[{i}]", _kind(part), part))
    messages = body.get("messages")
    if isinstance(messages, list):
        for m, message in enumerate(messages):
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            role = role if isinstance(role, str) else None
            content = message.get("content")
            if isinstance(content, list):
                for c, part in enumerate(content):
                    path_c = f"messages[{m}].content[{c}]"
                    blocks.append(Block("messages", path_c, _kind(part), part, m, role))
            else:
                blocks.append(Block("messages", f"messages[{m}].content", "text", content, m, role))
    return blocks


def openai_blocks(path: str, body: dict[str, Any]) -> list[Block]:
    """Blocks in render order: each tool, then the head system/developer messages, then
    every other message part (Chat) or input item part (Responses)."""
    blocks: list[Block] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            blocks.append(Block("tools", f"tools[{i}]", "tool", tool))
    if path == RESPONSES_PATH:
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            blocks.append(Block("system", "instructions", "text", instructions))
        items = body.get("input")
        if isinstance(items, str):
            blocks.append(Block("messages", "input", "text", items, 0, "user"))
            return blocks
        array_key = "input"
    else:
        items = body.get("messages")
        array_key = "messages"
    if not isinstance(items, list):
        return blocks
    in_head = True
    for m, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        role = item.get("role")
        role = role if isinstance(role, str) else None
        in_head = in_head and role in _SYSTEM_ROLES
        section: str = "system" if in_head else "messages"
        base = f"{array_key}[{m}]"
        item_type = item.get("type")
        if role is None and isinstance(item_type, str):
            # Responses items such as function_call / function_call_output / reasoning.
            blocks.append(Block(section, base, item_type, item, m, None))
            continue
        content = item.get("content")
        if isinstance(content, list):
            for c, part in enumerate(content):
                blocks.append(Block(section, f"{base}.content[{c}]", _kind(part), part, m, role))
        elif content is not None:
            blocks.append(Block(section, f"{base}.content", "text", content, m, role))
        tool_calls = item.get("tool_calls")
        if isinstance(tool_calls, list):
            for t, call in enumerate(tool_calls):
                blocks.append(Block(section, f"{base}.tool_calls[{t}]", "tool_call", call, m, role))
    return blocks
