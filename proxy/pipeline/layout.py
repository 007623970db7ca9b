"""Per-request layout and block scan, shared by the rewriting stages.

Contract:
- `LayoutCache.scans(...)`: for each prefix key present in the body (`adapter.prefix_keys`),
  the adapter's runs of that key alone (`adapter.layout(path, {key: value})`, which is that
  key's share of `adapter.layout(path, body)`; a test holds it) and ONE pass over their blocks
  (`scan`) collecting run starts, section spans and what the stages look for: markers, null
  markers, markers inside `content` (`MarkerPolicy.nested_kinds`), removable empty text blocks
  and tool-call blocks.
- Reuse is by identity: bodies are copy-on-write, so a key whose value is the same object as
  before has the same runs and scan. The stages of one request (canonicalise, reorder, replay,
  breakpoints) therefore lay out and scan each unchanged container once.
- Why one pass: on ~500 blocks a Python pass costs about as much as orjson parsing them
  (bench/pipeline_bench.py), and the whole pipeline has a budget of 2x (loads + dumps).
"""

from __future__ import annotations

from typing import Any

from proxy.pipeline.blocks import BlockView
from proxy.providers.base import JSONObject, MarkerPolicy, ProviderAdapter, Run

_ABSENT: Any = object()
_TEXT, _NESTED, _CALL = 1, 2, 3


class Scan:
    """The runs of one prefix key and what one pass over their blocks found.

    Block indices are relative to the key's first block; `run` values index `runs`.
    """

    __slots__ = ("runs", "starts", "spans", "size", "markers", "nested", "nulls", "empties", "calls")

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.starts: list[int] = []
        """Block index of each run's first block."""
        self.spans: dict[str, tuple[int, int]] = {}
        """`(first, end)` block indices of each section (contiguous, in render order)."""
        self.size = 0
        self.markers: list[tuple[int, Any]] = []
        """`(block index, marker)` of every block carrying a non-null marker."""
        self.nested: list[int] = []
        """Block indices of blocks holding non-null markers inside their `content` list."""
        self.nulls: list[int] = []
        """Runs with a null marker on a block or inside a block's `content`."""
        self.empties: list[tuple[int, int]] = []
        """`(run, position)` of empty text blocks with no keys but `type`, `text`, marker."""
        self.calls: list[int] = []
        """Runs holding tool-call blocks (`ToolShape.call_kinds`)."""


def scan(runs: list[Run], policy: MarkerPolicy, call_kinds: frozenset[str]) -> Scan:
    """Lay out starts and spans of `runs` and find what the stages need, in one pass."""
    out = Scan(runs)
    key = policy.key
    action = {k: _CALL for k in call_kinds}
    action.update((k, _NESTED) for k in policy.nested_kinds)
    action.update((k, _TEXT) for k in policy.text_kinds)
    removable = {"type", "text", key}
    starts, markers = out.starts, out.markers
    index = 0
    section = None
    section_start = 0
    for r, run in enumerate(runs):
        starts.append(index)
        if run.section != section:
            if section is not None:
                out.spans[section] = (section_start, index)
            section, section_start = run.section, index
        if not run.is_list:
            index += 1
            continue
        fixed = run.kind
        for pos, block in enumerate(run.value):
            if type(block) is not dict:
                continue
            if key in block:
                marker = block[key]
                if marker is None:
                    if not out.nulls or out.nulls[-1] != r:
                        out.nulls.append(r)
                else:
                    markers.append((index + pos, marker))
            todo = action.get(fixed or block.get("type"))
            if todo is None:
                continue
            if todo == _TEXT:
                if block.get("text") == "" and block.keys() <= removable:
                    out.empties.append((r, pos))
            elif todo == _CALL:
                if not out.calls or out.calls[-1] != r:
                    out.calls.append(r)
            else:
                content = block.get("content")
                if type(content) is list:
                    _scan_content(out, content, key, r, index + pos)
        index += len(run.value)
    if section is not None:
        out.spans[section] = (section_start, index)
    out.size = index
    return out


def _scan_content(out: Scan, content: list[Any], key: str, run: int, index: int) -> None:
    for part in content:
        if type(part) is not dict or key not in part:
            continue
        if part[key] is None:
            if not out.nulls or out.nulls[-1] != run:
                out.nulls.append(run)
        elif not out.nested or out.nested[-1] != index:
            out.nested.append(index)


def view_of(scans: list[Scan]) -> BlockView:
    """One `BlockView` over consecutive key scans."""
    runs: list[Run] = []
    starts: list[int] = []
    spans: dict[str, tuple[int, int]] = {}
    offset = 0
    for part in scans:
        runs.extend(part.runs)
        starts.extend([offset + s for s in part.starts] if offset else part.starts)
        for section, (first, end) in part.spans.items():
            known = spans.get(section)
            spans[section] = (known[0] if known else offset + first, offset + end)
        offset += part.size
    return BlockView(runs, starts, offset, spans)


class LayoutCache:
    """Per-request memo of layout + scan per prefix key (see the module docstring)."""

    __slots__ = ("_scans", "_policy")

    def __init__(self) -> None:
        self._scans: dict[str, tuple[Any, Scan]] = {}
        self._policy: tuple[MarkerPolicy, frozenset[str]] | None = None

    def scans(
        self,
        adapter: ProviderAdapter,
        path: str,
        body: JSONObject,
        policy: MarkerPolicy,
        call_kinds: frozenset[str],
    ) -> list[tuple[str, Scan]]:
        """`(prefix key, scan)` for each prefix key in `body`, in render order."""
        if self._policy is None or self._policy != (policy, call_kinds):
            self._scans.clear()
            self._policy = (policy, call_kinds)
        out = []
        for key in adapter.prefix_keys(path):
            if key not in body:
                continue
            value = body[key]
            hit = self._scans.get(key)
            if hit is None or hit[0] is not value:
                hit = self._scans[key] = (value, scan(adapter.layout(path, {key: value}), policy, call_kinds))
            out.append((key, hit[1]))
        return out

    def view(
        self,
        adapter: ProviderAdapter,
        path: str,
        body: JSONObject,
        policy: MarkerPolicy,
        call_kinds: frozenset[str],
    ) -> tuple[BlockView, dict[int, Any], list[int]]:
        """The body's `BlockView`, its markers by block index, and the blocks holding markers
        inside their `content`."""
        scans = [s for _, s in self.scans(adapter, path, body, policy, call_kinds)]
        marks: dict[int, Any] = {}
        nested: list[int] = []
        offset = 0
        for part in scans:
            for index, marker in part.markers:
                marks[offset + index] = marker
            nested.extend(offset + index for index in part.nested)
            offset += part.size
        return view_of(scans), marks, nested
