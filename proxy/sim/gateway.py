"""An OpenAI-wire gateway serving Claude (LiteLLM, OpenRouter), as the simulator plays it.

A Chat Completions request for a Claude model is translated into a Messages request the way
LiteLLM does it, then judged and accounted by the simulator's Anthropic rules:

- `system` / `developer` messages become `system` text blocks (a string is one block); content
  parts keep their `cache_control`;
- user / assistant content parts become text blocks (`cache_control` kept), assistant
  `tool_calls` become `tool_use` blocks, tools become `{name, description, input_schema}`;
- a `role: tool` message becomes a `tool_result` block in a user turn whose `content` is a copy
  of the message's parts, markers included, so a marker there lands inside
  `tool_result.content`, which the Messages API rejects (docs/provider-rules.md 7);
- usage comes back in Chat shape plus LiteLLM's Anthropic fields: `prompt_tokens` = all input,
  `prompt_tokens_details.cached_tokens` = read, `cache_creation_input_tokens`,
  `cache_read_input_tokens`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, Final

import orjson

from proxy.sim.errors import Rejected

GATEWAYS: Final = frozenset({"litellm", "openrouter"})
CLAUDE_PATTERNS: Final = ("claude*", "*/claude*", "*.anthropic.claude*")


def is_claude(model: str) -> bool:
    return any(fnmatch.fnmatchcase(model, p) for p in CLAUDE_PATTERNS)


def claude_name(model: str) -> str:
    """`anthropic/claude-sonnet-4-6` -> `claude-sonnet-4-6`."""
    tail = model.rpartition("/")[2]
    return tail[tail.find("claude") :] if "claude" in tail else tail


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for part in content or []:
        if isinstance(part, dict) and part.get("type") == "text":
            block = {"type": "text", "text": part.get("text", "")}
            if part.get("cache_control") is not None:
                block["cache_control"] = part["cache_control"]
            blocks.append(block)
    return blocks


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": list(blocks)})


def chat_to_messages(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages body a LiteLLM-style gateway sends for this Chat body; raises `Rejected`."""
    chat = body.get("messages")
    if not isinstance(chat, list) or not chat:
        raise Rejected(400, "messages: Field required")
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for message in chat:
        if not isinstance(message, dict):
            raise Rejected(400, "messages: each message must be an object")
        role, content = message.get("role"), message.get("content")
        if role in ("system", "developer"):
            system.extend(_blocks(content))
        elif role == "user":
            _append(messages, "user", _blocks(content))
        elif role == "assistant":
            blocks = _blocks(content)
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                try:
                    arguments = orjson.loads(function.get("arguments") or "{}")
                except orjson.JSONDecodeError:
                    arguments = {}
                blocks.append(
                    {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": arguments}
                )
            _append(messages, "assistant", blocks)
        elif role == "tool":
            parts = content if isinstance(content, list) else _blocks(content)
            result = {"type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": parts}
            _append(messages, "user", [result])
    out: dict[str, Any] = {"model": claude_name(str(body.get("model"))), "messages": messages}
    out["max_tokens"] = body.get("max_completion_tokens") or body.get("max_tokens") or 4096
    if system:
        out["system"] = system
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        out["tools"] = [
            {
                "name": (t.get("function") or {}).get("name"),
                "description": (t.get("function") or {}).get("description", ""),
                "input_schema": (t.get("function") or {}).get("parameters") or {"type": "object"},
                **({"cache_control": t["cache_control"]} if t.get("cache_control") is not None else {}),
            }
            for t in tools
            if isinstance(t, dict)
        ]
    return out


def chat_usage(anthropic_usage: Mapping[str, Any], out: int) -> dict[str, Any]:
    """LiteLLM's Chat usage for a Claude answer."""
    read = int(anthropic_usage["cache_read_input_tokens"])
    write = int(anthropic_usage["cache_creation_input_tokens"])
    prompt = int(anthropic_usage["input_tokens"]) + read + write
    return {
        "prompt_tokens": prompt,
        "completion_tokens": out,
        "total_tokens": prompt + out,
        "prompt_tokens_details": {"cached_tokens": read},
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
    }
