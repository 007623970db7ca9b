"""Per-request layout and block scan, shared by the rewriting stages.

Contract:
- `LayoutCache.scans(...)`: for each prefix key present in the body (`adapter.prefix_keys`),
  the adapter's runs of that key alone (`adapter.layout({key: value})`, which is that
  key's share of `adapter.layout(body)`; a test holds it) and ONE pass over their blocks
  (`scan`) collecting run starts, section spans and what the stages look for: markers, null
  markers, markers inside `content` (`MarkerPolicy.nested_kinds`), removable empty text blocks
  and tool-call blocks.
- Reuse is by identity: bodies are copy-on-write, so a key whose value is the same object as
  before has the same runs and scan. The stages of one request (canonicalise, reorder, replay,
  breakpoints) therefore lay out and scan each unchanged container once.
- A key whose value changed (reorder put text on the newest user message) is laid out by
  `adapter.relayout` when the adapter can reuse the runs of the unchanged messages, and scanned
  from its first run that differs from the previous scan's (`scan(..., previous)`): the
  results for the shared leading runs are copied, so the edit costs about one message, not a
  second pass over the body. A test holds both equal to a fresh layout and scan.
- One thing outlives the request: the scans of the client's body as the session stage made
  them (`snapshot`), kept with the tenant's newest bodies (`proxy.pipeline.rawprefix.Kept`)
  and `seed`ed into the next request's cache when it continues that body byte for byte (its
  earlier messages are then the same objects: `rawprefix.parse_tail`), so an appended turn is
  laid out and scanned from its first new run. Runs and scans are never edited once made.
- Why one pass: on ~500 blocks a Python pass costs about as much as orjson parsing them
  (bench/pipeline_bench.py), and the whole pipeline has a budget of 2x (loads + dumps).
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import compress, count
from operator import is_not
from typing import Any, Final

from proxy.malformed import skipped
from proxy.pipeline.blocks import BlockView, is_hidden_call
from proxy.providers.base import HiddenCalls, JSONObject, MarkerPolicy, ProviderAdapter, Run

_TEXT, _NESTED, _CALL = 1, 2, 3
_GROUP_SECTION: Final = 0
_GROUP_RUN: Final = 1
_GROUP_BLOCK: Final = 2


class Scan:
    """The runs of one prefix key and what one pass over their blocks found.

    Block indices are relative to the key's first block; `run` values index `runs`.
    """

    __slots__ = (
        "runs",
        "starts",
        "spans",
        "size",
        "markers",
        "nested",
        "nulls",
        "empties",
        "calls",
        "call_positions",
        "groups",
        "hidden",
        "hidden_calls",
        "odd",
        "pin_memo",
        "_messages",
        "_base",
    )

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
        """The run of each tool-call block (`ToolShape.call_kinds`), in block order."""
        self.call_positions: list[int] = []
        """The position in its run of each tool-call block (`calls[i]`'s)."""
        self.groups: list[tuple[str, int, int]] = []
        """`(section, first run, first block)` of each maximal run of one section."""
        self.hidden: list[tuple[int, Any]] = []
        """`(run, id)` of each hidden call (`MarkerPolicy.hidden_calls`) in the messages
        section's list runs, in block order: what `Legality` would find walking every block."""
        self.hidden_calls: HiddenCalls | None = None
        """The policy's `hidden_calls` the scan looked for (`hidden` is empty without one)."""
        self.odd: list[int] = []
        """The run of each block of no known kind (counted as skipped, `proxy.malformed`, when
        walked), in block order: a scan that copies trailing runs from this one counts them as
        its walk would have (`_adopt_tail`)."""
        self.pin_memo: tuple[int, tuple[int, ...], dict[str, Any]] | None = None
        """Not a scan result: `proxy.pipeline.canonicalise`'s memo of its input pinning over
        these runs (`(calls walked, those it pinned or found malformed, the pinned input each
        name was checked against)`), which a later scan built on this one starts from."""
        self._messages: set[Any] | None = None
        self._base: tuple[Scan, int] | None = None
        """`(previous scan, leading runs shared with it)` when built from a previous scan."""

    @property
    def messages(self) -> set[Any]:
        """The distinct `Run.message` values of `runs` (`None` included when present)."""
        if self._messages is None:
            base = self._base
            known = base[0]._messages if base is not None else None
            if base is not None and known is not None and len(known) == len(base[0].runs):
                # every previous run had a message of its own: drop the old tail's, add the new
                previous, shared = base
                messages = set(known)
                messages.difference_update([run.message for run in previous.runs[shared:]])
                messages.update([run.message for run in self.runs[shared:]])
                self._messages = messages
            else:
                self._messages = {run.message for run in self.runs}
        return self._messages


def _same_prefix(old: list[Run], new: list[Run], known: int = 0) -> int:
    """How many leading runs of `new` scan exactly like those of `old`: the same run (reused
    by `ProviderAdapter.relayout`; runs are never edited), or the same value object (bodies
    are copy-on-write) in the same section, shape and kind. `known`: the first runs known to
    be the same objects (`relayout` says how many)."""
    n = known or next(compress(count(), map(is_not, old, new)), min(len(old), len(new)))
    for a, b in zip(old[n:], new[n:], strict=False):
        if a.value is not b.value or a.is_list is not b.is_list or a.kind != b.kind or a.section != b.section:
            break
        n += 1
    return n


def _adopt(out: Scan, previous: Scan, reuse: int) -> int:
    """Copy what `previous` found in its first `reuse` runs into `out`; returns the block
    index where run `reuse` starts."""
    index = previous.starts[reuse] if reuse < len(previous.starts) else previous.size
    out.starts = previous.starts[:reuse]
    out.markers = previous.markers[: bisect_left(previous.markers, index, key=_first)]
    out.nested = previous.nested[: bisect_left(previous.nested, index)]
    out.nulls = previous.nulls[: bisect_left(previous.nulls, reuse)]
    out.empties = previous.empties[: bisect_left(previous.empties, reuse, key=_first)]
    kept_calls = bisect_left(previous.calls, reuse)
    out.calls = previous.calls[:kept_calls]
    out.call_positions = previous.call_positions[:kept_calls]
    out.groups = previous.groups[: bisect_left(previous.groups, reuse, key=_run_of)]
    out.hidden = previous.hidden[: bisect_left(previous.hidden, reuse, key=_first)]
    out.odd = previous.odd[: bisect_left(previous.odd, reuse)]
    return index


def scan(runs: list[Run], policy: MarkerPolicy, call_kinds: frozenset[str], previous: Scan | None = None) -> Scan:
    """Lay out starts and spans of `runs` and find what the stages need, in one pass.

    `previous` (a scan of earlier runs of the same key, same policy and call kinds): its
    results for the leading runs `runs` shares with it are reused, and only the rest is
    scanned (the stages re-scan a key after editing a few of its blocks near the end)."""
    return _scan(runs, policy.key, _actions(policy, call_kinds), previous, hidden=policy.hidden_calls)


def _actions(policy: MarkerPolicy, call_kinds: frozenset[str]) -> dict[Any, int]:
    """What `scan` does with a block, by kind."""
    action = {k: _CALL for k in call_kinds}
    action.update((k, _NESTED) for k in policy.nested_kinds)
    action.update((k, _TEXT) for k in policy.text_kinds)
    return action


def _scan(
    runs: list[Run],
    key: str,
    action: dict[Any, int],
    previous: Scan | None,
    known: int = 0,
    hidden: HiddenCalls | None = None,
) -> Scan:
    out = Scan(runs)
    out.hidden_calls = hidden
    get_action = action.get
    removable = {"type", "text", key}
    hidden_kind = hidden.call_kind if hidden is not None else None
    first = 0
    index = 0
    if previous is not None and previous.hidden_calls != hidden:
        previous = None  # it looked for other hidden calls
    stop = len(runs)
    """Runs `first .. stop - 1` are scanned here; the ones after are `previous`'s own (`_adopt_tail`)."""
    if previous is not None:
        first = _same_prefix(previous.runs, runs, known)
        if first:
            index = _adopt(out, previous, first)
            out._base = (previous, first)
        stop -= _same_suffix(previous.runs, runs, first)
    starts, markers, nulls, empties, groups = out.starts, out.markers, out.nulls, out.empties, out.groups
    calls, call_positions, hidden_found = out.calls, out.call_positions, out.hidden
    section = groups[-1][_GROUP_SECTION] if groups else None
    last_null = nulls[-1] if nulls else -1
    r = first - 1
    for run in runs[first:stop] if first or stop < len(runs) else runs:
        r += 1
        starts.append(index)
        if run.section != section:
            section = run.section
            groups.append((section, r, index))
        if not run.is_list:
            index += 1
            continue
        fixed = run.kind
        at = index  # block index of `block`
        look = hidden_kind if section == "messages" else None
        for block in run.value:
            if type(block) is dict:
                if look is not None and block.get("type") == look and hidden and is_hidden_call(block, hidden):
                    hidden_found.append((r, block.get(hidden.id_key)))
                if key in block:
                    marker = block[key]
                    if marker is None:
                        if last_null != r:
                            nulls.append(r)
                            last_null = r
                    else:
                        markers.append((at, marker))
                kind = fixed or block.get("type")
                try:
                    todo = get_action(kind)
                except TypeError:  # an unhashable `type`
                    todo = None
                if todo is None and type(kind) is not str and kind is not None:
                    skipped("block_type")  # a block of no known kind (proxy.malformed)
                    out.odd.append(r)
                    content = block.get("content")
                    if type(content) is list:  # its nested markers still count (moved out)
                        _scan_content(out, content, key, r, at)
                        last_null = nulls[-1] if nulls else -1
                if todo is not None:
                    if todo == _TEXT:
                        if block.get("text") == "" and block.keys() <= removable:
                            empties.append((r, at - index))
                    elif todo == _CALL:
                        calls.append(r)
                        call_positions.append(at - index)
                    else:
                        content = block.get("content")
                        if type(content) is list:
                            _scan_content(out, content, key, r, at)
                            last_null = nulls[-1] if nulls else -1
            at += 1
        index = at
    if stop < len(runs):
        assert previous is not None
        index = _adopt_tail(out, previous, stop, len(previous.runs) - len(runs), index, section)
    out.size = index
    spans = out.spans
    for g, (name, _, begin) in enumerate(groups):
        spans[name] = (begin, groups[g + 1][_GROUP_BLOCK] if g + 1 < len(groups) else index)
    return out


def _same_suffix(old: list[Run], new: list[Run], first: int) -> int:
    """How many trailing runs of `new`, after its first `first`, are the trailing runs of `old`,
    the very objects (runs are never edited: the same blocks; a new session re-sending a
    recent conversation under another first message, laid out from the kept body's runs by
    `relayout`)."""
    n = min(len(old), len(new) - first)
    if n <= 0:
        return 0
    # the comparison may run on into `new`'s first `first` runs: at most those `n` count
    return min(next(compress(count(), map(is_not, reversed(old), reversed(new))), n), n)


def _adopt_tail(out: Scan, previous: Scan, stop: int, shift_runs: int, index: int, section: str | None) -> int:
    """Append what `previous` found in its runs from `stop + shift_runs` on (the very runs of
    `out.runs` from `stop` on, whose first block is `index`) to `out`, run and block indices
    moved to `out`'s; `section`: that of `out`'s last run before `stop` (a section group starts
    at `stop` when it differs). Returns the block index after the last run. What a scan finds
    in a run depends on the run alone, its indices and whether its section starts there."""
    j = stop + shift_runs
    begin = previous.starts[j]
    shift = index - begin
    back = -shift_runs
    out.starts.extend(map(shift.__add__, previous.starts[j:]))
    out.markers.extend(
        [(at + shift, marker) for at, marker in previous.markers[bisect_left(previous.markers, begin, key=_first) :]]
    )
    out.nested.extend(map(shift.__add__, previous.nested[bisect_left(previous.nested, begin) :]))
    out.nulls.extend(map(back.__add__, previous.nulls[bisect_left(previous.nulls, j) :]))
    out.empties.extend(
        [(r - shift_runs, at) for r, at in previous.empties[bisect_left(previous.empties, j, key=_first) :]]
    )
    calls = bisect_left(previous.calls, j)
    out.calls.extend(map(back.__add__, previous.calls[calls:]))
    out.call_positions.extend(previous.call_positions[calls:])
    out.hidden.extend(
        [(r - shift_runs, found) for r, found in previous.hidden[bisect_left(previous.hidden, j, key=_first) :]]
    )
    odd = previous.odd[bisect_left(previous.odd, j) :]
    for _ in odd:  # what walking those runs would have counted
        skipped("block_type")
    out.odd.extend(map(back.__add__, odd))
    first = out.runs[stop].section
    if first != section:
        out.groups.append((first, stop, index))
    groups = previous.groups[bisect_left(previous.groups, j + 1, key=_run_of) :]
    out.groups.extend([(name, r - shift_runs, at + shift) for name, r, at in groups])
    return previous.size + shift


def _count_taken(made: Scan, previous: Scan | None) -> None:
    """Count the blocks of no known kind `made` holds from another request's scan without
    walking them (`previous`'s leading runs it adopted, or all of them when `made` is that
    scan, `previous` `None`), as this request's first walk of them would have (`skipped`): a
    request counts the same malformed blocks whether or not it started from a kept body's
    scans (`LayoutCache.seed`). The trailing runs `_adopt_tail` copies count there."""
    if previous is None:
        taken = len(made.odd)
    else:
        base = made._base
        taken = bisect_left(previous.odd, base[1]) if base is not None and base[0] is previous else 0
    for _ in range(taken):
        skipped("block_type")


def _first(item: tuple[int, Any]) -> int:
    return item[0]


def _run_of(group: tuple[str, int, int]) -> int:
    return group[_GROUP_RUN]


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
    hidden: list[Any] = []
    looked = [part.hidden_calls for part in scans]
    offset = 0
    for part in scans:
        hidden.extend(found for _, found in part.hidden)
        runs.extend(part.runs)
        starts.extend([offset + s for s in part.starts] if offset else part.starts)
        for section, (first, end) in part.spans.items():
            known = spans.get(section)
            spans[section] = (known[0] if known else offset + first, offset + end)
        offset += part.size
    policy = looked[0] if looked and all(h == looked[0] for h in looked) else None
    return BlockView(runs, starts, offset, spans, (policy, hidden) if policy is not None else None)


class LayoutCache:
    """Per-request memo of layout + scan per prefix key (see the module docstring)."""

    __slots__ = ("_scans", "_policy", "_actions", "_seeded")

    def __init__(self) -> None:
        self._scans: dict[str, tuple[Any, Scan]] = {}
        self._policy: tuple[MarkerPolicy, frozenset[str]] | None = None
        self._actions: dict[Any, int] = {}
        self._seeded: set[str] = set()
        """Keys whose scan is still another request's (`seed`): the blocks of no known kind this
        request takes from it unwalked are counted as its own walk would have (`_count_taken`)."""

    def scans(
        self,
        adapter: ProviderAdapter,
        body: JSONObject,
        policy: MarkerPolicy,
        call_kinds: frozenset[str],
    ) -> list[tuple[str, Scan]]:
        """`(prefix key, scan)` for each prefix key in `body`, in render order."""
        if self._policy is None or self._policy != (policy, call_kinds):
            self._scans.clear()
            self._seeded.clear()
            self._policy = (policy, call_kinds)
            self._actions = _actions(policy, call_kinds)
        seeded = self._seeded
        out = []
        for key in adapter.prefix_keys:
            if key not in body:
                continue
            value = body[key]
            hit = self._scans.get(key)
            if hit is None or hit[0] is not value:
                previous = hit[1] if hit is not None else None
                redone = adapter.relayout(key, value, hit[0], hit[1].runs) if hit is not None else None
                runs, known = redone if redone is not None else (adapter.layout({key: value}), 0)
                made = _scan(runs, policy.key, self._actions, previous, known, policy.hidden_calls)
                if seeded and key in seeded:
                    seeded.discard(key)
                    _count_taken(made, previous)
                hit = self._scans[key] = (value, made)
            elif seeded and key in seeded:  # another request's scan of this very value, as it is
                seeded.discard(key)
                _count_taken(hit[1], None)
            out.append((key, hit[1]))
        return out

    def snapshot(self) -> tuple[tuple[MarkerPolicy, frozenset[str]], dict[str, tuple[Any, Scan]]] | None:
        """The policy and the scans per key made so far (a copy of the mapping), `None` before any."""
        if self._policy is None:
            return None
        return self._policy, dict(self._scans)

    def seed(self, snapshot: tuple[tuple[MarkerPolicy, frozenset[str]], dict[str, tuple[Any, Scan]]]) -> None:
        """Start from another request's `snapshot` (before any scan of this request): a key whose
        value is the same object reuses its scan, a changed one is laid out and scanned from its
        first changed run (`relayout`, `scan(..., previous)`)."""
        if self._policy is not None:
            return
        self._policy = snapshot[0]
        self._actions = _actions(*snapshot[0])
        self._scans = dict(snapshot[1])
        self._seeded = set(self._scans)

    def runs_of(self, key: str, value: Any) -> list[Run] | None:
        """The runs of the latest scan of `key` when it was of this very `value` object, else
        `None` (nothing is laid out here)."""
        hit = self._scans.get(key)
        return hit[1].runs if hit is not None and hit[0] is value else None

    def view(
        self,
        adapter: ProviderAdapter,
        body: JSONObject,
        policy: MarkerPolicy,
        call_kinds: frozenset[str],
    ) -> tuple[BlockView, dict[int, Any], list[int]]:
        """The body's `BlockView`, its markers by block index, and the blocks holding markers
        inside their `content`."""
        scans = [s for _, s in self.scans(adapter, body, policy, call_kinds)]
        marks: dict[int, Any] = {}
        nested: list[int] = []
        offset = 0
        for part in scans:
            for index, marker in part.markers:
                marks[offset + index] = marker
            nested.extend(offset + index for index in part.nested)
            offset += part.size
        return view_of(scans), marks, nested

    def system_messages(self, adapter: ProviderAdapter, body: JSONObject) -> bool:
        """True when a run of `body`'s system section is a message-array element (OpenAI head
        messages): only then can rewriting the system prompt add or remove messages. False for
        a system prompt outside the array (Anthropic `system`, Responses `instructions`)."""
        policy = adapter.marker_policy(body)
        for _, part in self.scans(adapter, body, policy, adapter.tool_shape.call_kinds):
            groups, runs = part.groups, part.runs
            for g, (section, first, _) in enumerate(groups):
                if section == "system":
                    end = groups[g + 1][_GROUP_RUN] if g + 1 < len(groups) else len(runs)
                    if any(run.message is not None for run in runs[first:end]):
                        return True
        return False

    def message_count(self, adapter: ProviderAdapter, body: JSONObject) -> int:
        """Distinct message-array elements in the prefix of `body` (`Run.message` values)."""
        policy = adapter.marker_policy(body)
        parts = self.scans(adapter, body, policy, adapter.tool_shape.call_kinds)
        seen: set[Any] = set()
        for _, part in parts:
            seen |= part.messages
        seen.discard(None)
        return len(seen)
