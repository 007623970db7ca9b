"""Shared request-side helpers: a block view over an adapter's runs, marker legality, and a
copy-on-write editor.

Contract:
- `BlockView(runs)` indexes blocks exactly as `adapter.prefix_blocks` does (index `i` here is
  block `i` there), without building a `Block` per block: the stages walk hundreds of blocks per
  request and `prefix_blocks` costs more than parsing the body (measured on a 610 KB body).
- `Editor(body)` applies edits by key path and copies each container on the way once; the
  caller's objects are never mutated. `result()` is `body` itself when nothing was edited.
- Nothing here knows a provider: policies (`MarkerPolicy`) and adapters carry the differences.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from proxy.providers.base import HiddenCalls, JSONObject, MarkerPolicy, ProviderAdapter, Run
from proxy.settings import UpstreamCapabilities

Path = tuple[str | int, ...]
_ORDER = {"tools": 0, "system": 1, "messages": 2}


def kind_of(run: Run, value: Any) -> str:
    """The block kind `prefix_blocks` reports for `value` in `run`."""
    if run.kind is not None:
        return run.kind
    if isinstance(value, dict):
        kind = value.get("type")
        if isinstance(kind, str):
            return kind
    return "text" if isinstance(value, str) else "unknown"


def marker_ttl(marker: Any) -> str:
    """`1h` or `5m` (a bare marker counts as 5m, docs/provider-rules.md 1.2)."""
    return "1h" if isinstance(marker, dict) and marker.get("ttl") == "1h" else "5m"


class BlockView:
    """Random access to the blocks of `runs` by prefix index."""

    __slots__ = ("runs", "starts", "size", "_spans", "hidden")

    def __init__(
        self,
        runs: Sequence[Run],
        starts: list[int] | None = None,
        size: int | None = None,
        spans: dict[str, tuple[int, int]] | None = None,
        hidden: tuple[HiddenCalls, Sequence[Any]] | None = None,
    ) -> None:
        self.runs = runs
        self.hidden = hidden
        """`(hidden_calls, ids)`: the ids of the hidden calls in `runs` as a scan found them
        (`proxy.pipeline.layout.view_of`); `None` when not known (`Legality` walks the runs)."""
        if starts is None or size is None or spans is None:
            starts, spans, size = [], {}, 0
            for run in runs:
                starts.append(size)
                length = len(run.value) if run.is_list else 1
                spans[run.section] = (spans.get(run.section, (size, 0))[0], size + length)
                size += length
        self.starts = starts
        self.size = size
        self._spans = spans

    def locate(self, index: int) -> tuple[Run, int]:
        r = bisect_right(self.starts, index) - 1
        return self.runs[r], index - self.starts[r]

    def value(self, index: int) -> Any:
        run, pos = self.locate(index)
        return run.value[pos] if run.is_list else run.value

    def kind(self, index: int) -> str:
        run, pos = self.locate(index)
        return kind_of(run, run.value[pos] if run.is_list else run.value)

    def span(self, section: str) -> tuple[int, int]:
        """`(first, end)` block indices of `section` (end exclusive); `(k, k)` when it is empty,
        `k` being where it would start."""
        span = self._spans.get(section)
        if span is not None:
            return span
        end = 0
        for other, (_, other_end) in self._spans.items():
            if _ORDER[other] < _ORDER[section]:
                end = max(end, other_end)
        return end, end

    def path(self, index: int) -> Path:
        run, pos = self.locate(index)
        return run.key + (pos,) if run.is_list else run.key


def is_hidden_call(value: Any, hidden: HiddenCalls) -> bool:
    """Whether `value` is a call made by a server-side caller (`HiddenCalls`)."""
    if not isinstance(value, dict) or value.get("type") != hidden.call_kind:
        return False
    caller = value.get(hidden.caller_key)
    kind = caller.get("type") if isinstance(caller, dict) else None
    return isinstance(kind, str) and kind.startswith(hidden.caller_prefix)


class Legality:
    """Which blocks may carry a marker (docs/provider-rules.md 1.3, 2.3), per policy and capabilities."""

    __slots__ = ("adapter", "policy", "caps", "view", "_cache", "_hidden")

    def __init__(
        self,
        adapter: ProviderAdapter,
        policy: MarkerPolicy,
        caps: UpstreamCapabilities,
        view: BlockView,
    ) -> None:
        self.adapter, self.policy, self.caps, self.view = adapter, policy, caps, view
        self._cache: dict[tuple[int, bool], bool] = {}
        self._hidden: frozenset[Any] | None = None

    def _hidden_ids(self) -> frozenset[Any]:
        """Ids of the hidden calls in the request (one scan, when first asked; none when the
        view's scans found them already: `BlockView.hidden`)."""
        if self._hidden is None:
            hidden = self.policy.hidden_calls
            ids: set[Any] = set()
            known = self.view.hidden
            if hidden is not None and known is not None and known[0] == hidden:
                ids.update(known[1])
            elif hidden is not None:
                for run in self.view.runs:
                    if run.section == "messages" and run.is_list:
                        ids.update(v.get(hidden.id_key) for v in run.value if is_hidden_call(v, hidden))
            self._hidden = frozenset(ids)
        return self._hidden

    def is_hidden(self, kind: str, value: Any) -> bool:
        """Whether a block is a hidden call or the result of one (`MarkerPolicy.hidden_calls`)."""
        hidden = self.policy.hidden_calls
        if hidden is None or not isinstance(value, dict):
            return False
        if kind == hidden.call_kind:
            return is_hidden_call(value, hidden)
        if kind == hidden.result_kind:
            ref = value.get(hidden.ref_key)
            return ref is not None and ref in self._hidden_ids()
        return False

    def __call__(self, index: int, new: bool = False) -> bool:
        """May block `index` keep a client marker (`new` False) or take a new one (`new`)?"""
        cached = self._cache.get((index, new))
        if cached is None:
            cached = self._cache[(index, new)] = self._check(index, new)
        return cached

    def _check(self, index: int, new: bool) -> bool:
        policy = self.policy
        run, pos = self.view.locate(index)
        value = run.value[pos] if run.is_list else run.value
        kind = kind_of(run, value)
        if kind in policy.forbidden_kinds or self.is_hidden(kind, value):
            return False
        if run.role is not None and policy.roles is not None and run.role not in policy.roles:
            return False
        if self.caps.no_tool_message_markers and (kind in policy.tool_kinds or run.role in policy.tool_roles):
            return False
        if run.is_list:
            if not isinstance(value, dict):
                return False
        elif not isinstance(value, str) or self.adapter.as_block_list(run) is None:
            return False
        if kind in policy.text_kinds:
            text = value if isinstance(value, str) else value.get("text")
            if not isinstance(text, str) or not text:
                return False
        return kind in policy.kinds if new else True

    def nearest(self, index: int, exclude: frozenset[int] = frozenset()) -> int | None:
        """The closest block that may take a new marker (ties: the earlier one); `None` if
        none. A moved marker only ever lands where the policy knows a marker is accepted."""
        size = self.view.size
        for distance in range(1, size):
            before, after = index - distance, index + distance
            if before < 0 and after >= size:
                return None
            if before >= 0 and before not in exclude and self(before, new=True):
                return before
            if after < size and after not in exclude and self(after, new=True):
                return after
        return None

    def at_or_before(self, index: int) -> int | None:
        """The last block at or before `index` that may take a new marker."""
        for i in range(min(index, self.view.size - 1), -1, -1):
            if self(i, new=True):
                return i
        return None


class Editor:
    """Copy-on-write edits of a JSON body by key path."""

    __slots__ = ("_body", "_root", "_owned", "_deletes")

    def __init__(self, body: JSONObject) -> None:
        self._body = body
        self._root: JSONObject | None = None
        self._owned: dict[int, Any] = {}
        self._deletes: list[Path] = []

    def _parent(self, path: Path) -> Any:
        if self._root is None:
            self._root = dict(self._body)
            self._owned[id(self._root)] = self._root
        node: Any = self._root
        for key in path[:-1]:
            child = node[key]
            if id(child) not in self._owned:
                child = dict(child) if isinstance(child, dict) else list(child)
                self._owned[id(child)] = child
                node[key] = child
            node = child
        return node

    def get(self, path: Path) -> Any:
        node: Any = self._root if self._root is not None else self._body
        for key in path:
            node = node[key]
        return node

    def set(self, path: Path, value: Any) -> None:
        self._parent(path)[path[-1]] = value

    def delete(self, path: Path) -> None:
        """Remove `path` when `result()` runs (list indices keep their pre-delete meaning)."""
        self._deletes.append(path)

    @property
    def changed(self) -> bool:
        return self._root is not None or bool(self._deletes)

    def result(self) -> JSONObject:
        for path in sorted(self._deletes, reverse=True):
            del self._parent(path)[path[-1]]
        self._deletes.clear()
        return self._root if self._root is not None else self._body


def stronger(current: Any, new: Any) -> Any:
    """The marker to keep when two land on one block: the longer TTL, else `current`."""
    if current is None or (marker_ttl(new) == "1h" and marker_ttl(current) != "1h"):
        return new
    return current


def write_marker(
    editor: Editor, adapter: ProviderAdapter, view: BlockView, key: str, index: int, marker: Any
) -> None:
    """Put `marker` (`None`: remove it) on block `index` through `editor`. A whole-string block
    becomes a one-block list first (`adapter.as_block_list`); the caller checked legality."""
    run, pos = view.locate(index)
    if run.is_list:
        at = run.key + (pos,)
        current = editor.get(at)
        if marker is None:
            if key in current:
                editor.set(at, {k: v for k, v in current.items() if k != key})
        elif current.get(key) is not marker:
            editor.set(at, {**current, key: marker})
        return
    if marker is None:
        return
    converted = adapter.as_block_list(run)
    if converted is None:
        raise ValueError(f"block {index} cannot carry a marker")
    value, inner = converted
    node = value
    for step in inner:
        node = node[step]
    node[key] = marker
    editor.set(run.key, value)


def order_top_keys(body: JSONObject, prefix_keys: tuple[str, ...]) -> JSONObject:
    """`body` with its other keys first (in order), then `prefix_keys` in render order;
    `body` itself when already so."""
    present = [k for k in prefix_keys if k in body]
    keys = list(body)
    if keys[len(keys) - len(present) :] == present:
        return body
    ordered = {k: v for k, v in body.items() if k not in prefix_keys}
    ordered.update((k, body[k]) for k in present)
    return ordered
