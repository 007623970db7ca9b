"""rawprefix: which leading message-array elements of a request are byte-identical to a recent one's.

An agent's next request is its previous one plus a few elements, so most of its raw body is
the previous raw body byte for byte. Comparing raw bytes (memory speed) tells which leading
elements of the message array (`messages`, `input`) are unchanged, before anything is walked:
their per-element results from the earlier request (digests, offsets) are reused instead of
serialising and digesting them again. The cost of a request then follows its new bytes.

Pure core, no I/O:
- `chunk_digests(raw)`: xxh3-128 of each full `CHUNK` bytes of `raw` (16 bytes each, joined);
  `end_digests(raw, stop)` likewise for the chunks counted back from offset `stop`.
- `shared_prefix(raw, state)`: how many leading bytes `raw` shares with the body `state` was
  built from: whole chunks by their digests, then byte-exact inside the earlier body's last
  partial chunk (`RawState.tail`) when every full chunk matched (the append case).
- `locate(raw, array_key, dumped, start, ends)`: the byte offsets of the array's elements in a
  raw body written compactly (no whitespace between tokens, as orjson, `JSON.stringify` and
  most SDKs write it): each element's compact orjson bytes must sit at the next offset,
  separated by `,`. A body written otherwise locates nothing and simply gets no reuse.
- `RawPrefixIndex`: the recent states, bounded (`MAX_STATES` in all, `MAX_PER_HEAD` per
  first chunk), per scope (the caller's: tenant and path), newest first; the parsed elements of
  the newest few (`MAX_PARSED_BYTES` of their raw bodies), for `parse_tail`, and of the newest
  `MAX_RECENT` its admission turned away, for `find_around`.
- `RawMatch` / `match_raw`: one request's comparison with the index, made once before parsing
  and read by the budget check (`chunk_counts`), the parse (`parse_tail`) and the session
  stage's message view.
- `chunk_counts(raw, match)`: the `{`+`[` and `,`+`{`+`[` counts of `raw` (the pipeline
  budget's nodes and values), the shared full chunks' taken from the matched state;
  `known_counts(raw, match)`: the pipeline budget's block counts of the leading elements the
  matched state vouches for (`RawState.counts`: kept with the state, so a session whose parsed
  body is no longer kept still counts only its new elements).
- `parse_tail(raw, state, k, elements, array_key, head)`: `orjson.loads(raw)` when its first
  `k` array elements are the earlier body's `elements`: only the bytes after element `k - 1`
  are parsed; the earlier element objects and the values before the array are reused (shared
  between the two requests' bodies: stages are copy-on-write and never edit them).
- `find_around` / `suffix_elements` / `parse_around`: the same for the trailing elements of
  the array when the edit is before them (a new session re-sending a recent conversation under
  another first message or system note, with its own session id after the array): a kept
  body's array end is found in `raw` by its last bytes (`RawState.anchor`), the chunks counted
  back from there are compared (`RawState.rdigests`), and its last elements lying in the shared
  bytes are the earlier objects; only the bytes before and after them are parsed (`Suffix`).
- `Kept`: what one of the newest bodies leaves in memory for the next request of its tenant:
  its parsed elements and head, its layout runs and its prompt scan (the next request lays out
  and scans only the runs that are not these objects: `proxy.prefix.scan_prompt`).

Soundness: element `i` is reused only when `raw[:ends[i]]` equals the earlier body's
`raw[:ends[i]]` (a JSON parser reading the same bytes is in the same state, so it is the same
top-level array's element `i` with the same value), the earlier body's array start was checked
to be the top-level key (`top_level_start`: its head parses as an object whose last key opens
the array), the new bytes hold no second `"<array_key>"` (a duplicate key would replace
the array) and the byte after element `i` is `,` or `]` (a number's bytes do not end it: `1`
then `.5` is another value). Around an edit (`parse_around`), element `i` from the end is reused
only when the chunks before the array's `]` up to its start have the earlier body's digests (or,
for the elements just before those chunks, its compact bytes equal the kept element's
`orjson.dumps` at that place) and unguessable stand-ins parse there as elements of the top-level
array (so the parser is where the earlier body's was: a duplicate or escaped array key, a number
continued, anything else parses differently and the body is parsed whole). The states keep
digests, offsets and counts; content only as `RawState.tail` (at most one chunk of the earlier
body, for the byte-exact comparison), `RawState.anchor` (65 bytes) and in `Kept` (the newest
bodies within `MAX_PARSED_BYTES`, and `MAX_RECENT` within half of it, in memory only).
"""

from __future__ import annotations

import secrets
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
import xxhash

from proxy.cache_admission import admits

CHUNK: Final = 4096
"""Bytes per compared chunk."""
MIN_BYTES: Final = 16 * CHUNK
"""Bodies below this size are not indexed (walking them costs less than the bookkeeping)."""
MAX_STATES: Final = 256
"""States kept in all (a 600 KB conversation's state is about 40 KB: digests and offsets)."""
MAX_PER_HEAD: Final = 64
"""States kept per first chunk (sessions of one tenant share their tools and system prompt)."""
MAX_PARSED_BYTES: Final = 4 * 1024 * 1024
"""Raw bytes of the newest bodies whose parsed elements are kept for `parse_tail` (their
objects take about twice that: 1.1 MB for a 540 KB body)."""
MAX_RECENT: Final = 2
"""Bodies the admission rule turned away (`keep_parsed`) still kept, the newest, for
`find_around` only (within half of `max_parsed_bytes` besides it)."""
_DIGEST: Final = 16
JSONObject = dict[str, Any]
_FOLLOW: Final = (b",", b"]")


def chunk_digests(raw: bytes) -> bytes:
    """xxh3-128 of each full `CHUNK` of `raw`, joined (16 bytes per chunk; a partial last chunk
    is left out)."""
    view = memoryview(raw)
    digest = xxhash.xxh3_128_digest
    return b"".join([digest(view[i : i + CHUNK]) for i in range(0, len(raw) - CHUNK + 1, CHUNK)])


def end_digests(raw: bytes, stop: int) -> bytes:
    """xxh3-128 of each full `CHUNK` of `raw[:stop]` counted back from `stop`, joined, the
    chunk ending at `stop` first (a partial first chunk is left out): two bodies whose bytes
    before their `stop`s are alike share their first entries whatever their lengths."""
    view = memoryview(raw)
    digest = xxhash.xxh3_128_digest
    return b"".join([digest(view[i - CHUNK : i]) for i in range(stop, CHUNK - 1, -CHUNK)])


ANCHOR: Final = 64
"""Bytes of an array's end (its last bytes and the `]`) looked for in a later body (`find_around`)."""


@dataclass(frozen=True, slots=True)
class RawState:
    """What one request's raw body leaves for the next: chunk digests, the element offsets and
    each located element's results (whatever the caller computes per element, in order)."""

    digests: bytes
    """`chunk_digests` of the body."""
    tail: bytes
    """The body's bytes after its last full chunk (fewer than `CHUNK`)."""
    ends: tuple[int, ...]
    """End offset (exclusive) of each located element of the array, in order."""
    columns: tuple[tuple[Any, ...], ...]
    """The caller's results per located element, as parallel columns (each `len(ends)` long)."""
    start: int = -1
    """Offset of the array's first element (`top_level_start`); -1 when not known."""
    nodes: array[int] = field(default_factory=lambda: array("q"))
    """`{` plus `[` in the body's bytes up to the end of each full chunk (cumulative)."""
    values: array[int] = field(default_factory=lambda: array("q"))
    """`,` plus `{` plus `[` likewise (`chunk_counts`)."""
    rdigests: bytes = b""
    """`end_digests(body, ends[-1])` when the located elements run to the array's end (the
    chunks counted back from its `]`), else empty."""
    anchor: bytes = b""
    """The body's last `ANCHOR` bytes before the array's `]`, and the `]`, with `rdigests`."""
    counts: array[int] = field(default_factory=lambda: array("q"))
    """`budget.block_counts` of the located elements (cumulative, one entry per element of
    `ends` or fewer; empty when not counted): a later body sharing the first `k` elements
    (`reusable`) counts only the rest, whether or not its parsed elements are still kept."""
    array_key: str = ""
    """The body key of the array `ends` locates (`messages`, `input`); empty when not known."""

    @property
    def size(self) -> int:
        """Length of the body the state was built from."""
        return len(self.digests) // _DIGEST * CHUNK + len(self.tail)


def _common(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two short byte strings (binary search on slices)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def shared_prefix(raw: bytes, digests: bytes, state: RawState) -> int:
    """Leading bytes `raw` (whose `chunk_digests` are `digests`) shares with `state`'s body."""
    old = state.digests
    n = min(len(old), len(digests)) // _DIGEST
    lo, hi = 0, n
    if old[: n * _DIGEST] == digests[: n * _DIGEST]:
        lo = n
    else:
        while lo < hi:  # chunks 0 .. lo-1 equal, the first differing one is in lo .. hi-1
            mid = (lo + hi) // 2
            if old[: (mid + 1) * _DIGEST] == digests[: (mid + 1) * _DIGEST]:
                lo = mid + 1
            else:
                hi = mid
        return lo * CHUNK
    shared = lo * CHUNK
    if lo == len(old) // _DIGEST and state.tail:
        shared += _common(state.tail, raw[shared : shared + len(state.tail)])
    return shared


def shared_suffix(rdigests: bytes, state: RawState) -> int:
    """Trailing bytes (whole chunks) a body with `end_digests` `rdigests` shares with
    `state`'s body."""
    old = state.rdigests
    n = min(len(old), len(rdigests)) // _DIGEST
    lo, hi = 0, n
    while lo < hi:  # the first lo chunks from the end are equal
        mid = (lo + hi + 1) // 2
        if old[: mid * _DIGEST] == rdigests[: mid * _DIGEST]:
            lo = mid
        else:
            hi = mid - 1
    return lo * CHUNK


@dataclass(frozen=True, slots=True)
class Suffix:
    """The trailing elements of a body that are a recent body's, byte for byte (`suffix_elements`)."""

    first: int
    """Index in the earlier body's array of the first reused element."""
    start: int
    """Offset in the new body of that element's first byte."""
    stop: int
    """Offset in the new body just past the last element (the array's closing `]`)."""
    delta: int
    """New offset minus earlier offset of the same bytes (the bodies' length difference)."""


def suffix_elements(
    raw: bytes, state: RawState, stop: int, suffix: int, after: int = 0, elements: Sequence[Any] = ()
) -> Suffix | None:
    """The earlier body's (`state`'s) trailing elements, from element `after` on, whose bytes
    `raw` holds just before its offset `stop` (where `raw`'s `]` stands for the earlier array's:
    `find_around`), wholly within the `suffix` bytes the two share there (`shared_suffix`),
    and the elements just before those whose compact bytes (`elements`: that body's parsed
    ones, located there) `raw` holds byte for byte before them (the shared bytes are whole
    chunks: an element across the first one's start is compared so); `None` when none is."""
    ends = state.ends
    if not ends or state.start < 0 or suffix <= 0 or raw[stop : stop + 1] != b"]":
        return None
    low = ends[-1] - suffix  # the earliest earlier offset inside the shared bytes
    lo, hi = after, len(ends)
    while lo < hi:  # the first element starting at or after `low`
        mid = (lo + hi) // 2
        begin = ends[mid - 1] + 1 if mid else state.start
        if begin >= low:
            hi = mid
        else:
            lo = mid + 1
    if lo >= len(ends):
        return None
    delta = stop - ends[-1]
    begin = (ends[lo - 1] + 1 if lo else state.start) + delta
    if raw[begin - 1 : begin] not in (b",", b"["):
        return None
    while lo > after and lo <= len(elements) and raw[begin - 1 : begin] == b",":
        data = orjson.dumps(elements[lo - 1])
        at = begin - 1 - len(data)
        if at < 1 or not raw.startswith(data, at) or raw[at - 1 : at] not in (b",", b"["):
            break
        lo, begin = lo - 1, at
    return Suffix(lo, begin, stop, delta)


def array_end(raw: bytes, ends: Sequence[int], known: dict[int, bytes] | None = None) -> tuple[bytes, bytes]:
    """`(RawState.rdigests, RawState.anchor)` of a body whose array elements end at `ends`:
    empty when they do not run to the array's `]`. `known`: `end_digests(raw, stop)` by `stop`,
    as `RawPrefixIndex.find_around` made them for this body (`RawMatch.end_digests`)."""
    if not ends or raw[ends[-1] : ends[-1] + 1] != b"]":
        return b"", b""
    stop = ends[-1]
    found = known.get(stop) if known is not None else None
    return end_digests(raw, stop) if found is None else found, raw[max(0, stop - ANCHOR) : stop + 1]


def reusable(state: RawState, shared: int, raw: bytes, array_key: str, is_array_proven: bool = False) -> int:
    """How many leading elements of `state` lie wholly in the first `shared` bytes of `raw`
    (and so are unchanged), 0 when the rest of `raw` names `array_key` again (module
    docstring: a duplicate key), or may name it with an escape (a backslash-u in the new
    bytes: `m` backslash-u`0065ssages` is `messages` too) unless `is_array_proven` (`parse_tail` found its
    sentinel in the array the body holds)."""
    ends = state.ends
    k = 0
    lo, hi = 0, len(ends)
    while lo < hi:  # the number of ends <= shared (ends increase)
        mid = (lo + hi) // 2
        if ends[mid] <= shared:
            lo = mid + 1
        else:
            hi = mid
    k = lo
    if k and raw[ends[k - 1] : ends[k - 1] + 1] not in _FOLLOW:
        k -= 1  # the byte after element k-1 is new; element k-2's `,` lies in the shared bytes
    if k and raw.find(b'"' + array_key.encode() + b'"', ends[k - 1]) >= 0:
        return 0
    if k and not is_array_proven and raw.find(b"\\u", ends[k - 1]) >= 0:
        return 0
    return k


def top_level_start(raw: bytes, array_key: str, first: bytes) -> int | None:
    """Offset of the first element (`first`: its compact bytes) of the top-level `array_key`
    array in `raw`, or `None` when it is not found there: the bytes before it must parse as an
    object whose last key is `array_key`, opening an array (`{...,"messages":[`)."""
    needle = b'"' + array_key.encode() + b'":[' + first
    at = raw.find(needle)
    if at < 0:
        return None
    start = at + len(needle) - len(first)
    try:
        head = orjson.loads(raw[:start] + b"]}")
    except orjson.JSONDecodeError:
        return None
    if type(head) is not dict or not head or next(reversed(head)) != array_key or head[array_key] != []:
        return None
    return start


def locate(raw: bytes, dumped: Sequence[bytes], start: int, ends: Sequence[int] = ()) -> list[int]:
    """End offsets of the array's elements after those already `ends`: element `len(ends) + j`
    must be `dumped[j]` (its compact bytes) at the next offset (`start` for the first, else one
    `,` after the previous end), and the last one is followed by `]`. Stops at the first
    element that is not where expected (its ends and later ones are unknown)."""
    out = list(ends)
    pos = start if not out else out[-1] + 1
    if out and raw[out[-1] : out[-1] + 1] != b",":
        return out
    for j, data in enumerate(dumped):
        if not raw.startswith(data, pos):
            break
        end = pos + len(data)
        follow = raw[end : end + 1]
        if follow == b",":
            out.append(end)
            pos = end + 1
            continue
        if follow == b"]" and j == len(dumped) - 1:
            out.append(end)
        break
    return out


_OTHER_BYTES: Final = bytes(b for b in range(256) if b not in b"{[,")
"""Every byte value but `{`, `[` and `,` (what `_counted` deletes)."""


def _counted(raw: bytes, start: int, stop: int) -> tuple[int, int]:
    """`({ + [, ,)` counted in `raw[start:stop]`: the slice copied (a chunk) and every other byte
    deleted in one pass, then the commas counted in what is left (three `bytes.count` passes
    over the slice took twice as long: 0.61 -> 0.29 ms for a 600 KB body)."""
    kept = raw[start:stop].translate(None, _OTHER_BYTES)
    commas = kept.count(b",")
    return len(kept) - commas, commas


def chunk_counts(raw: bytes, state: RawState | None, shared: int) -> tuple[array[int], array[int], int, int]:
    """`(nodes, values, total nodes, total values)`: the cumulative counts after each full chunk
    of `raw` (`RawState.nodes`, `RawState.values`) and over all of it. The full chunks within
    the first `shared` bytes, which `state`'s body holds too, are not counted again."""
    full = len(raw) // CHUNK
    nodes: array[int] = array("q")
    values: array[int] = array("q")
    reused = 0
    if state is not None:
        reused = min(shared // CHUNK, len(state.nodes), full)
        nodes = state.nodes[:reused]
        values = state.values[:reused]
    n = nodes[-1] if reused else 0
    v = values[-1] if reused else 0
    for j in range(reused, full):
        brackets, commas = _counted(raw, j * CHUNK, (j + 1) * CHUNK)
        n += brackets
        v += brackets + commas
        nodes.append(n)
        values.append(v)
    brackets, commas = _counted(raw, full * CHUNK, len(raw))
    return nodes, values, n + brackets, v + brackets + commas


def known_counts(
    raw: bytes, state: RawState | None, shared: int, is_array_proven: bool = False
) -> tuple[str, array[int]]:
    """`(array key, block counts)`: `state.counts` of the leading elements of `state`'s array
    that `raw` (sharing its first `shared` bytes with `state`'s body) holds unchanged
    (`reusable`), so the budget check walks only the elements after them; `("", empty)` when
    none is known."""
    if state is None or not state.counts or not state.array_key:
        return "", array("q")
    k = min(reusable(state, shared, raw, state.array_key, is_array_proven), len(state.counts))
    return (state.array_key, state.counts[:k]) if k else ("", array("q"))


@dataclass(slots=True)
class RawMatch:
    """One request's raw body against the index (`match_raw`): made once, before parsing."""

    index: RawPrefixIndex
    """The index compared with."""
    scope: str
    """Whose recent bodies it was compared with (tenant and path)."""
    digests: bytes
    """`chunk_digests` of the body."""
    state: RawState | None
    """The recent state sharing the longest prefix, or `None`."""
    shared: int
    """Leading bytes shared with `state`'s body."""
    nodes: array[int] | None = None
    """The body's cumulative counts (`chunk_counts`), once the budget check made them."""
    values: array[int] | None = None
    kept: Kept | None = None
    """What `state`'s body left in memory (`RawPrefixIndex.parsed`), looked up once."""
    head: JSONObject | None = None
    """`parse_head` of this body when the parse reused it (`parse_tail`)."""
    fresh: Kept | None = None
    """What this body leaves for the next request (the message view made it)."""
    scans: Any = None
    """This body's `LayoutCache.snapshot` as the session stage made it (optimise mode)."""
    reused: int = 0
    """Leading array elements `parse` took from `kept` (`reused_parse`: the very objects)."""
    counts: tuple[list[Any], array[int]] | None = None
    """`(the body's message array, its budget.block_counts)`, once the budget check made them."""
    around: Kept | None = None
    """The kept body whose trailing elements `parse` reused (`find_around`, `parse_around`)."""
    suffix: Suffix | None = None
    """Which of `around`'s elements, and where they are in this body."""
    end_digests: dict[int, bytes] | None = None
    """`end_digests(raw, stop)` by `stop`, as `find_around` made them (`array_end` reads them)."""


def match_raw(index: RawPrefixIndex, scope: str, raw: bytes) -> RawMatch | None:
    """`raw` against `index` within `scope`; `None` for a body under `MIN_BYTES` (not indexed)."""
    if len(raw) < MIN_BYTES:
        return None
    digests = chunk_digests(raw)
    state, shared = index.match(scope, digests, raw)
    kept = index.parsed(state) if state is not None else None
    return RawMatch(index, scope, digests, state, shared, kept=kept)


_SENTINEL: Final = secrets.token_hex(16)
"""Stands in for the reused elements in `parse_tail` (unguessable: a later duplicate of the
array key, however its name is escaped, cannot hold it)."""
_SENTINEL_BYTES: Final = orjson.dumps(_SENTINEL)
_SUFFIX: Final = secrets.token_hex(16)
"""Stands in for the reused trailing elements in `parse_around`."""
_SUFFIX_BYTES: Final = orjson.dumps(_SUFFIX)


def parse_head(raw: bytes, start: int, array_key: str) -> JSONObject | None:
    """The top-level members before the array (`raw[:start]`, the array key last, as `[]`)."""
    try:
        head = orjson.loads(raw[:start] + b"]}")
    except orjson.JSONDecodeError:
        return None
    if type(head) is not dict or head.get(array_key) != []:
        return None
    return head


def parse_tail(
    raw: bytes, state: RawState, k: int, elements: Sequence[Any], array_key: str, head: JSONObject | None
) -> tuple[JSONObject, JSONObject] | None:
    """`(orjson.loads(raw), head)`: the same value and top-level key order, given that the
    first `k` elements of the top-level `array_key` array are `elements` (`reusable` elements
    of the body `state` was built from) and `head` is `parse_head` of the bytes before the array
    (`None`: parsed here). Only the bytes from the end of element `k - 1` on are parsed, with an
    unguessable string standing in for the elements; the earlier element objects and the head's
    values are reused (shared between the two requests' bodies: stages are copy-on-write).
    `None` when `raw` is not such a body (or not JSON): the caller parses it whole.

    Sound because the parser is in the same state after `{"<array_key>":[` + one value as after
    `raw[:ends[k-1]]` as far as the rest goes (inside an object, inside its array, after a
    value; the byte that follows is `,` or `]`: `reusable`), so the rest parses as it does in
    full, and its members update the head's as a full parse's later duplicates would (a key
    keeps its first position and takes its last value)."""
    if not 0 < k <= len(state.ends) or state.start < 0 or k > len(elements):
        return None
    end = state.ends[k - 1]
    if raw[end : end + 1] not in _FOLLOW:
        return None
    if head is None:
        head = parse_head(raw, state.start, array_key)
        if head is None:
            return None
    try:
        tail = orjson.loads(b'{"' + array_key.encode() + b'":[' + _SENTINEL_BYTES + raw[end:])
    except orjson.JSONDecodeError:
        return None
    if type(tail) is not dict:
        return None
    items = tail.get(array_key)
    if type(items) is not list or not items or items[0] != _SENTINEL:
        return None
    body = dict(head)
    body.update(tail)
    body[array_key] = [*elements[:k], *items[1:]]
    return body, head


def parse_around(
    raw: bytes,
    state: RawState,
    k: int,
    suffix: Suffix,
    elements: Sequence[Any],
    array_key: str,
    head: JSONObject | None,
) -> tuple[JSONObject, JSONObject | None] | None:
    """`(orjson.loads(raw), head)` given that the first `k` (possibly 0) and the trailing
    elements from `suffix.first` of the top-level `array_key` array are `elements` (`state`'s
    body's, as `parse_tail`) and `raw[suffix.start:suffix.stop]` holds the trailing ones' bytes
    (`suffix_elements`). Only the bytes before the reused elements (after element `k - 1` when
    `k`, with `head`) and after them are parsed, with unguessable strings standing in for them.
    `None` when `raw` is not such a body (the caller parses it whole).

    Sound because each stand-in parses as an element of the body's top-level array (found
    there, once: nobody can write it) and the reused bytes are whole compact values separated
    by `,` (where the earlier body held them, located), which parse to the same values in any
    array position."""
    if not 0 <= suffix.first < len(elements) <= len(state.ends) or k > suffix.first:
        return None
    end = state.ends[k - 1] if k else 0
    if end > suffix.start - 1 or (k and raw[end : end + 1] not in _FOLLOW):
        return None
    if k and head is None:
        head = parse_head(raw, state.start, array_key)
        if head is None:
            return None
    opening = b'{"' + array_key.encode() + b'":[' + _SENTINEL_BYTES if k else b""
    try:
        parsed = orjson.loads(
            b"".join((opening, raw[end : suffix.start], _SUFFIX_BYTES, raw[suffix.stop :]))
        )
    except orjson.JSONDecodeError:
        return None
    if type(parsed) is not dict:
        return None
    items = parsed.get(array_key)
    if type(items) is not list or not items or items[-1] != _SUFFIX or (k and items[0] != _SENTINEL):
        return None
    middle = items[1:-1] if k else items[:-1]
    if k:
        assert head is not None
        body = dict(head)
        body.update(parsed)
    else:
        body = parsed
    body[array_key] = [*elements[:k], *middle, *elements[suffix.first :]]
    return body, head


@dataclass(slots=True)
class Kept:
    """What a recent body leaves in memory for the next request of its tenant (newest few)."""

    state: RawState
    elements: tuple[Any, ...]
    """The parsed elements of the array located in the body (`RawState.ends`), never edited."""
    array_key: str
    head: JSONObject | None = None
    """`parse_head` of the body, once a later request needed it."""
    runs: dict[str, tuple[Any, list[Any]]] | None = None
    """The client's layout runs by prefix key, `(value, runs)` (`Exchange.client_runs`)."""
    scan: Any = None
    """The prompt scan of the body as sent (`proxy.measure.sent_prompt`)."""
    scans: Any = None
    """The rewriting stages' layout scans of the client's body (`LayoutCache.snapshot`)."""
    scope: str = ""
    """Whose body it was (`RawMatch.scope`): only requests of that scope reuse it."""
    boundaries: tuple[bytes, tuple[bytes, ...]] | None = None
    """`(head digest, MessageView.boundaries of elements)` when the body had no system-section
    elements: the next request's view chains only its new elements onto them when its head
    digest is the same (`proxy.pipeline.replay.view_messages`)."""
    at: int = 0
    """`RawPrefixIndex`'s clock when it was kept or last matched (`keep_parsed`: its idle time)."""
    sidecars: Any = None
    """The session record's sidecars built for the body as sent, when they hold positions
    `0..n-1` (`proxy.pipeline.session.build_record`): a later new session re-sending these
    elements at the same positions records the equal sidecars as these very objects
    (`donor_matches`), sharing their bytes (memory: about the body's size, held while the body
    is kept, as its parsed elements are)."""


class RawPrefixIndex:
    """Recent `RawState`s, per scope and first chunk (module docstring); LRU-bounded.

    The kept bodies are bounded in bytes by `proxy.cache_admission.admits`, so that more long
    sessions than fit do not evict each other in turn. The newest `MAX_RECENT` bodies it turned
    away are kept besides, for `find_around` only: sessions whose own bodies are not kept, taking
    turns in step (the same conversation under other first messages), read the one just before
    them there (a held body is of a session whose turn came earlier or later in the round: its
    array's end is not theirs). Its clock counts the bodies the index is asked to keep; a
    session's `gap` is the clock since its previous body was remembered (`since`)."""

    def __init__(
        self, max_states: int = MAX_STATES, max_per_head: int = MAX_PER_HEAD, max_parsed_bytes: int = MAX_PARSED_BYTES
    ) -> None:
        self.max_states = max_states
        self.max_per_head = max_per_head
        self.max_parsed_bytes = max_parsed_bytes
        self._heads: OrderedDict[tuple[str, bytes], list[RawState]] = OrderedDict()
        self._count = 0
        self._parsed: OrderedDict[int, Kept] = OrderedDict()
        self._parsed_bytes = 0
        self._recent: OrderedDict[int, Kept] = OrderedDict()
        """The newest bodies the admission turned away (`MAX_RECENT`), oldest first."""
        self._recent_bytes = 0
        self._clock = 0
        """Bodies asked to be kept so far (`keep_parsed`)."""
        self._seen: dict[int, tuple[RawState, int]] = {}
        """`id(state)` -> the state and the clock when it was remembered (`since`)."""

    def parsed(self, state: RawState) -> Kept | None:
        """What `state`'s body left in memory (`Kept`), when still kept."""
        entry = self._parsed.get(id(state))
        if entry is None or entry.state is not state:
            return None
        self._parsed.move_to_end(id(state))
        entry.at = self._clock
        return entry

    def since(self, state: RawState | None) -> int | None:
        """How many bodies the index was asked to keep since `state` was remembered; `None`
        when it does not hold `state`."""
        seen = self._seen.get(id(state)) if state is not None else None
        return self._clock - seen[1] if seen is not None and seen[0] is state else None

    def keep_parsed(
        self,
        state: RawState,
        elements: tuple[Any, ...],
        array_key: str,
        head: JSONObject | None = None,
        scope: str = "",
        gap: int | None = None,
        replaces_kept: bool = True,
    ) -> Kept | None:
        """Keep `elements` (the parsed array of `state`'s body of `scope`: never edited) for
        `parse_tail` and `parse_around`, within `max_parsed_bytes` of raw body bytes, by the
        class docstring's admission rule: `replaces_kept` when the session's previous body was
        still kept at the match (`RawMatch.kept`), else `gap` is how long ago its previous body
        was remembered (`since`; `None`: no session known, `admits` counts it as away for as
        many bodies as are held). Returns the body's `Kept` (this
        request's located elements: `proxy.pipeline.serialise` copies them) whether or not the
        index holds it (`parsed`); `None` when the body is larger than the whole budget."""
        if state.size > self.max_parsed_bytes:
            return None
        self._clock += 1
        kept = Kept(state, elements, array_key, head, scope=scope, at=self._clock)
        over = self._parsed_bytes + state.size - self.max_parsed_bytes
        held = ((k.at, k.state.size) for k in self._parsed.values())  # least recently used first
        if not replaces_kept and not admits(over, gap, self._clock, held, len(self._parsed)):
            self._keep_recent(kept)  # not held: the next request of its session parses its body whole
            return kept
        self._parsed[id(state)] = kept
        self._parsed_bytes += state.size
        while self._parsed_bytes > self.max_parsed_bytes:
            _, oldest = self._parsed.popitem(last=False)
            self._parsed_bytes -= oldest.state.size
        return kept

    def _keep_recent(self, kept: Kept) -> None:
        """Keep `kept` (turned away) among the newest `MAX_RECENT`, within half of
        `max_parsed_bytes`, the oldest leaving first."""
        size = kept.state.size
        if size > self.max_parsed_bytes // 2:
            return
        self._recent[id(kept.state)] = kept
        self._recent_bytes += size
        while len(self._recent) > MAX_RECENT or self._recent_bytes > self.max_parsed_bytes // 2:
            _, oldest = self._recent.popitem(last=False)
            self._recent_bytes -= oldest.state.size

    def find_around(
        self, scope: str, raw: bytes, digests: dict[int, bytes] | None = None
    ) -> tuple[Kept, int, int] | None:
        """`(kept, stop, shared)`: the kept body of `scope` (held, newest first, then the
        newest turned away: `MAX_RECENT`) whose array's end `raw` holds (`RawState.anchor`,
        last occurrence) at offset `stop` (its `]`) with the most bytes before it in common
        (`shared`, whole chunks: `shared_suffix`), the first such; `None` when none.
        `digests` gets the `end_digests(raw, stop)` it made, by `stop`."""
        best: tuple[Kept, int, int] | None = None
        digests = {} if digests is None else digests
        for kept in (*reversed(self._parsed.values()), *reversed(self._recent.values())):
            state = kept.state
            if kept.scope != scope or not state.anchor:
                continue
            at = raw.rfind(state.anchor)
            if at < 0:
                continue
            stop = at + len(state.anchor) - 1
            found = digests.get(stop)
            if found is None:
                found = digests[stop] = end_digests(raw, stop)
            shared = shared_suffix(found, state)
            if shared and (best is None or shared > best[2]):
                best = (kept, stop, shared)
        return best

    def drop_parsed(self, state: RawState) -> None:
        """Forget what `state`'s body left in memory (held or turned away)."""
        entry = self._parsed.pop(id(state), None)
        if entry is not None:
            self._parsed_bytes -= entry.state.size
        entry = self._recent.pop(id(state), None)
        if entry is not None:
            self._recent_bytes -= entry.state.size

    def __len__(self) -> int:
        return self._count

    def match(self, scope: str, digests: bytes, raw: bytes) -> tuple[RawState | None, int]:
        """The state sharing the longest prefix with `raw` (chunk `digests`), and that length."""
        if not digests:
            return None, 0
        states = self._heads.get((scope, digests[:_DIGEST]))
        if not states:
            return None, 0
        best: RawState | None = None
        best_shared = 0
        for state in reversed(states):  # newest first: an append matches the newest at once
            shared = shared_prefix(raw, digests, state)
            if shared > best_shared:
                best, best_shared = state, shared
                if shared >= state.size:
                    break
        return best, best_shared

    def remember(self, scope: str, state: RawState, replaces: RawState | None = None) -> None:
        """Keep `state`; `replaces` (the state it was built on, when the new one covers all of
        its elements) is dropped."""
        if not state.digests:
            return
        key = (scope, state.digests[:_DIGEST])
        states = self._heads.get(key)
        if states is None:
            states = self._heads[key] = []
        else:
            self._heads.move_to_end(key)
        if replaces is not None:
            self.drop_parsed(replaces)
            for i, held in enumerate(states):
                if held is replaces:
                    self._seen.pop(id(held), None)
                    del states[i]
                    self._count -= 1
                    break
        states.append(state)
        self._seen[id(state)] = (state, self._clock)
        self._count += 1
        if len(states) > self.max_per_head:
            self.drop_parsed(states[0])
            self._seen.pop(id(states[0]), None)
            del states[0]
            self._count -= 1
        while self._count > self.max_states:
            _, oldest = self._heads.popitem(last=False)
            self._count -= len(oldest)
            for dropped in oldest:
                self.drop_parsed(dropped)
                self._seen.pop(id(dropped), None)
