"""`SessionRecord`: what promptcache remembers about one session, and its byte encoding.

One record per (tenant, session), rewritten after every 2xx response. It describes the last
request SENT upstream (not the client's), so the next turn can be compared with it (measurement)
and its earlier messages replayed byte for byte (replay).

Encoding (`encode_record` / `decode_record`), compact and versioned:

    b"PCR2" | u32 big-endian header length | orjson(header) | blob | xxh3-64 of all before

The trailer makes a stored head that is not the bytes written (a flipped bit, a torn write) a
`RecordError`, which `RecordStore` counts and treats as a miss, instead of another chain or
another sidecar value replayed as sent (attack pass, session 9: 1,024 of the 2,664 single-bit
flips of a small record decoded). Records written before it (`b"PCR1"`, `UNCHECKED_MAGIC`, the
same layout without the trailer) are read as they are, deliberately: an upgrade costs no session
its state, and the session's next save writes its record checked.

The header is a small orjson object (scalars, tuples, pins; a key added later, such as `tm`,
`pc`, `lt` or `st`, is optional on reading, so older records of the same version still decode;
version 2 added `dl`, and version 1 records still decode); the blob holds the binary fields
back to back: `chain`, `params_digest`, then per sidecar its masked digest, exact digest and
value bytes, with lengths recorded in the header. Sidecar values stay raw bytes: replay
compares them with the current message without parsing, and parses only what it splices.

`decode_record` raises `RecordError` (a `ValueError`) on anything it cannot read: a wrong magic,
checksum or version, truncated bytes, bad JSON, lengths that do not add up.

**In parts** (`encode_layout` / `decode_layout`, what `proxy.store.RecordStore` writes): a long
conversation's record is a head plus parts (`Layout`), so an appended turn encodes and writes
what is new, not the whole history. The sidecars, in order, are cut into parts of at least
`PART_BYTES` each; the ones after the last full part stay in the head. A part is
`u32 count | count x (u32 position, u16 digest, u16 exact, u32 value lengths) | the digests,
exact digests and values back to back`, named by the xxh3-128 of its bytes (`Part.key`), so a
name always means the same bytes. A record with no full part is written exactly as
`encode_record` writes it (version 2); one with parts has a version 3 head: the version 2
header plus `parts` (`[key hex, sidecar count, byte size]` each, in order), its `sc` and blob
holding only the sidecars after the parts. Encoding against the session's previous layout
(`base`) keeps every leading part whose sidecars are equal to the previous record's (they are
the same objects when `proxy.pipeline.session.build_sidecars` kept them) and cuts new parts
only from the first changed sidecar on: an appended turn costs the head and the open tail, a
rewritten history re-encodes from the rewrite. Encoding against another record (`donor`: a new
session re-sending a recent conversation) takes each donor part that starts where a part of its
own would and holds equal sidecars: the same bytes, not encoded again. Decoding checks each
part's size and name against the head (a missing or different part is a `RecordError`: a record
is never assembled from mismatched parts) and takes the decoded sidecars of a part the base
already holds as they are.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
import xxhash

from proxy.frozen import fast_init
from proxy.pacing import HUMAN, TOOL, Pacing
from proxy.store.base import Part

MAGIC: Final = b"PCR2"
"""A record whose head ends with the xxh3-64 of its bytes (`_SUM`)."""
UNCHECKED_MAGIC: Final = b"PCR1"
"""A record written before the checksum (no trailer): read as it is (module docstring)."""
VERSION: Final = 2
"""2 added `delivered` (`dl`); version 1 records still decode (without it)."""
PARTED_VERSION: Final = 3
"""The version of a head with parts (module docstring)."""
READABLE_VERSIONS: Final = frozenset({1, VERSION, PARTED_VERSION})
PART_BYTES: Final = 16 * 1024
"""Bytes of sidecars (their index entries included) a part holds at least (the last sidecar
may take it past): an appended turn rewrites at most this much of the history besides its new
messages."""
_HEAD: Final = struct.Struct(">4sI")
_SUM: Final = 8
"""Bytes of the trailer: `xxhash.xxh3_64_digest` of the head before it."""
_COUNT: Final = struct.Struct(">I")
_ITEM: Final = struct.Struct(">IHHI")


class RecordError(ValueError):
    """Stored bytes that are not a readable `SessionRecord`."""


@fast_init
@dataclass(frozen=True, slots=True)
class Sidecar:
    """The exact value sent for one earlier message."""

    position: int
    """Index of the message in the request's message array (`messages` or `input`)."""
    digest: bytes
    """Masked canonical digest of the client's version of the message (16 bytes)."""
    value: bytes
    """orjson bytes of the message as sent upstream, markers (`cache_control`,
    `prompt_cache_breakpoint`) removed."""
    exact: bytes = b""
    """Unmasked canonical digest of the client's version (16 bytes): seeds the masking memo,
    so an unchanged message is never masked again after a restart or on another replica."""
    value_digest: bytes = field(default=b"", compare=False, repr=False)
    """xxh3-128 of `value` when known (derived, not stored: `decode_record` computes it)."""

    def sent_digest(self) -> bytes:
        """xxh3-128 of `value`."""
        return self.value_digest or xxhash.xxh3_128_digest(self.value)


@fast_init
@dataclass(frozen=True, slots=True, weakref_slot=True)
class SessionRecord:
    """State of one session after its last successful (2xx) request."""

    chain: bytes
    """`proxy.prefix.PrefixChain.chain` of the last request sent upstream."""
    ends: tuple[int, ...]
    """`proxy.prefix.PrefixChain.ends` of the same request (canonical bytes)."""
    model: str
    params_digest: bytes
    """xxh3-128 of orjson(params_fingerprint, OPT_SORT_KEYS); see `proxy.session_identity.params_digest`."""
    breakpoints: tuple[int, ...] = ()
    """Marker positions (indices into `prefix_blocks`) of the last request sent."""
    ttls: tuple[str, ...] = ()
    """TTL per entry of `breakpoints` (`5m` / `1h`)."""
    arrivals: tuple[float, ...] = ()
    """Start times of the session's recent requests, epoch seconds, oldest first (bounded)."""
    last_response_id: str | None = None
    sidecars: tuple[Sidecar, ...] = ()
    """One per message of the last request sent (system-section messages excluded), by position."""
    pins: dict[str, Any] = field(default_factory=dict)
    """First-seen shapes the session keeps stable: tool order, schemas and call inputs
    (`pinned_tool_order`, `pinned_schemas`, `pinned_inputs`: canonicalise) and the first-seen
    text of pinned system segments (`pinned_segments`: `proxy.pipeline.pins`)."""
    turns: int = 0
    """Successful requests recorded for this session so far."""
    head: bytes = b""
    """Masked digest of the tools and top-level system (the prefix sessions may share)."""
    tail_misses: int = 0
    """Consecutive requests, the last one included, that rewrote the newest message of the
    request before them (`proxy.pipeline.replay.tail_rewritten`): a marker on the newest
    message is never read, so the planner stops writing one (`PlanContext.tail_misses`)."""
    pacing: Pacing = field(default_factory=Pacing)
    """The session's gaps by kind and turn-end counts (`proxy.pacing`, bounded)."""
    turn: str | None = None
    """Who acts after the last response (`Usage.turn`: `human`, `tool`, `None` unknown)."""
    delivered: tuple[tuple[str, str, int], ...] = ()
    """Notes moved onto a user message and still in the history: `(slot, text, position)`, the
    position being the last message of the request that delivered it
    (`proxy.pipeline.delivered`: a note is not delivered again while its value is the same)."""
    started: float = 0.0
    """Epoch seconds of the session's first recorded request (a fork's: its parent's); `0.0`
    when unknown (a record written before it was kept). Bounds how far a re-rendered moment in
    the history may have moved (`proxy.rerender`)."""


@fast_init
@dataclass(frozen=True, slots=True)
class Layout:
    """A record encoded in parts (module docstring): `head` plus `parts`, in order."""

    head: bytes
    parts: tuple[Part, ...] = ()
    counts: tuple[int, ...] = ()
    """Sidecars in each part (the head holds the ones after them)."""

    @property
    def size(self) -> int:
        """Encoded bytes in all: the head and every part."""
        return len(self.head) + sum(p.size for p in self.parts)

    def without_data(self) -> Layout:
        """The same layout naming its parts only (what a memo keeps once they are stored)."""
        if all(p.data is None for p in self.parts):
            return self
        return Layout(self.head, tuple(Part(p.key, p.size) for p in self.parts), self.counts)


def _header(record: SessionRecord, sidecars: tuple[Sidecar, ...], version: int) -> dict[str, Any]:
    header = {
        "v": version,
        "n_chain": len(record.chain),
        "n_params": len(record.params_digest),
        "ends": record.ends,
        "model": record.model,
        "bp": record.breakpoints,
        "ttls": record.ttls,
        "arr": record.arrivals,
        "rid": record.last_response_id,
        "sc": [(s.position, len(s.digest), len(s.exact), len(s.value)) for s in sidecars],
        "pins": record.pins,
        "turns": record.turns,
        "head": record.head.hex(),
        "tm": record.tail_misses,
        "pc": record.pacing.to_json(),
        "lt": record.turn,
        "dl": [list(entry) for entry in record.delivered],
    }
    if record.started:  # unknown (0.0) is left out, as records written before it have it
        header["st"] = record.started
    return header


def _join(record: SessionRecord, header: dict[str, Any], sidecars: tuple[Sidecar, ...]) -> bytes:
    head = orjson.dumps(header)
    parts = [_HEAD.pack(MAGIC, len(head)), head, record.chain, record.params_digest]
    for sidecar in sidecars:
        parts.append(sidecar.digest)
        parts.append(sidecar.exact)
        parts.append(sidecar.value)
    data = b"".join(parts)
    return data + xxhash.xxh3_64_digest(data)


def encode_record(record: SessionRecord) -> bytes:
    """The record as bytes (see module docstring)."""
    return _join(record, _header(record, record.sidecars, VERSION), record.sidecars)


def _part(sidecars: tuple[Sidecar, ...]) -> Part:
    """One part holding `sidecars` (module docstring), with its bytes."""
    pieces = [_COUNT.pack(len(sidecars))]
    pieces.extend(_ITEM.pack(s.position, len(s.digest), len(s.exact), len(s.value)) for s in sidecars)
    for sidecar in sidecars:
        pieces.append(sidecar.digest)
        pieces.append(sidecar.exact)
        pieces.append(sidecar.value)
    data = b"".join(pieces)
    return Part(xxhash.xxh3_128_digest(data), len(data), data)


def encode_layout(
    record: SessionRecord,
    base: tuple[SessionRecord, Layout] | None = None,
    donor: tuple[SessionRecord, Layout] | None = None,
) -> Layout:
    """`record` in parts (module docstring); `base`: the session's previous record and its
    layout, whose leading parts are kept (not encoded again) while their sidecars are equal.
    `donor`: another record and its layout (a new session re-sending a recent conversation:
    `RecordStore` passes the tenant's last one saved), whose part starting where a new part
    would start is taken as it is (its bytes, or its name only when it carries none) when its
    sidecars are equal to the record's there: the same bytes as encoding them, since a part is
    its sidecars' encoding and the cut from that sidecar on depends on their sizes only."""
    sidecars = record.sidecars
    parts: list[Part] = []
    counts: list[int] = []
    at = 0
    if base is not None:
        before = base[0].sidecars
        for part, count in zip(base[1].parts, base[1].counts, strict=True):
            end = at + count
            if end > len(sidecars) or sidecars[at:end] != before[at:end]:
                break
            parts.append(part)
            counts.append(count)
            at = end
    lent, lent_parts, lent_counts = (donor[0].sidecars, donor[1].parts, donor[1].counts) if donor else ((), (), ())
    j = lent_at = 0  # the donor's part `j` starts at its sidecar `lent_at`
    start, size, item = at, 0, _ITEM.size
    i, stop = at, len(sidecars)
    while i < stop:
        if i == start and lent_counts:
            while j < len(lent_counts) and lent_at < start:
                lent_at += lent_counts[j]
                j += 1
            end = lent_at + lent_counts[j] if j < len(lent_counts) and lent_at == start else stop + 1
            if end <= stop and sidecars[start:end] == lent[start:end]:  # the very objects: by identity
                parts.append(lent_parts[j])
                counts.append(end - start)
                i = start = end
                continue
        sidecar = sidecars[i]
        size += item + len(sidecar.digest) + len(sidecar.exact) + len(sidecar.value)
        i += 1
        if size >= PART_BYTES:
            parts.append(_part(sidecars[start:i]))
            counts.append(i - start)
            start, size = i, 0
    if not parts:
        return Layout(encode_record(record))
    tail = sidecars[start:]
    header = _header(record, tail, PARTED_VERSION)
    header["parts"] = [(p.key.hex(), n, p.size) for p, n in zip(parts, counts, strict=True)]
    return Layout(_join(record, header, tail), tuple(parts), tuple(counts))


def decode_record(data: bytes) -> SessionRecord:
    """Parse bytes made by `encode_record`.

    Raises `RecordError` when `data` is not a complete record of this version (or is the head
    of a record in parts: `decode_layout` reads those).
    """
    return decode_layout(data, {})[0]


def _read_sidecars(data: bytes, at: int, index: Iterable[Sequence[int]], out: list[Sidecar]) -> int:
    """Append to `out` the sidecars `index` lists (`(position, digest, exact, value lengths)`
    each), their bytes back to back in `data` from `at`; returns the offset after them (past
    `len(data)` when `data` is short: the caller compares). One slice per field, straight from
    `data` (a record of a 600 KB conversation holds ~500 sidecars: this loop is its decode)."""
    append, hashed = out.append, xxhash.xxh3_128_digest
    for position, n_digest, n_exact, n_value in index:
        exact_at = at + n_digest
        value_at = exact_at + n_exact
        end = value_at + n_value
        value = data[value_at:end]
        append(Sidecar(position, data[at:exact_at], value, data[exact_at:value_at], hashed(value)))
        at = end
    return at


def _read_part(data: bytes, count: int) -> list[Sidecar]:
    """The sidecars of one part's bytes (`_part`); raises `RecordError` when malformed."""
    data = bytes(data)  # the same object when it is `bytes`: the sidecars slice it
    try:
        (n,) = _COUNT.unpack_from(data)
        if n != count:
            raise RecordError("record part holds another count of messages")
        at = _COUNT.size + n * _ITEM.size
        out: list[Sidecar] = []
        at = _read_sidecars(data, at, _ITEM.iter_unpack(memoryview(data)[_COUNT.size : at]), out)
    except struct.error as exc:
        raise RecordError("record part truncated") from exc
    if at != len(data) or len(out) != n:
        raise RecordError("record part length does not match its index")
    return out


def decode_layout(
    data: bytes, parts: Mapping[bytes, bytes], base: tuple[SessionRecord, Layout] | None = None
) -> tuple[SessionRecord, Layout]:
    """Parse a head (`encode_layout`, or any `encode_record` bytes) and its parts by key; the
    sidecars of a part `base` (a record and its layout) holds are taken from it, not decoded.

    Raises `RecordError` when `data` is not a complete record, or a part it names is missing
    or not the bytes it names (size, xxh3-128)."""
    data = bytes(data)  # the same object when it is `bytes`: the sidecars slice it
    if len(data) < _HEAD.size:
        raise RecordError("record too short")
    magic, head_len = _HEAD.unpack_from(data)
    if magic == MAGIC:
        stop = len(data) - _SUM
        if stop < _HEAD.size or xxhash.xxh3_64_digest(memoryview(data)[:stop]) != data[stop:]:
            raise RecordError("record checksum does not match its bytes")
    elif magic == UNCHECKED_MAGIC:
        stop = len(data)
    else:
        raise RecordError("not a session record")
    start = _HEAD.size
    try:
        header = orjson.loads(data[start : start + head_len])
        if header["v"] not in READABLE_VERSIONS:
            raise RecordError(f"record version {header['v']} is not one of {sorted(READABLE_VERSIONS)}")
        view = memoryview(data)
        at = start + head_len
        chain = bytes(view[at : at + header["n_chain"]])
        at += header["n_chain"]
        params = bytes(view[at : at + header["n_params"]])
        at += header["n_params"]
        sidecars: list[Sidecar] = []
        layout_parts: list[Part] = []
        counts: list[int] = []
        if header["v"] == PARTED_VERSION:
            known: dict[bytes, tuple[int, int]] = {}
            if base is not None:
                offset = 0
                for part, count in zip(base[1].parts, base[1].counts, strict=True):
                    known[part.key] = (offset, count)
                    offset += count
            for name, count, size in header["parts"]:
                key = bytes.fromhex(name)
                hit = known.get(key)
                if hit is not None and hit[1] == count and base is not None:
                    sidecars.extend(base[0].sidecars[hit[0] : hit[0] + count])
                else:
                    value = parts.get(key)
                    if value is None:
                        raise RecordError("record part missing")
                    if len(value) != size or xxhash.xxh3_128_digest(value) != key:
                        raise RecordError("record part does not match its name")
                    sidecars.extend(_read_part(value, count))
                layout_parts.append(Part(key, size))
                counts.append(count)
        at = _read_sidecars(data, at, header["sc"], sidecars)
        if at != stop:
            raise RecordError("record length does not match its header")
        record = SessionRecord(
            chain=chain,
            ends=tuple(header["ends"]),
            model=header["model"],
            params_digest=params,
            breakpoints=tuple(header["bp"]),
            ttls=tuple(header["ttls"]),
            arrivals=tuple(header["arr"]),
            last_response_id=header["rid"],
            sidecars=tuple(sidecars),
            pins=header["pins"],
            turns=header["turns"],
            head=bytes.fromhex(header["head"]),
            tail_misses=int(header.get("tm", 0)),
            pacing=Pacing.from_json(header.get("pc")),
            turn=header.get("lt") if header.get("lt") in (HUMAN, TOOL) else None,
            delivered=_delivered(header.get("dl")),
            started=_started(header.get("st")),
        )
        return record, Layout(data, tuple(layout_parts), tuple(counts))
    except RecordError:
        raise
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"unreadable record header ({type(exc).__name__})") from exc


def _started(value: Any) -> float:
    """The `st` header value when it is a finite number of seconds, else `0.0` (unknown)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return 0.0
    return float(value)


def _delivered(value: Any) -> tuple[tuple[str, str, int], ...]:
    """The `dl` header entries that are well formed (`(str, str, int)`); none when absent."""
    if not isinstance(value, list):
        return ()
    return tuple(
        (e[0], e[1], e[2])
        for e in value
        if isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[1], str)
        and isinstance(e[2], int) and not isinstance(e[2], bool)
    )
