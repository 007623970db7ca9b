"""The pipeline budget: a request too large to optimise without stalling everyone else.

The stages after `parse` (session inference, the prompt scan, replay masking, the measurement
and the session record on the response side) cost time in proportion to the body's bytes and
blocks, on the one event loop every tenant shares: 100,000 Chat messages (5.9 MB) took the
session stage 1.4 s and the measurement 1.8 s, during which `/healthz` and every other request
waited. A body over either budget skips them: its bytes go upstream exactly as the client sent
them (fail open), its usage is still counted, and nothing is measured, stored or replayed for
it. Counted in `promptcache_pipeline_budget_exceeded_total{kind}` (`bytes`, `blocks`,
`nodes`); the
reason is on `Exchange.over_budget` and in the caller's `/debug/tenants` (`over_budget`,
`last_over_budget`).

Blocks are counted from the parsed body without knowing the provider: each item of a top-level
list (messages, input items, tools, system blocks) and each item of such an item's `content`
list. Pure and O(items).

Nodes are the JSON objects and arrays at any depth, bounded from the raw bytes before parsing:
the count of `{` and `[` characters (those inside strings count too, so the bound errs towards
skipping). Parsing and walking what lies below the blocks (tool inputs and schemas, nested tool
results) costs in proportion to them: a 6.7 MB body of three blocks holding 200,000 small
objects took `orjson.loads` 120-440 ms and the stages ~1 s (adversarial review, session 4). The
bytes and nodes budgets are checked on the raw body, so a body over them is not even parsed;
the blocks budget needs the parsed body.

Values bound the scalars too: every array item and object member after the first follows a
`,`, so `,` plus `{` plus `[` bounds the JSON values from above (commas in text count too: about
one per 30 bytes of the recorded traces, so 250,000 is ~7 MB of text, past any model's context).
A 7.8 MB tool input of 3.9M integers has 11 nodes and held `/healthz` up to ~1 s (adversarial
review, session 4).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, Final

KINDS: Final = ("bytes", "blocks", "nodes", "values")
"""`kind` label of `promptcache_pipeline_budget_exceeded_total`."""


def count_blocks(body: Any) -> int:
    """Items of the body's top-level lists plus the items of their `content` lists."""
    if not isinstance(body, dict):
        return 0
    total = 0
    for value in body.values():
        if not isinstance(value, list):
            continue
        total += len(value)
        for item in value:
            if isinstance(item, dict):
                content = item.get("content")
                if isinstance(content, list):
                    total += len(content)
    return total


def block_counts(items: Sequence[Any], known: Sequence[int] = (), reuse: int = 0) -> array[int]:
    """Cumulative `count_blocks` share of `items` (one top-level list): after item `i`, the
    items `0..i` plus the items of their `content` lists. The first `reuse` entries are taken
    from `known` (the same leading items, counted for an earlier body: `proxy.pipeline.rawprefix`
    reuses its elements as the very objects, never edited), so only the rest are walked."""
    reuse = min(reuse, len(known), len(items))
    out: array[int] = array("q", known[:reuse])
    total = out[-1] if reuse else 0
    append = out.append
    for item in items[reuse:] if reuse else items:
        total += 1
        if type(item) is dict:
            content = item.get("content")
            if type(content) is list:
                total += len(content)
        elif isinstance(item, dict):
            content = item.get("content")
            if isinstance(content, list):
                total += len(content)
        append(total)
    return out


def counted_blocks(
    body: dict[str, Any], array_key: str | None = None, known: Sequence[int] = (), reuse: int = 0
) -> tuple[int, array[int] | None]:
    """`(count_blocks(body), block_counts of body[array_key])`: the array's leading `reuse`
    items counted from `known` (`block_counts`); the array's counts are `None` when it is not
    a list (or `array_key` is `None`)."""
    total = 0
    counts: array[int] | None = None
    for key, value in body.items():
        if not isinstance(value, list):
            continue
        if key == array_key:
            counts = block_counts(value, known, reuse)
            total += counts[-1] if counts else 0
        else:
            total += count_blocks({key: value})
    return total, counts


def raw_over_budget(
    raw: bytes, max_bytes: int, max_nodes: int, max_values: int, counted: tuple[int, int] | None = None
) -> tuple[str, str] | None:
    """`(kind, reason)` when the client's body bytes `raw` are over the bytes, nodes or values
    budget, else `None`. Memory speed (three `bytes.count` scans), before any parsing;
    `counted`: the nodes and values counts of `raw` when the caller has them
    (`proxy.pipeline.rawprefix.chunk_counts`: an appended turn counts its new bytes only)."""
    if len(raw) > max_bytes:
        return "bytes", f"body of {len(raw)} bytes is over pipeline_budget_bytes ({max_bytes})"
    brackets = raw.count(b"{") + raw.count(b"[") if counted is None else counted[0]
    if brackets > max_nodes:
        return "nodes", f"body of {brackets} '{{' and '[' is over pipeline_budget_nodes ({max_nodes})"
    values = brackets + raw.count(b",") if counted is None else counted[1]
    if values > max_values:
        return "values", f"body of {values} ',', '{{' and '[' is over pipeline_budget_values ({max_values})"
    return None


def blocks_over_budget(body: Any, max_blocks: int, blocks: int | None = None) -> tuple[str, str] | None:
    """`(kind, reason)` when the parsed `body` has more than `max_blocks` blocks, else `None`;
    `blocks`: `count_blocks(body)` when the caller has it (`counted_blocks`)."""
    if blocks is None:
        blocks = count_blocks(body)
    if blocks > max_blocks:
        return "blocks", f"body of {blocks} blocks is over pipeline_budget_blocks ({max_blocks})"
    return None
