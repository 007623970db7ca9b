"""canonicalise: make what the provider renders deterministic.

Pure core `canonicalise_body(adapter, body, pins, caps)`; `STAGE` adapts it to the
`Exchange`.

Contract:
- Tool definitions in a pinned order: the names of `SessionPins.pinned_tool_order` (first-seen
  order in the session, fed by the session engineer through `Exchange.session_pins`) first,
  then every other tool in client order. Without pins the client's order is kept.
- Key order of tool schemas and tool-call inputs (Anthropic `tool_use.input`) follows pinned
  first-seen values per tool name (`pinned_schemas`, `pinned_inputs`): keys of the pinned value
  come in its order, recursively; new keys follow in client order. Keys are never sorted: the
  model reads schemas and its own earlier calls in key order, and the first-seen order is the
  one it already saw, so pinning cannot change behaviour while sorting could (docs/provider-rules.md 1.8:
  `tool_use.input` key order must be stable). Without pins the client's order is kept.
  OpenAI tool-call arguments are JSON strings and are never edited.
- An empty text block is removed when that loses nothing: no keys but `type`, `text` and a
  marker, and its list keeps another block. Its marker moves to the nearest block that may carry
  one (ties: the earlier), else it is dropped (counted as `moved` / `dropped`).
- A marker key with a `null` value (`cache_control: null`) is removed, on blocks, inside
  `tool_result.content` and at the top level.
- Top-level keys: the client's other keys first in their order, then the prefix keys in render
  order (`adapter.prefix_keys`: tools, system, messages).
- String content is never edited. Idempotent; `body` and everything in it is never mutated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.exchange import Exchange
from proxy.malformed import skipped
from proxy.pipeline.blocks import BlockView, Editor, Legality, order_top_keys, stronger, write_marker
from proxy.pipeline.layout import LayoutCache, Scan, scan, view_of
from proxy.pipeline.support import NO_CAPABILITY_LIMITS, count_markers, layout_cache, request_capabilities
from proxy.providers.base import JSONObject, ProviderAdapter, Run, ToolShape
from proxy.services import Services
from proxy.settings import UpstreamCapabilities

_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class SessionPins:
    """First-seen shapes of one session (`Exchange.session_pins`, the record's mapping form)."""

    pinned_tool_order: tuple[str, ...] = ()
    """Tool names in first-seen order."""
    pinned_schemas: Mapping[str, Any] = field(default_factory=dict)
    """Tool name -> its first-seen schema (a key-order reference)."""
    pinned_inputs: Mapping[str, Any] = field(default_factory=dict)
    """Tool name -> the first-seen input of a call to it (a key-order reference)."""

    @classmethod
    def of(cls, pins: Mapping[str, Any] | None) -> SessionPins | None:
        """The pins of a session record's mapping (`SessionRecord.pins`, keys as the field
        names; `proxy.pipeline.session.update_pins` writes it), `None` without one."""
        if pins is None:
            return None
        return cls(
            tuple(pins.get("pinned_tool_order", ())),
            dict(pins.get("pinned_schemas", {})),
            dict(pins.get("pinned_inputs", {})),
        )


@dataclass(slots=True)
class CanonicalReport:
    tools_reordered: bool = False
    keys_pinned: int = 0
    """Schemas and tool-call inputs whose key order changed."""
    empty_removed: int = 0
    nulls_removed: int = 0
    markers_moved: int = 0
    markers_dropped: int = 0
    top_keys_reordered: bool = False


def _dig(value: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _replace_at(value: JSONObject, path: Sequence[str], new: Any) -> JSONObject:
    if len(path) == 1:
        return {**value, path[0]: new}
    return {**value, path[0]: _replace_at(value[path[0]], path[1:], new)}


def order_like(value: Any, reference: Any) -> Any:
    """`value` with dict keys in `reference`'s order (recursively; extra keys after, in their
    order). Lists keep their order (it means something); their items are matched by index.
    Returns `value` itself when nothing changes.

    Fast path: a value that serialises to the same bytes as `reference` already has its keys
    in `reference`'s order at every level (the usual case: the same schema or tool input as
    the first-seen one), which one C-level compare tells."""
    if isinstance(value, dict | list) and _same_json(value, reference):
        return value
    return _order_like(value, reference)


def _same_json(value: Any, reference: Any) -> bool:
    try:
        return orjson.dumps(value) == orjson.dumps(reference)
    except (orjson.JSONEncodeError, TypeError):
        return False


def _order_like(value: Any, reference: Any) -> Any:
    if isinstance(value, dict) and isinstance(reference, dict):
        if list(value) == list(reference):  # same keys in the same order: only children can move
            out: dict[Any, Any] | None = None
            for k, v in value.items():
                if isinstance(v, dict | list):
                    ordered = _order_like(v, reference[k])
                    if ordered is not v:
                        out = out if out is not None else dict(value)
                        out[k] = ordered
            return out if out is not None else value
        out = {k: value[k] for k in reference if k in value}
        if len(out) != len(value):
            out.update((k, v) for k, v in value.items() if k not in out)
        changed = list(out) != list(value)
        for k, v in out.items():
            if isinstance(v, dict | list) and k in reference:
                ordered = _order_like(v, reference[k])
                if ordered is not v:
                    out[k] = ordered
                    changed = True
        return out if changed else value
    if isinstance(value, list) and isinstance(reference, list):
        new: list[Any] | None = None
        for i in range(min(len(value), len(reference))):
            ordered = _order_like(value[i], reference[i])
            if ordered is not value[i]:
                new = new if new is not None else list(value)
                new[i] = ordered
        return new if new is not None else value
    return value


def _pin_tools(shape: ToolShape, tools: list[Any], pins: SessionPins, report: CanonicalReport) -> list[Any]:
    rank = {name: i for i, name in enumerate(pins.pinned_tool_order)}
    names = [_dig(tool, shape.name_path) for tool in tools]
    for i, name in enumerate(names):
        if type(name) is not str:  # unnamed or malformed: unranked, keeps its place among them
            if name is not None:
                skipped("tool_name")
            names[i] = None
    order = sorted(range(len(tools)), key=lambda i: (0, rank[names[i]]) if names[i] in rank else (1, i))
    new = [tools[i] for i in order]
    report.tools_reordered = order != list(range(len(tools)))
    for i, tool in enumerate(new):
        name = _dig(tool, shape.name_path)
        schema = _dig(tool, shape.schema_path)
        if isinstance(name, str) and name in pins.pinned_schemas and schema is not None:
            ordered = order_like(schema, pins.pinned_schemas[name])
            if ordered is not schema:
                new[i] = _replace_at(tool, shape.schema_path, ordered)
                report.keys_pinned += 1
    changed = report.tools_reordered or any(a is not b for a, b in zip(new, tools, strict=True))
    return new if changed else tools


def _without_null(value: JSONObject, key: str) -> JSONObject:
    return {k: v for k, v in value.items() if k != key}


def _clean_block(value: JSONObject, kind: Any, key: str, nested: frozenset[str], report: CanonicalReport) -> JSONObject:
    new = value
    if key in value and value[key] is None:
        new = _without_null(value, key)
        report.nulls_removed += 1
    inner = new.get("content") if kind in nested else None
    if isinstance(inner, list) and any(isinstance(p, dict) and key in p and p[key] is None for p in inner):
        cleaned = []
        for part in inner:
            if isinstance(part, dict) and key in part and part[key] is None:
                part = _without_null(part, key)
                report.nulls_removed += 1
            cleaned.append(part)
        new = {**new, "content": cleaned}
    return new


def canonicalise_body(
    adapter: ProviderAdapter,
    body: JSONObject,
    pins: SessionPins | None = None,
    caps: UpstreamCapabilities = NO_CAPABILITY_LIMITS,
    cache: LayoutCache | None = None,
) -> tuple[JSONObject, CanonicalReport]:
    """The canonical form of `body` (see the module docstring) and what changed (pure).

    `cache` shares layout and scan results with later stages of the same request."""
    report = CanonicalReport()
    cache = cache if cache is not None else LayoutCache()
    policy = adapter.marker_policy(body)
    key = policy.key
    shape = adapter.tool_shape
    scans = cache.scans(adapter, body, policy, shape.call_kinds)
    editor = Editor(body)
    if pins is not None and scans and scans[0][0] == "tools" and scans[0][1].runs:
        tools_run = scans[0][1].runs[0]
        tools = _pin_tools(shape, tools_run.value, pins, report)
        if tools is not tools_run.value:
            editor.set(tools_run.key, tools)
            pinned = scan([dataclasses.replace(tools_run, value=tools)], policy, shape.call_kinds)
            scans = [("tools", pinned), *scans[1:]]
    inputs = pins.pinned_inputs if pins is not None else {}
    removed: list[int] = []
    stranded: list[tuple[int, Any]] = []
    offset = 0
    for _, part in scans:
        runs = part.runs
        for r in part.nulls:
            _clean_run(runs[r], editor, key, shape, inputs, policy.nested_kinds, report)
        if inputs and part.calls:
            _pin_inputs(part, editor, shape, inputs, report)
        by_run: dict[int, list[int]] = {}
        for r, pos in part.empties:
            by_run.setdefault(r, []).append(pos)
        for r, positions in by_run.items():
            run = runs[r]
            if len(positions) == len(run.value):
                continue
            for pos in positions:
                editor.delete(run.key + (pos,))
                removed.append(offset + part.starts[r] + pos)
                if run.value[pos].get(key) is not None:
                    stranded.append((removed[-1], run.value[pos][key]))
        offset += part.size
    report.empty_removed = len(removed)
    if stranded:
        view = view_of([part for _, part in scans])
        _rehome(adapter, view, editor, caps, policy, frozenset(removed), stranded, report)
    top_key = policy.top_level_key
    if top_key is not None and top_key in body and body[top_key] is None:
        editor.delete((top_key,))
        report.nulls_removed += 1
    result = editor.result()
    ordered = order_top_keys(result, adapter.prefix_keys)
    report.top_keys_reordered = ordered is not result
    return ordered, report


def _clean_run(
    run: Run,
    editor: Editor,
    key: str,
    shape: ToolShape,
    inputs: Mapping[str, Any],
    nested: frozenset[str],
    report: CanonicalReport,
) -> None:
    """Remove null markers and pin tool-call input key order in one list run (via `editor`)."""
    call_kinds = shape.call_kinds if inputs else frozenset()
    for c, value in enumerate(run.value):
        if not isinstance(value, dict):
            continue
        kind = run.kind or value.get("type")
        if type(kind) is not str:  # malformed (counted by the scan): a block of no known kind
            kind = None
        # `_clean_block` changes nothing on a block without the marker key that nests none
        new = _clean_block(value, kind, key, nested, report) if key in value or kind in nested else value
        if kind in call_kinds:
            new = _pinned(value, new, shape, inputs, report)
        if new is not value:
            editor.set(run.key + (c,), new)


def _pinned(
    value: JSONObject, new: JSONObject, shape: ToolShape, inputs: Mapping[str, Any], report: CanonicalReport
) -> JSONObject:
    """`new` (tool call `value`, maybe cleaned) with its input's keys in pinned order."""
    name: Any = value.get(shape.call_name_key)
    call_input = new.get(shape.call_input_key)
    if type(name) is str and name in inputs and isinstance(call_input, dict):
        # inputs are small and mostly differ in values from the pinned one: walk, no dumps
        ordered = _order_like(call_input, inputs[name])
        if ordered is not call_input:
            report.keys_pinned += 1
            return {**new, shape.call_input_key: ordered}
    return new


def _pin_inputs(
    part: Scan, editor: Editor, shape: ToolShape, inputs: Mapping[str, Any], report: CanonicalReport
) -> None:
    """Pin the input key order of the tool calls of `part` (`Scan.calls`), except in the runs
    `_clean_run` went through (`Scan.nulls`). One loop over ~100s of calls per request: an
    input whose keys already come in the pinned input's order and holds no object or array
    (the usual case) changes nothing, and is recognised without a call."""
    runs = part.runs
    cleaned = set(part.nulls)
    name_key, input_key = shape.call_name_key, shape.call_input_key
    pinned_keys: dict[Any, list[Any] | None] = {}
    for r, pos in zip(part.calls, part.call_positions, strict=True):
        if r in cleaned:
            continue
        value = runs[r].value[pos]
        name = value.get(name_key)
        call_input = value.get(input_key)
        if type(name) is not str:  # malformed call name: no pinned input (proxy.malformed)
            if name is not None:
                skipped("call_name")
            continue
        if name not in inputs or not isinstance(call_input, dict):
            continue
        keys = pinned_keys.get(name, _UNSET)
        if keys is _UNSET:
            reference = inputs[name]
            keys = pinned_keys[name] = list(reference) if isinstance(reference, dict) else None
        if keys is not None and list(call_input) == keys:
            for item in call_input.values():
                if isinstance(item, dict | list):
                    break
            else:
                continue
        ordered = _order_like(call_input, inputs[name])
        if ordered is not call_input:
            report.keys_pinned += 1
            editor.set(runs[r].key + (pos,), {**value, input_key: ordered})


def _rehome(
    adapter: ProviderAdapter,
    view: BlockView,
    editor: Editor,
    caps: UpstreamCapabilities,
    policy: Any,
    removed: frozenset[int],
    stranded: list[tuple[int, Any]],
    report: CanonicalReport,
) -> None:
    """Move the markers of removed empty text blocks to the nearest block that may carry one."""
    legal = Legality(adapter, policy, caps, view)
    for index, marker in stranded:
        target = legal.nearest(index, removed)
        if target is None:
            report.markers_dropped += 1
            continue
        current = editor.get(view.path(target))
        current_marker = current.get(policy.key) if isinstance(current, dict) else None
        write_marker(editor, adapter, view, policy.key, target, stronger(current_marker, marker))
        report.markers_moved += 1


class CanonicaliseStage:
    name: Final = "canonicalise"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        body = exchange.body
        if body is None:
            return
        pins = SessionPins.of(exchange.session_pins)
        caps = request_capabilities(services, exchange)
        cache = layout_cache(exchange)
        new_body, report = canonicalise_body(exchange.adapter, body, pins, caps, cache)
        count_markers(exchange, services, moved=report.markers_moved, dropped=report.markers_dropped)
        if new_body is not body:
            exchange.replace_body(new_body)


STAGE: Final = CanonicaliseStage()
