"""Prefix digests: where two requests stop sharing a prefix, in blocks, bytes and tokens.

Pure functions over the adapter's `prefix_blocks` (the provider's render order).

- Block bytes: orjson bytes of the block value with marker keys (`cache_control`,
  `prompt_cache_breakpoint`) removed at the block and inside a nested `content` list: markers
  are not part of what a provider caches. Key order is kept (providers hash bytes, so a
  reordered key is a real change).
- String shorthand (`canonical_value`, the one normalisation point of every digest: these
  block bytes, and the message digests of `proxy.pipeline.replay` behind session inference,
  replay matching and `history_rewritten`): a string `system` or string message content is
  shorthand for one text block (Messages API: `content: "x"` means
  `[{"type": "text", "text": "x"}]`), and the provider renders both forms identically; a hit
  needs identical rendered content, not identical JSON (docs/provider-rules.md 1.5). So a string block
  is digested as the bytes of `{"type":"text","text":...}` (`digest_bytes`), equal to a
  one-text-block list whose block has exactly those two keys in that order, markers aside.
  Any other key (`citations`) or another block type is a real difference. OpenAI's
  `input_text` / `output_text` parts and a `tool_result`'s own string `content` are not
  folded (no client seen switching them; a missed equality costs a prediction, never a
  wrong byte). Byte offsets keep counting the block as sent (a string's own JSON).
- Explicit nulls (`null_free`): a block object's null-valued key is digested as absent (the
  APIs read a null optional field as not given: `proxy.nulls`), so a block re-sent in an SDK's
  `model_dump()` form (`"citations": null`) chains as it did; nulls inside its values are data.
  Offsets again count the block as sent.
- Block digest `d_i = xxh3_128(section, role, message boundary, digest_bytes)`; chain digest
  `c_i = xxh3_128(c_{i-1} || d_i)`. Two requests share a prefix up to
  block `i` exactly when their chain digests at `i` are equal.
- Offsets are cumulative canonical byte lengths; tokens are estimated as bytes / 4, rounded up
  (`estimate_tokens`), a deliberately simple proxy-side estimate, independent of the simulator.
- `scan_prompt(runs)` is the hot-path twin of `chain_blocks(prefix_blocks(...))`: one pass over
  an adapter's `layout` runs (flattened, exactly its `prefix_blocks`) giving the same chain plus
  what measurement and the session record read (kinds, values, marked blocks), without building
  a `Block` per block (a `Block` costs about 1 us; a 600 KB body has ~1000 blocks). Its `blocks`
  is a lazy `Sequence[Block]` (`RunBlocks`) that builds only the blocks asked for.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, count, islice
from operator import attrgetter, is_not
from typing import Any, Final

import orjson
import xxhash

from proxy.frozen import fast_init
from proxy.nulls import block_without_nulls
from proxy.providers import MARKER_KEYS
from proxy.providers.base import KNOWN_NAMES, Block, Run, RunBlocks, dotted, run_kind  # noqa: F401 - re-exported

DIGEST_SIZE: Final = 16
BYTES_PER_TOKEN: Final = 4
_MARKER_NEEDLES: Final = tuple(f'"{key}"'.encode() for key in sorted(MARKER_KEYS))


def may_hold_marker(data: bytes) -> bool:
    """Whether orjson bytes may hold a marker key anywhere (a quoted marker name occurs).

    When not, removing markers from the value changes nothing, so its bytes are already the
    stripped bytes. A string equal to a marker name is a false positive (the caller strips).
    """
    return _MARKER_NEEDLES[0] in data or _MARKER_NEEDLES[1] in data


def estimate_tokens(n_bytes: int) -> int:
    """Rough token estimate of `n_bytes` canonical bytes (ceil(bytes / 4))."""
    return -(-n_bytes // BYTES_PER_TOKEN)


_known: Final = KNOWN_NAMES.get
"""A block's kind as the shared string (`proxy.providers.base.KNOWN_NAMES`): the scan's kinds
outlive the body in the recent sessions' maps."""
_TEXT_HEAD: Final = b'{"type":"text","text":'
"""`orjson.dumps({"type": "text", "text": s})` is `_TEXT_HEAD + orjson.dumps(s) + b"}"`."""


def text_block(text: str) -> dict[str, str]:
    """The one text block a string content (or string `system`) is shorthand for."""
    return {"type": "text", "text": text}


def canonical_value(value: Any) -> Any:
    """`value` in the form every digest compares (module docstring, string shorthand): a string
    is its text block; a message (an object with a `role`) whose `content` is a string has it
    as a one-block list. Anything else is returned as is; `value` is never mutated."""
    if isinstance(value, str):
        return text_block(value)
    if isinstance(value, dict) and "role" in value:
        content = value.get("content")
        if isinstance(content, str):
            return {**value, "content": [text_block(content)]}
    return value


def digest_bytes(value: Any, data: bytes) -> bytes:
    """What a block's digest covers, given its bytes `data` (`value_bytes(value)`): the same
    bytes, except a string block is written as its text block (`canonical_value`) and a block
    object's null-valued keys are left out (`null_free`)."""
    if isinstance(value, str):
        return _TEXT_HEAD + data + b"}"
    return null_free(value, data) if isinstance(value, dict) else data


def null_free(value: Any, data: bytes) -> bytes:
    """The digested bytes of block `value` whose bytes are `data` (`value_bytes(value)`): its
    bytes without its null-valued keys (`proxy.nulls.block_without_nulls`: the APIs read a null
    optional field of a block as the field absent, so `model_dump()`'s `"citations": null` is
    the same block), `data` itself when it has none. Nulls inside its values are data."""
    bare = block_without_nulls(value)
    return data if bare is value else value_bytes(bare)


def _strip_markers(value: Any) -> Any:
    if not isinstance(value, dict) or not (MARKER_KEYS & value.keys() or "content" in value):
        return value
    out = {k: v for k, v in value.items() if k not in MARKER_KEYS}
    content = out.get("content")
    if isinstance(content, list) and any(isinstance(p, dict) and MARKER_KEYS & p.keys() for p in content):
        out["content"] = [
            {k: v for k, v in p.items() if k not in MARKER_KEYS} if isinstance(p, dict) else p for p in content
        ]
    return out


def block_bytes(block: Block) -> bytes:
    """Canonical bytes of one block (markers removed, key order kept)."""
    return value_bytes(block.value)


def value_bytes(value: Any) -> bytes:
    """Canonical bytes of a block value (markers removed, key order kept)."""
    data = orjson.dumps(value)
    if isinstance(value, dict) and may_hold_marker(data):
        return orjson.dumps(_strip_markers(value))
    return data


@fast_init
@dataclass(frozen=True, slots=True)
class PrefixChain:
    """Chain digests and byte offsets of one request's prefix blocks."""

    chain: bytes
    """Concatenated 16-byte chain digests, one per block."""
    ends: tuple[int, ...]
    """Cumulative canonical byte offset at the end of each block."""

    def __len__(self) -> int:
        return len(self.ends)

    def digest(self, i: int) -> bytes:
        return self.chain[i * DIGEST_SIZE : (i + 1) * DIGEST_SIZE]

    @property
    def total_bytes(self) -> int:
        return self.ends[-1] if self.ends else 0

    def bytes_before(self, i: int) -> int:
        """Canonical bytes in blocks `0 .. i-1`."""
        return self.ends[i - 1] if i > 0 else 0


def chain_blocks(blocks: Sequence[Block]) -> PrefixChain:
    """Digest `blocks` in order (see module docstring)."""
    out = bytearray()
    ends: list[int] = []
    previous = b""
    total = 0
    last_message: int | None = None
    for block in blocks:
        data = block_bytes(block)
        boundary = b"1" if block.message_index != last_message else b"0"
        last_message = block.message_index
        head = f"{block.section}\x00{block.role or ''}\x00".encode() + boundary
        d = xxhash.xxh3_128_digest(head + b"\x00" + digest_bytes(block.value, data))
        previous = xxhash.xxh3_128_digest(previous + d)
        out += previous
        total += len(data)
        ends.append(total)
    return PrefixChain(bytes(out), tuple(ends))


def shared_blocks(old: PrefixChain, new: PrefixChain) -> int:
    """Number of leading blocks two chains share (binary search on chain digests)."""
    lo, hi = 0, min(len(old), len(new))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if old.digest(mid - 1) == new.digest(mid - 1):
            lo = mid
        else:
            hi = mid - 1
    return lo


@fast_init
@dataclass(frozen=True, slots=True)
class PromptScan:
    """One request's blocks, digested once (`scan_prompt`)."""

    chain: PrefixChain
    """Equal to `chain_blocks(prefix_blocks(...))`."""
    blocks: RunBlocks
    """The blocks themselves, built on access."""
    values: list[Any]
    """Block values in prefix order (`blocks[i].value` without building the block)."""
    kinds: list[str]
    """Block kinds in prefix order (`blocks[i].kind`)."""
    marked: tuple[int, ...]
    """Blocks whose value is an object with a non-null marker key (`cache_control`,
    `prompt_cache_breakpoint`), in order."""
    tools: int
    """Blocks in the `tools` section (they come first)."""
    digests: bytes = b""
    """Each block's digest `d_i` (16 bytes each, joined) when the scan computed or copied all
    of them, else empty (blocks copied from a record's chain: `Reuse`)."""


def _has_marker(value: dict[str, Any]) -> bool:
    """Whether `_strip_markers` would remove anything from the block object `value`."""
    if "cache_control" in value or "prompt_cache_breakpoint" in value:
        return True
    content = value.get("content")
    if type(content) is list:
        for part in content:
            if isinstance(part, dict) and ("cache_control" in part or "prompt_cache_breakpoint" in part):
                return True
    return False


@dataclass(frozen=True, slots=True)
class Reuse:
    """What an earlier request's chain lets `scan_prompt` skip: the incremental part of the view.

    `same` leading elements of the body's `array_key` array (`messages`, `input`) are known to
    hold, marker-free, the very bytes the request chained in `previous` held at those positions
    (their xxh3-128 equal the earlier record's sidecar digests: `proxy.measure.reuse_for`).
    When every block before them chains as in `previous` (one comparison of digest bytes), the
    blocks of those elements are not serialised or digested again: their chain digests and
    byte offsets are the earlier request's. Values, kinds and markers are still read from this
    body (markers are not part of the bytes compared)."""

    previous: PrefixChain
    array_key: str
    same: int


def _copy_stretch(
    reuse: Reuse | None, start: int, stop: int, out: bytearray, ends: list[int]
) -> tuple[bytearray, list[int], int, bytes]:
    """Append blocks `start .. stop - 1` of `reuse.previous` to a scan's chain and offsets;
    returns them with the running total and the last chain digest."""
    assert reuse is not None
    earlier = reuse.previous
    out += earlier.chain[start * DIGEST_SIZE : stop * DIGEST_SIZE]
    ends.extend(earlier.ends[start:stop])
    return out, ends, earlier.ends[stop - 1], earlier.chain[(stop - 1) * DIGEST_SIZE : stop * DIGEST_SIZE]


def _reuse_run(
    run: Run,
    items: Sequence[Any],
    fixed: str | None,
    index: int,
    values: list[Any],
    kinds: list[str],
    marked: list[int],
) -> None:
    """`scan_prompt`'s bookkeeping for a run whose digests are reused: values, kinds, markers."""
    values.extend(items)
    if fixed is not None:
        kinds.extend([fixed] * len(items))
    for offset, value in enumerate(items):
        if type(value) is dict:
            # membership first: most blocks hold no marker key at all
            if ("cache_control" in value or "prompt_cache_breakpoint" in value) and (
                value.get("cache_control") is not None or value.get("prompt_cache_breakpoint") is not None
            ):
                marked.append(index + offset)
            if fixed is None:
                kind = value.get("type")
                kinds.append(_known(kind, kind) if type(kind) is str else "unknown")
        elif isinstance(value, dict):
            if value.get("cache_control") is not None or value.get("prompt_cache_breakpoint") is not None:
                marked.append(index + offset)
            if fixed is None:
                kinds.append(run_kind(run, value))
        elif fixed is None:
            kinds.append("text" if isinstance(value, str) else run_kind(run, value))


def _resume(earlier: PromptScan, runs: Sequence[Run]) -> int:
    """How many leading runs of `runs` are `earlier`'s own run objects (runs are never edited
    and bodies are copy-on-write: the same run holds the same blocks)."""
    old = earlier.blocks.runs
    return next(compress(count(), map(is_not, old, runs)), min(len(old), len(runs)))


def resumes(earlier: PromptScan, runs: Sequence[Run]) -> bool:
    """Whether `scan_prompt(runs, reuse, earlier)` copies runs from `earlier` (and so ignores
    `reuse`)."""
    return bool(runs) and bool(earlier.blocks.runs) and earlier.blocks.runs[0] is runs[0]


def scan_prompt(
    runs: Sequence[Run],
    reuse: Reuse | None = None,
    earlier: PromptScan | None = None,
    around: PromptScan | None = None,
) -> PromptScan:
    """Digest the blocks of `runs` (an adapter's `layout`) in one pass (see module docstring);
    with `reuse`, the blocks it vouches for are copied from the earlier chain (`Reuse`); with
    `earlier` (a scan of another body version whose runs may be these very objects: the session's
    recent request, `proxy.pipeline.rawprefix.Kept.scan`), the leading runs that are its own are
    not walked at all: their digests, offsets, values, kinds and markers are copied. With
    `around` (a scan with `PromptScan.digests` of a body whose blocks may be these very objects
    anywhere: the kept body `parse` reused elements of, `rawprefix.RawMatch.around`), a run whose
    value is the object one of its runs holds, in the same section, role, kind and message
    boundary, takes its block digests and sizes from there and is only chained (without
    `reuse` or a resumed `earlier`), consecutive such blocks as one stretch. The result is the
    same either way (property tests hold it)."""
    resumed = _resume(earlier, runs) if earlier is not None else 0
    if resumed:
        assert earlier is not None
        return _scan_prompt(runs, None, earlier, resumed)
    if reuse is None and around is not None and around.digests:
        return _scan_prompt(runs, None, None, 0, around)
    return _scan_prompt(runs, reuse, None, 0)


def _is_boundary(runs: Sequence[Run], j: int) -> bool:
    """Whether run `j`'s first block starts its message (as `_scan_prompt` decides it: the
    message differs from that of the last run before it holding a block)."""
    message = runs[j].message
    if j and (not runs[j - 1].is_list or runs[j - 1].value):  # the usual case: the run before holds a block
        return runs[j - 1].message != message
    for i in range(j - 1, -1, -1):
        run = runs[i]
        if not run.is_list or run.value:
            return run.message != message
    return message is not None


_SECTION: Final = attrgetter("section")
_VALUE: Final = attrgetter("value")


def _same_runs(runs: Sequence[Run], position: int, around_runs: Sequence[Run], j: int) -> int:
    """How many runs from `runs[position]` on are `around_runs[j]` on, the very objects (runs
    are never edited: the same blocks, heads and message boundaries after the first), up to
    the first of the `tools` section (whose blocks the scan counts); at least 1 (the caller
    checked the first)."""
    n = min(len(runs) - position, len(around_runs) - j)
    stretch = next(compress(count(), map(is_not, islice(runs, position, None), islice(around_runs, j, None))), n)
    sections = list(map(_SECTION, islice(runs, position, position + stretch)))
    if "tools" in sections:
        stretch = sections.index("tools")
    return max(stretch, 1)


def _take(
    around: PromptScan,
    taken: tuple[int, int, int],
    out: bytearray,
    ends: list[int],
    total: int,
    previous: bytes,
    block_digests: bytearray,
    values: list[Any],
    kinds: list[str],
    marked: list[int],
) -> tuple[int, bytes]:
    """Append blocks `first .. stop - 1` of `around` (`taken`: they are the scan's blocks from
    `index` on, the very values with the same heads) to a scan: their digests chained, their
    sizes, values, kinds and markers copied; returns the running total and the last chain digest."""
    first, stop, index = taken
    found = around.digests[first * DIGEST_SIZE : stop * DIGEST_SIZE]
    digest = xxhash.xxh3_128_digest
    for at in range(0, len(found), DIGEST_SIZE):
        previous = digest(previous + found[at : at + DIGEST_SIZE])
        out += previous
    block_digests += found
    old_ends = around.chain.ends
    shift = total - (old_ends[first - 1] if first else 0)
    ends.extend(map(shift.__add__, old_ends[first:stop]))
    values.extend(around.values[first:stop])
    kinds.extend(around.kinds[first:stop])
    old_marked = around.marked
    low = bisect_left(old_marked, first)
    if low < len(old_marked) and old_marked[low] < stop:
        marked.extend(m + index - first for m in old_marked[low : bisect_left(old_marked, stop)])
    return ends[-1], previous


def _scan_prompt(
    runs: Sequence[Run], reuse: Reuse | None, base: PromptScan | None, resumed: int, around: PromptScan | None = None
) -> PromptScan:
    dumps = orjson.dumps
    digest = xxhash.xxh3_128_digest
    out = bytearray()
    ends: list[int] = []
    starts: list[int] = []
    values: list[Any] = []
    kinds: list[str] = []
    marked: list[int] = []
    heads: dict[tuple[str, str | None, bool], bytes] = {}
    previous = b""
    total = 0
    tools = 0
    last_message: int | None = None
    index = 0
    reusing = reuse is not None and reuse.same > 0
    earlier_blocks = len(reuse.previous.ends) if reuse is not None else 0
    array_key, same = (reuse.array_key, reuse.same) if reuse is not None else ("", 0)
    reused_from = reused_until = -1
    """Blocks `reused_from .. reused_until - 1` come from `reuse.previous`."""
    block_digests = bytearray()
    is_complete = reuse is None
    """Every block's digest is in `block_digests` (none was copied from a record's chain)."""
    around_runs: Sequence[Run] = around.blocks.runs if around is not None else ()
    around_index: dict[int, int] | None = None
    """`id(run.value)` -> its run in `around`, made on the first run off `around`'s order."""
    cursor = 0
    """The run of `around` after the last one looked up (the kept body's runs come in order)."""
    is_missed = False
    """A run off `around`'s order was digested without a look-up (the index is made at the second)."""
    around_starts = around.blocks.starts if around is not None else ()
    take_first = take_stop = take_at = -1
    """Blocks `take_first .. take_stop - 1` of `around` are this scan's from block `take_at` on,
    not yet written out (`_take`)."""
    if base is not None and resumed:
        index = base.blocks.starts[resumed] if resumed < len(base.blocks.runs) else base.blocks.size
        out += base.chain.chain[: index * DIGEST_SIZE]
        ends.extend(base.chain.ends[:index])
        starts.extend(base.blocks.starts[:resumed])
        values.extend(base.values[:index])
        kinds.extend(base.kinds[:index])
        marked.extend(base.marked[: bisect_left(base.marked, index)])
        tools = min(index, base.tools)  # the tools section comes first
        if len(base.digests) >= index * DIGEST_SIZE:
            block_digests += base.digests[: index * DIGEST_SIZE]
        else:
            is_complete = False
        total = ends[-1] if ends else 0
        previous = base.chain.chain[(index - 1) * DIGEST_SIZE : index * DIGEST_SIZE] if index else b""
        last_message = next(
            (r.message for r in reversed(runs[:resumed]) if (len(r.value) if r.is_list else 1)), None
        )
    skip = 0
    """Runs left of a stretch of `around`'s very run objects, taken at once (`_same_runs`)."""
    for position, run in enumerate(runs[resumed:] if resumed else runs):
        if skip:
            skip -= 1
            continue
        starts.append(index)
        section, role, message, fixed = run.section, run.role, run.message, run.kind
        items = run.value if run.is_list else (run.value,)
        if not items:
            continue
        if reusing:
            assert reuse is not None
            key = run.key
            # a content list (its blocks are the message's parts) or a string content: the
            # message's marker-free bytes fix each block's; a whole item (Responses) is digested
            vouched = len(key) >= 2 and key[0] == array_key and type(key[1]) is int and key[1] < same
            if vouched and (run.is_list or type(run.value) is str):
                if reused_until < 0:  # first vouched run: the blocks before it must chain alike
                    earlier = reuse.previous
                    reusing = index + len(items) <= earlier_blocks and (
                        bytes(out) == earlier.chain[: index * DIGEST_SIZE] and total == earlier.bytes_before(index)
                    )
                else:
                    reusing = index + len(items) <= earlier_blocks
                if reusing:
                    if reused_until < 0:
                        reused_from = index
                    reused_until = index + len(items)
                    _reuse_run(run, items, fixed, index, values, kinds, marked)
                    index = reused_until
                    last_message = message
                    continue
            elif vouched or reused_until >= 0:
                reusing = False  # past the vouched elements (or not a kind copied): digest the rest
            if len(ends) < index:
                # the stretch of copied blocks ends here: their digests and offsets, at once
                out, ends, total, previous = _copy_stretch(reuse, reused_from, reused_until, out, ends)
        is_boundary = message != last_message
        if around is not None:
            j = cursor
            if j >= len(around_runs) or around_runs[j].value is not run.value:
                if j + 1 < len(around_runs) and around_runs[j + 1].value is run.value:
                    j += 1  # the kept body's run at the cursor was replaced (an edited message)
                elif around_index is None and not is_missed:
                    is_missed, j = True, -1  # a new value (the edit itself): digested, nothing looked up
                else:  # off the kept body's order: any run of it holding this very value
                    if around_index is None:
                        around_index = dict(zip(map(id, map(_VALUE, around_runs)), count()))  # the last one wins
                    j = around_index.get(id(run.value), -1)
            old = around_runs[j] if j >= 0 else None
            if (
                old is not None
                and old.value is run.value
                and old.section == section
                and old.role == role
                and old.kind == fixed
                and old.is_list == run.is_list
                and _is_boundary(around_runs, j) == is_boundary
            ):
                # the very blocks `around` digested, with the same heads: taken in stretches
                first = around_starts[j]
                if first != take_stop:  # not where the stretch taken so far ends: a new one
                    if take_first < take_stop:
                        taken = (take_first, take_stop, take_at)
                        total, previous = _take(
                            around, taken, out, ends, total, previous, block_digests, values, kinds, marked
                        )
                    take_first, take_at = first, index
                stretch = _same_runs(runs, position, around_runs, j) if old is run and section != "tools" else 1
                if stretch > 1:  # the runs after it are `around`'s next ones too: theirs at once
                    after = j + stretch
                    starts.extend(map((index - first).__add__, around_starts[j + 1 : after]))
                    take_stop = around_starts[after] if after < len(around_starts) else around.blocks.size
                    message = next(r.message for r in reversed(around_runs[j:after]) if not r.is_list or r.value)
                    skip = stretch - 1
                else:
                    take_stop = first + len(items)
                if section == "tools":
                    tools += len(items)
                index += take_stop - first
                last_message = message
                cursor = j + stretch
                continue
            if j >= 0:
                cursor = j + 1
            if take_first < take_stop:
                taken = (take_first, take_stop, take_at)
                total, previous = _take(around, taken, out, ends, total, previous, block_digests, values, kinds, marked)
                take_first = take_stop = -1
        if section == "tools":
            tools += len(items)
        values.extend(items)
        if fixed is not None:
            kinds.extend([fixed] * len(items))
        last_message = message
        head = heads.get((section, role, is_boundary))
        if head is None:
            head = heads[(section, role, is_boundary)] = (
                f"{section}\x00{role or ''}\x00{'1' if is_boundary else '0'}\x00".encode()
            )
        for value in items:
            if type(value) is dict:
                if (
                    "cache_control" in value or "prompt_cache_breakpoint" in value or "content" in value
                ) and _has_marker(value):
                    if value.get("cache_control") is not None or value.get("prompt_cache_breakpoint") is not None:
                        marked.append(index)
                    data = dumps(_strip_markers(value))
                else:
                    data = dumps(value)
                if fixed is None:
                    kind = value.get("type")
                    kinds.append(_known(kind, kind) if type(kind) is str else "unknown")
                keyed = data if None not in value.values() else null_free(value, data)
            elif isinstance(value, str):
                data = dumps(value)
                keyed = _TEXT_HEAD + data + b"}"
                if fixed is None:
                    kinds.append("text")
            else:
                if isinstance(value, dict) and _has_marker(value):
                    if value.get("cache_control") is not None or value.get("prompt_cache_breakpoint") is not None:
                        marked.append(index)
                    data = dumps(_strip_markers(value))
                else:
                    data = dumps(value)
                if fixed is None:
                    kinds.append(run_kind(run, value))
                keyed = null_free(value, data) if isinstance(value, dict) else data
            block = digest(head + keyed)
            block_digests += block
            previous = digest(previous + block)
            out += previous
            total += len(data)
            ends.append(total)
            index += 1
            if is_boundary:
                is_boundary = False
                head = heads.get((section, role, False))
                if head is None:
                    head = heads[(section, role, False)] = f"{section}\x00{role or ''}\x000\x00".encode()
    if around is not None and take_first < take_stop:
        taken = (take_first, take_stop, take_at)
        total, previous = _take(around, taken, out, ends, total, previous, block_digests, values, kinds, marked)
    if len(ends) < index:  # the copied stretch ran to the end
        out, ends, total, previous = _copy_stretch(reuse, reused_from, reused_until, out, ends)
    chain = PrefixChain(bytes(out), tuple(ends))
    known = bytes(block_digests) if is_complete and len(block_digests) == index * DIGEST_SIZE else b""
    return PromptScan(chain, RunBlocks(runs, starts), values, kinds, tuple(marked), tools, known)
