"""nulls: an explicit `null` of an optional field is the field absent (pure core).

The official SDKs write a stored reply with `model_dump()` and so with every optional field the
reply did not have as an explicit null: anthropic 2.16 `TextBlock.model_dump()` is
`{"citations": None, "text": ..., "type": "text"}` (`ToolUseBlock` adds `caller` and
`toolset_name`), openai 3.57 `ChatCompletionMessage.model_dump()` adds `refusal`, `annotations`,
`audio`, `function_call` and `tool_calls`, a Responses output item `status`, `phase`, `caller`,
`namespace`, its `output_text` part `logprobs`. The APIs read such a field as not given: the SDK
request types declare these fields optional and nullable (`TextBlockParam.citations:
Optional[...]`, `ChatCompletionAssistantMessageParam.refusal / audio / function_call:
Optional[...]`, a Responses item's `caller`, `encrypted_content`, `phase`), the request is
validated into the same typed message, and the prompt the model reads (what a cache hit needs
to be identical: docs/provider-rules.md 1.5, 2.1) is rendered from that message, not from the
JSON text. docs/provider-rules.md itself says nothing of explicit nulls. So a
conversation re-sent in the `model_dump()` form after one sent as plain dicts (or the other way
round) is the same conversation, not a person's edit of its history.

Only two levels are such fields: the keys of a message (or a Responses input item) and the keys
of each block of the lists the adapter names (`NullAbsent.block_lists`: `content`). Below them a
null is user data: a tool call's `input` (`{"x": null}` is what the model called the tool with),
a JSON schema, a tool result's own payload. A null-valued key at those two levels is left out;
everything else is the value as it was. A null `type` or `role` (`VALUES`) is a value.

- `has_nulls(message, rule)`: whether `without_nulls` would leave anything out: a look at the
  two levels' values (~0.3-0.5 us a message of one block on these machines, whatever its size;
  searching its bytes for `:null` costs ~1 ns a byte).
- `without_nulls(message, rule)`: the message without its null-valued keys and those of its
  blocks; the very object when it has none (callers test `is`).
- `block_without_nulls(block)`: one block (an object) without its null-valued keys; itself when
  none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

VALUES: Final = frozenset({"type", "role"})
"""Keys whose null is a value, never the key absent: the discriminators. The SDK types declare
them literals, never nullable (no `model_dump()` writes them null), and an item without them is
something else than one with a null: a Responses input item without `type` is a message, one
whose `type` is null is not (the simulator renders it as an item of another kind). Reading such
a null as absent let replay send the earlier message's bytes for it (attack pass, session 16)."""


def _absent(key: Any, value: Any) -> bool:
    return value is None and key not in VALUES


@dataclass(frozen=True, slots=True)
class NullAbsent:
    """Where an adapter's API reads an explicit null as the field absent (module docstring):
    the keys of a message (or input item), and the keys of each object in the message's lists
    named here. `ProviderAdapter.identity_nulls`; `None` there: every null is part of the value."""

    block_lists: tuple[str, ...] = ("content",)
    """Message keys whose list holds blocks (`content`): a block's null-valued key is absent too."""


def has_nulls(message: Any, rule: NullAbsent) -> bool:
    """Whether `without_nulls(message, rule)` is not `message` itself: an object with a
    null-valued key, or one of its `rule.block_lists` lists holding an object with one."""
    return without_nulls(message, rule) is not message


def block_without_nulls(block: Any) -> Any:
    """`block` (a JSON value) without its null-valued keys when it is an object holding any;
    else `block` itself (the same object). Never mutates `block`."""
    if type(block) is not dict or None not in block.values() or not any(_absent(k, v) for k, v in block.items()):
        return block
    return {k: v for k, v in block.items() if not _absent(k, v)}


def without_nulls(message: Any, rule: NullAbsent) -> Any:
    """`message` without its null-valued keys and without those of each object in its
    `rule.block_lists` lists; `message` itself (the same object) when there are none, with
    nothing allocated. A value that is not an object is returned as is. Copy-on-write:
    containers that change are new, the rest (every value below the two levels) are the same
    objects."""
    if type(message) is not dict:
        return message
    out = block_without_nulls(message)
    for key in rule.block_lists:
        blocks = message.get(key)
        if type(blocks) is not list:
            continue
        for at, block in enumerate(blocks):
            if block_without_nulls(block) is not block:
                if out is message:
                    out = dict(message)
                out[key] = [*blocks[:at], *map(block_without_nulls, blocks[at:])]
                break
    return out
