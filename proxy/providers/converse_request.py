"""Bedrock Converse, request side: the prefix layout and `cachePoint` placement (pure).

Converse marks a cache checkpoint with a block of its own, `{"cachePoint": {"type": "default"}}`,
placed after the content to cache in `toolConfig.tools[]`, `system[]` or a message's
`content[]` (AWS prompt-caching guide; docs/provider-rules.md 4, 7):

- at most 4 checkpoints per request (Claude models);
- a checkpoint is a sibling after a `toolResult`, never inside `toolResult.content`;
- a message holding only a checkpoint is rejected (ValidationException), so a checkpoint always
  follows a content block of its own message;
- `ttl` (`5m` | `1h`) only where the model offers it, else removed;
- the minimum is per model and counted on the cumulative prefix (tools, system, messages).

`place_cache_points(body, min_tokens, keep_ttl)` keeps the client's legal checkpoints, moves one
nested in a `toolResult` after it, drops a leading one (it marks nothing), and adds checkpoints
after the last tool, the last system block and the newest message's last block where the prefix
reaches `min_tokens` (estimated as UTF-8 bytes / 4). With more than 4 it keeps the newest
message's checkpoint and then the latest others. Idempotent, copy-on-write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.providers.base import JSONObject, Run

CACHE_POINT: Final = "cachePoint"
MAX_POINTS: Final = 4
PREFIX_KEYS: Final = ("toolConfig", "system", "messages")
_NO_POINT_AFTER: Final = frozenset({"reasoningContent"})


def is_point(block: Any) -> bool:
    return isinstance(block, dict) and CACHE_POINT in block


def layout(body: JSONObject) -> list[Run]:
    """Runs in render order: tools, system blocks, then each message's content."""
    runs: list[Run] = []
    config = body.get("toolConfig")
    tools = config.get("tools") if isinstance(config, dict) else None
    if isinstance(tools, list):
        runs.append(Run("tools", ("toolConfig", "tools"), tools, True, "tool"))
    system = body.get("system")
    if isinstance(system, list):
        runs.append(Run("system", ("system",), system, True))
    messages = body.get("messages")
    if isinstance(messages, list):
        for m, message in enumerate(messages):
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            content = message.get("content")
            if isinstance(content, list):
                runs.append(Run("messages", ("messages", m, "content"), content, True, None, role, m))
    return runs


@dataclass(slots=True)
class _Container:
    key: tuple[str | int, ...]
    blocks: list[Any]
    """Content blocks without checkpoints (a nested one hoisted after its toolResult)."""
    points: dict[int, Any]
    """Block index -> the checkpoint value after it (client's)."""
    changed: bool = False


def _split(key: tuple[str | int, ...], items: list[Any]) -> _Container:
    blocks: list[Any] = []
    points: dict[int, Any] = {}
    changed = False
    for item in items:
        if is_point(item):
            if blocks:
                changed = changed or len(blocks) - 1 in points  # a second one after one block
                points[len(blocks) - 1] = item[CACHE_POINT]
            else:
                changed = True  # a leading checkpoint marks nothing
            continue
        result = item.get("toolResult") if isinstance(item, dict) else None
        inner = result.get("content") if isinstance(result, dict) else None
        if isinstance(result, dict) and isinstance(inner, list) and any(is_point(p) for p in inner):
            nested = [p for p in inner if is_point(p)]
            item = {**item, "toolResult": {**result, "content": [p for p in inner if not is_point(p)]}}
            points[len(blocks)] = nested[-1][CACHE_POINT]
            changed = True
        blocks.append(item)
    return _Container(key, blocks, points, changed)


def _tokens(block: Any) -> int:
    return (len(orjson.dumps(block)) + 3) // 4


def place_cache_points(body: JSONObject, min_tokens: int, keep_ttl: bool) -> JSONObject:
    """`body` with its checkpoints placed (see the module docstring); `body` itself if unchanged."""
    containers: list[_Container] = []
    config = body.get("toolConfig")
    if isinstance(config, dict) and isinstance(config.get("tools"), list):
        containers.append(_split(("toolConfig", "tools"), config["tools"]))
    if isinstance(body.get("system"), list):
        containers.append(_split(("system",), body["system"]))
    messages = body.get("messages")
    if isinstance(messages, list):
        for m, message in enumerate(messages):
            if isinstance(message, dict) and isinstance(message.get("content"), list):
                containers.append(_split(("messages", m, "content"), message["content"]))
    # every candidate position in render order: (container, block index, cumulative tokens)
    total = 0
    ends: list[tuple[int, int, int]] = []
    for c, container in enumerate(containers):
        for b, block in enumerate(container.blocks):
            total += _tokens(block)
            if b == len(container.blocks) - 1:
                ends.append((c, b, total))
    chosen: dict[tuple[int, int], Any] = {}
    order: list[tuple[int, int]] = []
    for c, container in enumerate(containers):
        for b in sorted(container.points):
            chosen[(c, b)] = container.points[b]
            order.append((c, b))
    wanted: list[tuple[int, int]] = []
    last_tools = next((e for e in ends if containers[e[0]].key[0] == "toolConfig"), None)
    last_system = next((e for e in ends if containers[e[0]].key == ("system",)), None)
    newest = ends[-1] if ends and containers[ends[-1][0]].key[0] == "messages" else None
    for end in (last_tools, last_system, newest):
        if end is None or end[2] < min_tokens:
            continue
        c, b, _ = end
        block = containers[c].blocks[b]
        if isinstance(block, dict) and set(block) & _NO_POINT_AFTER:
            continue
        wanted.append((c, b))
    for position in wanted:
        if position not in chosen:
            chosen[position] = {"type": "default"}
            order.append(position)
    if len(chosen) > MAX_POINTS:
        keep = sorted(chosen)
        tail = newest[:2] if newest is not None and newest[:2] in chosen else None
        others = [p for p in keep if p != tail]
        kept = set(others[-(MAX_POINTS - (1 if tail else 0)) :]) | ({tail} if tail else set())
        chosen = {p: v for p, v in chosen.items() if p in kept}
    if not keep_ttl:
        chosen = {
            p: {k: v for k, v in v.items() if k != "ttl"} if isinstance(v, dict) else v for p, v in chosen.items()
        }
    # rebuild only the containers whose checkpoints changed
    result = body
    for c, container in enumerate(containers):
        mine = {b: v for (cc, b), v in chosen.items() if cc == c}
        if not container.changed and mine == container.points:
            continue
        items: list[Any] = []
        for b, block in enumerate(container.blocks):
            items.append(block)
            if b in mine:
                items.append({CACHE_POINT: mine[b]})
        result = _set(result, container.key, items)
    return result


def _set(value: Any, key: tuple[str | int, ...], new: Any) -> Any:
    """Copy-on-write assignment at `key`."""
    if not key:
        return new
    head, rest = key[0], key[1:]
    if isinstance(value, list) and isinstance(head, int):
        copy = list(value)
        copy[head] = _set(value[head], rest, new)
        return copy
    copy_dict = dict(value)
    copy_dict[head] = _set(value[head], rest, new)
    return copy_dict
