"""OpenAI prompt token offsets (offline `o200k_base`) and the cache read they predict.

Counting rule (the harmony message format OpenAI documents for its chat models, and OpenAI's
cookbook "How to count tokens with tiktoken": 3 tokens per message plus the role's, 3 to prime
the reply): every message is `<|start|> role [name | tool_call_id] <|message|> content [calls]
<|end|>`; text is `o200k_base`; an image part is `IMAGE_TOKENS` (85 + 4 x 170, a 512x512 high-
detail tile count); any other part, and each tool definition, is the `o200k_base` count of its
JSON; tool definitions are wrapped in two special tokens (their real rendering is not public:
a documented approximation), as is a `json_schema` output format. Responses: `instructions` is
a system message; `function_call` / `custom_tool_call` items are `<call> name arguments <|end|>`;
`function_call_output` items a `tool` message named by `call_id`. Item `id`s are not rendered.

`chat_offsets(body, count, n_blocks)` (Chat Completions) and `responses_offsets(...)`
(Responses) return `PromptOffsets`: the token offset after each block of the adapter's
`prefix_blocks` (same order), after each message's `<|end|>`, and the total with the reply
priming; `None` when the body holds a shape this rule does not cover (the caller falls back to
the bytes/4 estimate).

`predict_read(...)` is OpenAI's cache rule (docs/provider-rules.md 2.1, 2.3) applied to those offsets:
- automatic caching (before GPT-5.6): the longest `min + k * 128` tokens within the prefix the
  previous request shares (its prompt, reply priming included, on a pure append);
- GPT-5.6+ breakpoints: the furthest previous breakpoint inside the shared prefix, explicit
  (offset after the marked part) or, in `implicit` mode (the default), the end of the previous
  request's last user / tool message; nothing below `min`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

IMAGE_TOKENS: Final = 765
STEP_TOKENS: Final = 128
"""Automatic caching hits grow in 128-token steps past the minimum (docs/provider-rules.md 2.1)."""
MESSAGE_OVERHEAD: Final = 3
"""`<|start|>`, `<|message|>`, `<|end|>` around every message (role tokens counted apart)."""
PRIMING: Final = 3
"""`<|start|>assistant<|message|>` after the last message."""
_TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text"})
_IMAGE_PARTS: Final = frozenset({"image_url", "input_image"})
_TURN_ROLES: Final = frozenset({"user", "tool"})

Count = Callable[[str], int]

ESTIMATE_BYTES_PER_TOKEN: Final = 4
"""The proxy's offline estimate when no tokenizer is loaded: UTF-8 bytes / 4, rounded up (as
`proxy.prefix.estimate_tokens` counts canonical bytes)."""


def estimate(text: str) -> int:
    """`Count` of `text` by the bytes/4 estimate (`ESTIMATE_BYTES_PER_TOKEN`)."""
    return -(-len(text.encode()) // ESTIMATE_BYTES_PER_TOKEN)


@dataclass(slots=True)
class PromptOffsets:
    block_ends: list[int] = field(default_factory=list)
    """Token offset just after each prefix block."""
    block_turn_end: list[int | None] = field(default_factory=list)
    """Per block: the offset after its message's `<|end|>` when the block is that user / tool
    message's last block (its implicit breakpoint), else `None`."""
    total: int = 0
    """Prompt tokens, reply priming included."""


class _Walk:
    def __init__(self, count: Count) -> None:
        self.count = count
        self.at = 0
        self.out = PromptOffsets()

    def block(self) -> None:
        self.out.block_ends.append(self.at)
        self.out.block_turn_end.append(None)

    def json(self, value: Any) -> int:
        return self.count(orjson.dumps(value).decode())

    def tools(self, tools: Any) -> None:
        if isinstance(tools, list) and tools:
            self.at += 1
            for tool in tools:
                self.at += self.json(tool)
                self.block()
            self.at += 1

    def schema(self, fmt: Any) -> None:
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            self.at += 2 + self.json(fmt)

    def open(self, role: str, name: Any = None) -> int:
        """Start a message; returns the block count at its start."""
        self.at += 2 + self.count(role) + (self.count(name) if isinstance(name, str) and name else 0)
        return len(self.out.block_ends)

    def close(self, role: str, first_block: int) -> None:
        self.at += 1
        if role in _TURN_ROLES and len(self.out.block_ends) > first_block:
            self.out.block_turn_end[-1] = self.at

    def part(self, part: dict[str, Any]) -> None:
        kind = part.get("type")
        if type(kind) is not str:  # a malformed part type: counted as its JSON
            kind = None
        if kind in _TEXT_PARTS:
            self.at += self.count(str(part.get("text", "")))
        elif kind == "refusal":
            self.at += self.count(str(part.get("refusal", "")))
        elif kind in _IMAGE_PARTS:
            self.at += IMAGE_TOKENS
        else:
            self.at += self.json({k: v for k, v in part.items() if k != "prompt_cache_breakpoint"})
        self.block()

    def content(self, content: Any) -> bool:
        if isinstance(content, str):
            if content:
                self.at += self.count(content)
                self.block()
            return True
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    return False
                self.part(part)
            return True
        return content is None

    def call(self, name: Any, arguments: Any) -> None:
        self.at += 1 + self.count(str(name or "")) + self.count(str(arguments or ""))
        self.block()


def _chat(walk: _Walk, body: dict[str, Any]) -> bool:
    walk.tools(body.get("tools"))
    walk.schema(body.get("response_format"))
    for message in body.get("messages") or []:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return False
        role = message["role"]
        first = walk.open(role, message.get("name") or message.get("tool_call_id"))
        if not walk.content(message.get("content")):
            return False
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            walk.call(function.get("name"), function.get("arguments"))
        walk.close(role, first)
    return True


def _responses(walk: _Walk, body: dict[str, Any]) -> bool:
    walk.tools(body.get("tools"))
    text = body.get("text")
    walk.schema(text.get("format") if isinstance(text, dict) else None)
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        first = walk.open("system")
        walk.at += walk.count(instructions)
        walk.block()
        walk.close("system", first)
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            return False
        kind = item.get("type", "message")
        if kind == "message" and isinstance(item.get("role"), str):
            role = item["role"]
            first = walk.open(role)
            if not walk.content(item.get("content")):
                return False
            walk.close(role, first)
        elif kind in ("function_call", "custom_tool_call"):
            walk.call(item.get("name"), item.get("arguments" if kind == "function_call" else "input"))
            walk.at += 1
        elif kind in ("function_call_output", "custom_tool_call_output"):
            first = walk.open("tool", str(item.get("call_id", "")))
            output = item.get("output")
            walk.at += walk.count(output) if isinstance(output, str) else walk.json(output)
            walk.block()
            walk.close("tool", first)
        else:
            return False
    return True


def _offsets(
    rule: Callable[[_Walk, dict[str, Any]], bool], body: dict[str, Any], count: Count, n_blocks: int
) -> PromptOffsets | None:
    walk = _Walk(count)
    if not rule(walk, body) or len(walk.out.block_ends) != n_blocks:
        return None
    walk.out.total = walk.at + PRIMING
    return walk.out


def chat_offsets(body: dict[str, Any], count: Count, n_blocks: int) -> PromptOffsets | None:
    """Token offsets of a Chat Completions `body` (see the module docstring); `None` when its
    shape is not covered or the walk does not yield `n_blocks` blocks (the adapter's prefix blocks)."""
    return _offsets(_chat, body, count, n_blocks)


def responses_offsets(body: dict[str, Any], count: Count, n_blocks: int) -> PromptOffsets | None:
    """Token offsets of a Responses `body` (`instructions` first, items as the module docstring
    renders them); `None` as `chat_offsets`."""
    return _offsets(_responses, body, count, n_blocks)


def predict_read(
    offsets: PromptOffsets,
    *,
    shared: int,
    previous_blocks: int,
    previous_breakpoints: Sequence[int],
    min_tokens: int,
    has_breakpoints: bool,
    implicit: bool,
) -> tuple[int | None, int]:
    """`(block, tokens)` the current request should read from the previous one's cache entries
    (see the module docstring); `(None, 0)` when nothing is due."""
    reach = min(shared, previous_blocks)
    if reach <= 0:
        return None, 0
    if not has_breakpoints:
        if reach == previous_blocks:  # the whole previous prompt, its reply priming included
            common = _closed_offset(offsets, reach - 1) + PRIMING
        else:  # diverged inside: what is known to be shared
            common = offsets.block_ends[reach - 1]
        if common < min_tokens:
            return None, 0
        return reach - 1, min_tokens + (common - min_tokens) // STEP_TOKENS * STEP_TOKENS
    best: tuple[int | None, int] = (None, 0)
    for b in previous_breakpoints:
        if 0 <= b < reach and offsets.block_ends[b] >= max(best[1], min_tokens):
            best = (b, offsets.block_ends[b])
    if implicit:
        last_turn = max((b for b in range(reach) if offsets.block_turn_end[b] is not None), default=None)
        if last_turn is not None:
            end = offsets.block_turn_end[last_turn]
            if end is not None and end >= max(best[1], min_tokens):
                best = (last_turn, end)
    return best


def _closed_offset(offsets: PromptOffsets, block: int) -> int:
    """Offset after the `<|end|>` of the message holding `block` (its last block): the next
    block's start is not known here, so the turn end when recorded, else the block end + 1."""
    turn_end = offsets.block_turn_end[block]
    return turn_end if turn_end is not None else offsets.block_ends[block] + 1
