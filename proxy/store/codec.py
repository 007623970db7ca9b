"""`SessionRecord`: what promptcache remembers about one session, and its byte encoding.

One record per (tenant, session), rewritten after every 2xx response. It describes the last
request SENT upstream (not the client's), so the next turn can be compared with it (measurement)
and its earlier messages replayed byte for byte (replay).

Encoding (`encode_record` / `decode_record`), compact and versioned:

    b"PCR1" | u32 big-endian header length | orjson(header) | blob

The header is a small orjson object (scalars, tuples, pins; a key added later, such as `tm`,
`pc` or `lt`,
is optional on reading, so older records of the same version still decode); the blob holds the binary fields
back to back: `chain`, `params_digest`, then per sidecar its masked digest, exact digest and
value bytes, with lengths recorded in the header. Sidecar values stay raw bytes: replay
compares them with the current message without parsing, and parses only what it splices.

`decode_record` raises `RecordError` (a `ValueError`) on anything it cannot read: a wrong magic
or version, truncated bytes, bad JSON, lengths that do not add up.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
import xxhash

from proxy.pacing import HUMAN, TOOL, Pacing

MAGIC: Final = b"PCR1"
VERSION: Final = 1
_HEAD: Final = struct.Struct(">4sI")


class RecordError(ValueError):
    """Stored bytes that are not a readable `SessionRecord`."""


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


@dataclass(frozen=True, slots=True)
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


def encode_record(record: SessionRecord) -> bytes:
    """The record as bytes (see module docstring)."""
    header = {
        "v": VERSION,
        "n_chain": len(record.chain),
        "n_params": len(record.params_digest),
        "ends": record.ends,
        "model": record.model,
        "bp": record.breakpoints,
        "ttls": record.ttls,
        "arr": record.arrivals,
        "rid": record.last_response_id,
        "sc": [(s.position, len(s.digest), len(s.exact), len(s.value)) for s in record.sidecars],
        "pins": record.pins,
        "turns": record.turns,
        "head": record.head.hex(),
        "tm": record.tail_misses,
        "pc": record.pacing.to_json(),
        "lt": record.turn,
    }
    head = orjson.dumps(header)
    parts = [_HEAD.pack(MAGIC, len(head)), head, record.chain, record.params_digest]
    for sidecar in record.sidecars:
        parts.append(sidecar.digest)
        parts.append(sidecar.exact)
        parts.append(sidecar.value)
    return b"".join(parts)


def decode_record(data: bytes) -> SessionRecord:
    """Parse bytes made by `encode_record`.

    Raises `RecordError` when `data` is not a complete record of this version.
    """
    if len(data) < _HEAD.size:
        raise RecordError("record too short")
    magic, head_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise RecordError("not a session record")
    start = _HEAD.size
    try:
        header = orjson.loads(data[start : start + head_len])
        if header["v"] != VERSION:
            raise RecordError(f"record version {header['v']} is not {VERSION}")
        view = memoryview(data)
        at = start + head_len
        chain = bytes(view[at : at + header["n_chain"]])
        at += header["n_chain"]
        params = bytes(view[at : at + header["n_params"]])
        at += header["n_params"]
        sidecars = []
        for position, n_digest, n_exact, n_value in header["sc"]:
            digest = bytes(view[at : at + n_digest])
            at += n_digest
            exact = bytes(view[at : at + n_exact])
            at += n_exact
            value = bytes(view[at : at + n_value])
            at += n_value
            sidecars.append(Sidecar(position, digest, value, exact, xxhash.xxh3_128_digest(value)))
        if at != len(data):
            raise RecordError("record length does not match its header")
        return SessionRecord(
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
        )
    except RecordError:
        raise
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"unreadable record header ({type(exc).__name__})") from exc
