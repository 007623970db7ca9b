"""Session state storage: `open_store(url)`, the guarded `RecordStore`, and `store_ctx(app)`.

- `open_store(url)` builds a `SessionStore` backend from a URL, importing it lazily:
  `memory://`, `sqlite:///abs/path.db` (`sqlite:////abs/path.db` too; `sqlite://relative.db`
  is relative to the working directory), `redis://host:port/db`
  (`rediss://` for TLS). It connects lazily, so a dead server at start is not fatal.
- `RecordStore` is what the pipeline uses (`Services.store`): it encodes `SessionRecord`s, times
  every backend call into `promptcache_session_store_operation_duration_seconds{backend,
  operation}`, bounds it (reads `GET_TIMEOUT`, writes `PUT_TIMEOUT` seconds; a backend that
  queues writes, SQLite, bounds a write by its own transaction's time, not by its queue:
  `SqliteStore.put_within`) and turns every
  failure (timeout, refused connection, locked or corrupt file, unreadable record) into
  `promptcache_session_store_errors_total{backend, operation}` and a `None` / `False` result. It
  never raises, so the request is forwarded without replay. It remembers the bytes and the
  decoded record of the sessions it read or wrote last (bounded in bytes: `memo_bytes`, the
  memory budget's `records` share, counting a record as what it holds: `_held`; when full, a
  session it does not hold is taken in by `proxy.cache_admission`, not plain LRU, so that more
  long sessions than fit do not evict each other in turn): a read
  whose bytes equal the remembered ones returns that record without
  decoding (the backend is still read, so a replica's newer write is seen). Records are
  immutable: callers never edit one (or its `pins`).
- Sole writer (`is_sole_writer`: `store_ctx` sets it for the SQLite file of a single-process
  `serve`; never with `--workers N` or Redis, where another process may write): nobody else
  changes the backend, so a load skips the read when this process knows the answer, counted in
  `promptcache_session_store_local_reads_total`: a record it wrote is returned from the memo
  until the backend's copy expires (a failed or timed-out write keeps it there too: it is still
  the session's newest, so its next turn replays it through a store outage; a file the backend
  found replaced clears the memo), and a key outside `KeyFilter` (the
  keys `learn_keys` listed at start plus every key written since) is absent.
- Records in parts: a record is written as a head and parts (`proxy.store.codec.encode_layout`,
  the backend's `put_parts`), encoded against the session's previous layout (the pending one, or
  the one remembered): an appended turn encodes and sends its head and its new parts, the parts
  the backend holds are named, not sent. Which parts it holds comes from a small index per
  session (`_stored`: the 16-byte part names of the value last written or read here, LRU,
  `STORED_PARTS_BYTES`), which outlives the memo: at 32 sessions of 600 KB the memo no longer
  holds a session between its load and its save, and the parts are cut greedily from the first
  sidecar (`proxy.store.codec.encode_layout`), so a record encoded without its base has the same
  part names. A write the backend refuses because a named part is gone (evicted, or another
  replica rewrote the session) is sent again with every part. A read decodes only the parts the
  remembered layout does not hold.
- Writes are off the request path: `save_soon` encodes the record, keeps it as the session's
  pending record and returns at once; a background task (`proxy.aio.TaskSet`, one per session
  at a time, so writes of one session never reorder) writes it, newest first when several
  turns arrive meanwhile (older pending ones are superseded, never written after a newer one).
  A `load` of a session with a pending record returns that record (read-your-writes on this
  replica). Pending writes are bounded (`MAX_PENDING_WRITES` sessions, `MAX_PENDING_BYTES`,
  each pending record counted as what it holds (`_held`: the record and its head; its parts
  wait as their names only, and the write encodes again those the backend lacks, unless the
  newest saves' bytes are still kept for it: `ENCODED_BYTES`); beyond that
  a save is dropped and counted (`promptcache_session_store_writes_dropped_total`).
  `close()` drains them (each write bounded by `PUT_TIMEOUT`) before closing the backend.
  Sole writer: a pending record the memo does not take in at its write stays at hand for its
  session's next load (`_keep_written`, in the room the pending writes leave of
  `MAX_PENDING_BYTES`, a save taking room drops the oldest first), so many long sessions
  taking turns (the gateway bench's grow32: 32 of 600 KB, the memo holds six) find their
  record in memory whether or not its write was quick, as they do while it is pending; before,
  once writes kept up, most turns read the backend inside the body gate (`proxy.admission`)
  and the rate halved (session 17: the cell's slow mode).
- A read of a session the memo does not hold is decoded against its tenant's donor (`_lent`):
  the parts both name (xxh3-128 of the same bytes, within the tenant) are neither read nor
  decoded again.
- Bounded in bytes: a record encoded larger than `max_record_bytes` (the setting
  `store_max_bytes_per_tenant`) is not written, and the session's older record is removed
  (`promptcache_session_store_records_skipped_total`); the SQLite backend also caps bytes per
  tenant and in total, evicting the least recently written records
  (`promptcache_session_store_evictions_total{cap}`, `proxy.store.sqlite`).
- Health: every failure is counted by cause in `promptcache_session_store_faults_total{backend,
  kind}` (`proxy.store.base.FAULT_KINDS`, named by the backend's `fault_kind`). A cause in
  `UNHEALTHY_KINDS` (disk full, read-only, cannot open, server unavailable or unresponsive)
  makes the store unhealthy: `promptcache_session_store_healthy{backend}` 0 and `/readyz` 503
  naming it, until a write or a `check()` succeeds. `check()` (the backend's probe, bounded by
  `CHECK_TIMEOUT`, one at a time) runs on every `/readyz` and every `CHECK_INTERVAL` seconds
  (`store_ctx`), so a fixed store reports healthy without waiting for traffic. Requests never
  wait on it: an unhealthy store costs replay only.
  Logged: the unhealthy and healthy-again transitions at WARNING; a failed read or write at
  WARNING once per cause until a write succeeds (a persisting transient cause, a lock another
  process holds or a frozen Redis's timeouts, is not a line per request), then DEBUG.
- `store_ctx(app)` is the `cleanup_ctx` entry: it opens the store (`settings.store`, default
  SQLite at `state_dir/sessions.db`) and the per-process session state (tenant secret, session
  inference index, pacing statistics: `proxy.session_identity.SessionState`) and closes them on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import xxhash

from proxy.aio import TaskSet, create_task
from proxy.cache_admission import admits
from proxy.memory_budget import MemoryBudget
from proxy.store.base import FAULT_KINDS, UNHEALTHY_KINDS, Part, SessionStore
from proxy.store.codec import Layout, RecordError, SessionRecord, Sidecar, decode_layout, encode_layout

if TYPE_CHECKING:
    from aiohttp import web

    from proxy.metrics import Metrics

__all__ = [
    "GET_TIMEOUT",
    "PUT_TIMEOUT",
    "RECORD_TTL",
    "RecordStore",
    "SessionRecord",
    "StoreHealth",
    "SessionStore",
    "Sidecar",
    "default_store_url",
    "open_store",
    "store_ctx",
]

GET_TIMEOUT: Final = 0.05
"""Seconds a request waits for its session record before going on without it."""
LATE_LOOP: Final = 0.5
"""A bounded read (no `get_within`: Redis) whose bound's timer ran this many bounds late (the
event loop busy elsewhere) waits one bound more before it is a timeout (`_bounded_get`)."""
PUT_TIMEOUT: Final = 1.0
"""Seconds a record write may take (after the response went to the client)."""
RECORD_TTL: Final = 3600.0 + 600.0
"""Seconds a record lives: the longest provider cache TTL in use (1 h) plus a margin. Past it
the provider's cache is gone anyway, so replay would buy at most one cache write."""

MEMO_BYTES: Final = 16 * 1024 * 1024
"""Memory the decoded records `RecordStore` keeps may take by default (`serve` uses the memory
budget's share, `proxy.memory_budget`), each counted as `_held` (a 600 KB conversation's record
is about 600 KB encoded and holds about 0.8 MB)."""
SIDECAR_BYTES: Final = 256
"""Memory a sidecar takes besides its value's bytes (measured with `tracemalloc`, CPython 3.11
64-bit, a decoded record of 500 sidecars: 250 B each; the slotted object, its three 16-byte
digests and the value's object header)."""
END_BYTES: Final = 40
"""Memory per entry of a record's `ends` (an int and its tuple slot; about 6 bytes in the head)."""
RECORD_BYTES: Final = 1536
"""Memory a kept record takes besides its sidecars, `ends` and bytes: the record object and its
small fields (pins, pacing, arrivals, digests), its layout object, its key and its slot in the
memo (measured with `tracemalloc`, CPython 3.11 64-bit, 50 records of a 1 KB conversation
decoded and kept as the memo keeps them: 4,201 B each, of which `_held` counted 1,718 without
it and the values its head holds)."""


def _held(layout: Layout, record: SessionRecord | None) -> int:
    """Memory a kept record takes in this process, bytes: its encoded size (the head kept beside
    the record, and the sidecar values the record holds, which the parts encode), the values of
    the sidecars after its parts once more (the head encodes them and the record holds them
    decoded: a short conversation's whole record), `SIDECAR_BYTES` per sidecar, `END_BYTES`
    per `ends` entry (the decoded header) and `RECORD_BYTES`, plus the bytes of the parts
    `layout` carries (none for the memo and the pending writes, whose layouts name their parts
    only). Measured (`tracemalloc`, kept as the memo keeps them) 4,201 B for a 1 KB
    conversation's record of one sidecar (this counts 4,227) and 967 KB for a 600 KB one of
    833 sidecars and 1,258 ends (680 KB encoded; this counts 958 KB). A removal (`record`
    `None`) holds its head only."""
    if record is None:
        return len(layout.head)
    carried = sum(p.size for p in layout.parts if p.data is not None)
    in_head = sum(len(s.value) for s in record.sidecars[sum(layout.counts) :])
    return (
        layout.size
        + in_head
        + SIDECAR_BYTES * len(record.sidecars)
        + END_BYTES * len(record.ends)
        + RECORD_BYTES
        + carried
    )


def _donor_held(donor: tuple[SessionRecord, Layout]) -> int:
    """Memory a donor (`RecordStore._donors`) keeps: its parts' bytes, and as much again for the
    values of the sidecars they encode (a part holds its sidecars' values and more), plus
    `SIDECAR_BYTES` per sidecar and `RECORD_BYTES` (its record and layout objects, its slot).
    Per part, not per sidecar: a save computes it (about 1 us for a 600 KB conversation's)."""
    layout = donor[1]
    return 2 * sum(p.size for p in layout.parts) + SIDECAR_BYTES * sum(layout.counts) + RECORD_BYTES


STORED_PARTS_BYTES: Final = 1024 * 1024
"""Memory the index of the part names each session's stored value holds may take
(`RecordStore._stored`): 16 bytes per part plus `STORED_ENTRY_BYTES` per session, about 1,300
sessions of a 600 KB conversation (38 parts each) or 5,000 of ten parts."""
LOADED_SESSIONS: Final = 1024
"""Sessions whose loaded record `RecordStore` keeps a weak reference to (and its part names:
a few KB for a 600 KB conversation), so the save of the same session encodes only its new
parts though the memo dropped the record: 0.76 -> 0.03 ms CPU for a 600 KB record."""
SEEN_SESSIONS: Final = 4096
"""Sessions whose last two load times `RecordStore` keeps (`_used`: about 150 bytes each), for
the memo's admission (`proxy.cache_admission`)."""
ENCODED_BYTES: Final = 2 * 1024 * 1024
"""Part bytes the pending writes keep from their save's encoding in all (`RecordStore._encoded`,
the newest first), so a write sends them without encoding the record again: a first turn's
parts are all new (0.5 ms CPU for a 600 KB record), and a 1-connection client's write follows its
save at once. A burst of saves keeps the newest few; the others encode at their write."""
DONOR_BYTES: Final = 2 * 1024 * 1024
"""Memory the tenants' donors (`RecordStore._donors`) may take in all, the newest first, each
counted as what it keeps (`_donor_held`: its parts' bytes, and the sidecars they encode, which
the comparison reads): a 600 KB conversation's donor is about 1.4 MB (620 KB of parts, 600 KB
of values, 833 sidecars). A donor keeps those only, not its record's head, pins or tail (attack
pass, session 16: it kept the whole record, and 57 tenants' records of 36 KB of messages and
256 KB of tool schemas each held 32 MB against the 1 MiB counted). The parts are the bytes the
save's own encoding made, kept a little longer: a new session re-sending the conversation
takes them as they are (`proxy.store.codec.encode_layout`'s `donor`) instead of encoding
~600 KB again (0.77 -> 0.13 ms of the event loop's CPU per such first request,
`bench/turn_cpu.py --first`). Not counted in the memory budget's shares: at most this much
beside them."""
STORED_ENTRY_BYTES: Final = 200
"""Memory per session of that index besides its names (the LRU slot, the key tuple, the bytes
object's header)."""


_REMOVED: Final = Layout(b"")
"""The layout of a pending removal."""


MAX_PENDING_WRITES: Final = 1024
"""Sessions whose record may wait for its background write at once."""
MAX_PENDING_BYTES: Final = 32 * 1024 * 1024
"""Memory those pending records may take, each counted as `_held` (the record and its head; the
parts' bytes are encoded at the write): about 38 sessions of a 600 KB conversation."""
DRAIN_TIMEOUT: Final = 2 * PUT_TIMEOUT
"""Seconds `close()` waits for pending writes (a session's write and one superseding it)."""

CHECK_TIMEOUT: Final = 1.0
"""Seconds a health check may take before the store counts as `unresponsive`."""
CHECK_INTERVAL: Final = 10.0
"""Seconds between background health checks (`store_ctx`)."""

_log = logging.getLogger("promptcache.store")


@dataclass(frozen=True)
class StoreHealth:
    """The session store's health as `/readyz` reports it."""

    backend: str
    problem: str | None = None
    """`None` when healthy, else the `UNHEALTHY_KINDS` cause last seen."""
    detail: str = ""
    """What was seen (the error text; never a key or stored bytes)."""

    @property
    def is_healthy(self) -> bool:
        return self.problem is None

    def as_json(self) -> dict[str, object]:
        body: dict[str, object] = {"backend": self.backend, "healthy": self.is_healthy}
        if self.problem is not None:
            body["problem"] = self.problem
            body["detail"] = self.detail
        return body


def default_store_url(state_dir: Path) -> str:
    """The SQLite file in the state directory."""
    return f"sqlite://{Path(state_dir).expanduser().resolve() / 'sessions.db'}"


def open_store(url: str, *, max_bytes: int | None = None, max_tenant_bytes: int | None = None) -> SessionStore:
    """A backend for `url`; raises `ValueError` for an unknown scheme or an empty path.

    `max_bytes` / `max_tenant_bytes` cap the SQLite file's value bytes in total and per tenant
    (`proxy.store.sqlite`; default 1 GiB / 256 MiB); Redis is bounded by its own `maxmemory`."""
    if url.startswith("memory://"):
        from proxy.store.memory import MemoryStore

        return MemoryStore()
    if url.startswith("sqlite://"):
        from proxy.store.sqlite import SqliteStore

        path = url[len("sqlite://") :]
        if path.startswith("//"):
            path = path[1:]
        if not path:
            raise ValueError("sqlite:// needs a file path, e.g. sqlite:///var/lib/promptcache/sessions.db")
        from proxy.store.sqlite import DEFAULT_MAX_BYTES, DEFAULT_MAX_TENANT_BYTES

        return SqliteStore(
            path,
            max_bytes=DEFAULT_MAX_BYTES if max_bytes is None else max_bytes,
            max_tenant_bytes=DEFAULT_MAX_TENANT_BYTES if max_tenant_bytes is None else max_tenant_bytes,
        )
    if url.startswith(("redis://", "rediss://", "unix://")):
        from proxy.store.redis import RedisStore

        return RedisStore(url)
    raise ValueError("store URL must start with memory://, sqlite:// or redis://")


KEY_FILTER_BITS: Final = 8 * 1024 * 1024
"""Bits of the sole writer's filter of keys the backend may hold (1 MiB; with 3 probes per key,
about 1 false "maybe" in 25,000 lookups at 100,000 keys, 1 in 40 at a million)."""


class KeyFilter:
    """A Bloom filter over `(tenant, key)` pairs: `may_hold` is `False` only for a pair never
    `add`ed. Pure; `KEY_FILTER_BITS` bits, 3 probes from one xxh3-128 digest."""

    def __init__(self, bits: int = KEY_FILTER_BITS) -> None:
        self._bits = bytearray(bits // 8)
        self._mask = bits - 1
        if bits & self._mask:
            raise ValueError("bits must be a power of two")

    def _probes(self, tenant: str, key: str) -> tuple[int, int, int]:
        h = xxhash.xxh3_128_intdigest(f"{tenant}\x00{key}".encode())
        return h & self._mask, (h >> 40) & self._mask, (h >> 80) & self._mask

    def add(self, tenant: str, key: str) -> None:
        bits = self._bits
        for i in self._probes(tenant, key):
            bits[i >> 3] |= 1 << (i & 7)

    def may_hold(self, tenant: str, key: str) -> bool:
        bits = self._bits
        return all(bits[i >> 3] & (1 << (i & 7)) for i in self._probes(tenant, key))


SAME_PROBLEM: Final = {"timeout": "unresponsive"}
"""A failure kind that is the store's known problem under another name: a frozen Redis's reads
and writes time out (`timeout`) while its check reports it `unresponsive`."""


class RecordStore:
    """`SessionRecord`s over a backend, timed, bounded and failing soft (module docstring)."""

    def __init__(
        self,
        backend: SessionStore,
        metrics: Metrics,
        get_timeout: float = GET_TIMEOUT,
        put_timeout: float = PUT_TIMEOUT,
        max_record_bytes: int | None = None,
        *,
        is_sole_writer: bool = False,
        clock: Callable[[], float] = time.time,
        memo_bytes: int | None = None,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ) -> None:
        """`max_record_bytes`: a record encoded larger than this is not stored (counted in
        `promptcache_session_store_records_skipped_total`; `None`: no limit).
        `is_sole_writer`: no other process writes this backend (`store_ctx`: the SQLite file
        of a single-process `serve`), so a record this process wrote is the newest and a load
        returns it from memory (module docstring). `clock`: epoch seconds, the backend's
        expiry clock. `memo_bytes`: bytes the decoded records may take (`MEMO_BYTES` when
        `None`; `store_ctx` passes the memory budget's share, `proxy.memory_budget`).
        `max_pending_bytes`: memory the records waiting for their write may take (each counted
        as `_held`, `MAX_PENDING_BYTES`)."""
        self.max_pending_bytes = max_pending_bytes
        self.backend = backend
        self.max_record_bytes = max_record_bytes
        self.get_timeout = get_timeout
        self.put_timeout = put_timeout
        self.is_sole_writer = is_sole_writer
        self._clock = clock
        self._memo: OrderedDict[tuple[str, str], tuple[Layout, SessionRecord, float]] = OrderedDict()
        """`(layout, record, expires)` per session (the layout without its parts' bytes: the
        backend holds them); `expires` is the epoch second the written copy expires in the
        backend, `0.0` for a record that was read (its expiry unknown)."""
        self._memo_bytes = 0
        self.memo_bytes = MEMO_BYTES if memo_bytes is None else memo_bytes
        self._loads = 0
        """Loads so far: the memo's clock (`proxy.cache_admission`)."""
        self._used: OrderedDict[tuple[str, str], tuple[int, int | None]] = OrderedDict()
        """Per session, the clock at its last load and at the one before (`None`: none), also
        for the sessions the memo does not hold (`SEEN_SESSIONS`, LRU): a held record's last
        use, and how long a session was away (`_remember`)."""
        self._stored: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        """Per session, the names (16 bytes each, back to back) of the parts of the value the
        backend holds, as last written or read here (LRU, `STORED_PARTS_BYTES`)."""
        self._stored_bytes = 0
        self._loaded: OrderedDict[tuple[str, str], tuple[weakref.ref[SessionRecord], Layout]] = OrderedDict()
        """Per session, the record a load returned (held by the request that loaded it, not
        here) and its parts (no head, no bytes), the base its save encodes against when the
        memo dropped it meanwhile (`LOADED_SESSIONS`, LRU)."""
        self._forget_all = False
        """Set (from the backend's thread) when the backend lost its data (`file_gone`): the
        memo no longer mirrors it and is cleared on the next load."""
        self._local_reads = metrics.store_local_reads.labels(backend.backend)
        self._keys: KeyFilter | None = None
        """Sole writer only, once `learn_keys` has listed the backend's keys: every key the
        backend may hold (listed, or written since). A key it cannot hold is absent without a read."""
        self._keys_written: KeyFilter | None = KeyFilter() if is_sole_writer else None
        """Keys written while the listing runs (merged into `_keys` when it is done)."""
        name = backend.backend
        self._is_in_process = name == "memory"
        """The in-process backend never waits on anything: no timer is armed around its calls."""
        self._put_within: Any = getattr(backend, "put_within", None)
        self._put_parts_within: Any = getattr(backend, "put_parts_within", None)
        """A backend that bounds a write by its own time (`SqliteStore.put_within`): its queue
        is not counted against `put_timeout` (`RecordStore`'s pending writes bound it)."""
        self._get_time = metrics.store_duration.labels(name, "get")
        self._put_time = metrics.store_duration.labels(name, "put")
        self._get_errors = metrics.store_errors.labels(name, "get")
        self._put_errors = metrics.store_errors.labels(name, "put")
        self._pending_gauge = metrics.store_pending_writes.labels(name)
        self._dropped = metrics.store_dropped_writes.labels(name)
        self._pending: dict[tuple[str, str], tuple[SessionRecord | None, Layout, float]] = {}
        """Newest record per session not yet written: `(record, layout, ttl)`; `None`,
        `_REMOVED` and 0 remove the session's record (one too large to store)."""
        self._pending_bytes = 0
        self._written: OrderedDict[tuple[str, str], tuple[Layout, SessionRecord, float]] = OrderedDict()
        """Sole writer only: per session, the record its last write stored when the memo did not
        take it in, `(layout, record, expires)` as the memo's, until the session's next load
        returns it (`_keep_written`), in the room the pending writes leave of
        `max_pending_bytes` (oldest first out; a save taking room drops them first)."""
        self._written_bytes = 0
        self._encoded: OrderedDict[tuple[str, str], tuple[Layout, Layout]] = OrderedDict()
        """Per pending write, `(its layout, the same with its parts' bytes)` as its save encoded
        them (`ENCODED_BYTES` in all, LRU): what its write sends when the backend lacks them."""
        self._encoded_bytes = 0
        self._donors: OrderedDict[str, tuple[SessionRecord, Layout]] = OrderedDict()
        """Per tenant, its newest saved record whose layout carries every part's bytes (a new
        session's), as much of it as a donor needs (the sidecars its parts hold) and those
        parts (`DONOR_BYTES` in all, `_donor_held`, LRU): the `donor` a new session's record is
        encoded against (`save_soon`). Never lent across tenants."""
        self._donor_bytes = 0
        self._raw_pending: dict[tuple[str, str], tuple[bytes, float]] = {}
        """Newest small value per key not yet written (`save_bytes_soon`)."""
        self._writers = TaskSet(MAX_PENDING_WRITES)
        self._faults = {kind: metrics.store_faults.labels(name, kind) for kind in FAULT_KINDS}
        self._healthy_gauge = metrics.store_healthy.labels(name)
        self._healthy_gauge.set(1)
        self.health = StoreHealth(name)
        """The newest health (module docstring)."""
        self._warned: set[str] = set()
        """Failure kinds of reads and writes logged at WARNING since the last success (a
        transient cause that persists, a lock another process holds, a frozen Redis's timeouts,
        is one WARNING, then DEBUG: `_level`)."""
        self._checking: asyncio.Task[StoreHealth] | None = None
        if hasattr(backend, "on_fault"):
            backend.on_fault = self._repaired
        self._skipped = metrics.store_skipped.labels(name)
        self._evictions = {cap: metrics.store_evictions.labels(name, cap) for cap in ("tenant", "total")}
        if hasattr(backend, "on_evict"):
            backend.on_evict = self._evicted

    def _evicted(self, cap: str, rows: int) -> None:
        """Records the backend evicted to stay within a cap, or did not store (`too_large`);
        its writer thread may call this."""
        if cap == "too_large":
            self._skipped.inc(rows)
        else:
            self._evictions[cap].inc(rows)

    def _repaired(self, kind: str, message: str) -> None:
        """A fault the backend repaired itself (its worker thread may call this): counted. The
        file it replaced held what the memo mirrors, so the memo is cleared before the next load."""
        self._faults.get(kind, self._faults["other"]).inc()
        self._forget_all = True

    def _failed(self, exc: BaseException, *, is_check: bool = False) -> str:
        """Count a backend failure by cause; an `UNHEALTHY_KINDS` one makes the store unhealthy."""
        if isinstance(exc, TimeoutError):
            kind = "unresponsive" if is_check else "timeout"
        else:
            classify = getattr(self.backend, "fault_kind", None)
            kind = classify(exc) if classify is not None else "other"
            kind = kind if kind in self._faults else "other"
        self._faults[kind].inc()
        if kind in UNHEALTHY_KINDS:
            detail = str(exc) or type(exc).__name__
            if self.health.problem != kind:
                _log.warning("session store %s unhealthy: %s (%s)", self.backend.backend, kind, detail)
            self.health = StoreHealth(self.backend.backend, kind, detail)
            self._healthy_gauge.set(0)
        return kind

    def _level(self, kind: str, known: str | None) -> int:
        """The log level of a failed read or write of cause `kind` while the store's known
        problem is `known`: DEBUG when the unhealthy line already named it (a full disk fails
        every write until space is freed; `SAME_PROBLEM`) or when this cause was logged at
        WARNING since the last success (a lock another process holds); else WARNING, once.
        Every failure is counted by the metrics either way; the unhealthy and healthy-again
        transitions are WARNINGs once each (`_failed`, `_succeeded`)."""
        if kind in self._warned or (known is not None and known in (kind, SAME_PROBLEM.get(kind))):
            return logging.DEBUG
        self._warned.add(kind)
        return logging.WARNING

    def _succeeded(self) -> None:
        """A write or a check went through: the store is healthy again."""
        if self._warned:
            self._warned.clear()
        if self.health.problem is not None:
            _log.warning("session store %s healthy again (was %s)", self.backend.backend, self.health.problem)
            self.health = StoreHealth(self.backend.backend)
            self._healthy_gauge.set(1)

    async def check(self) -> StoreHealth:
        """Run the backend's health probe (one at a time: concurrent callers share it, bounded
        by `CHECK_TIMEOUT`) and return the resulting health. Backends without a probe are
        judged by their last write."""
        probe = getattr(self.backend, "check", None)
        if probe is None:
            return self.health
        if self._checking is None or self._checking.done():
            self._checking = create_task(self._check(probe), name="promptcache-store-check")
        return await asyncio.shield(self._checking)

    async def _check(self, probe: Any) -> StoreHealth:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                await probe()
        except Exception as exc:  # noqa: BLE001 - a failed probe is a health fact, never raised
            self._failed(exc, is_check=True)
        else:
            self._succeeded()
        return self.health

    async def load(self, tenant: str, session: str) -> SessionRecord | None:
        """The session's record, or `None` when absent, expired, unreadable or the store failed.

        A record saved on this replica and not yet written is returned without a backend read."""
        key = (tenant, session)
        self._loads += 1
        self._note_use(key)
        pending = self._pending.get(key)
        if pending is not None:
            return pending[0]  # `None`: a removal is pending
        if self._forget_all:
            self._forget_all = False
            self._memo.clear()
            self._memo_bytes = 0
            self._stored.clear()
            self._stored_bytes = 0
            self._written.clear()
            self._written_bytes = 0
        known = self._memo.get(key)
        if self.is_sole_writer and known is not None and known[2] > self._clock():
            self._memo.move_to_end(key)
            self._local_reads.inc()
            return known[1]
        written = self._take_written(key)
        if written is not None and written[2] > self._clock():
            self._local_reads.inc()
            self._note_loaded(key, written[1], written[0])  # its save encodes against it
            return written[1]
        if self._keys is not None and not self._keys.may_hold(tenant, session):
            self._local_reads.inc()
            return None
        # the parts of the record remembered are not read again: the answer carries the head
        # and the parts added since (an appended turn's), decoded against that record; without
        # one, against the tenant's donor (`_lent`)
        base = known
        lent = self._lent(tenant) if base is None else None
        held = base[0].parts if base is not None else lent[1].parts if lent is not None else ()
        names = frozenset(p.key for p in held)
        got = await self._get(tenant, session, is_record=True, known=names)
        if got is None:
            self._note_stored(key, None)  # absent (or unknown): a write sends every part
            return None
        head, parts = got
        known = self._memo.get(key)  # the memo may have changed while the read ran
        for found in (known, base) if known is not base else (known,):
            if found is not None and (found[0].head is head or found[0].head == head):
                if found is known:
                    self._memo.move_to_end(key)
                self._note_stored(key, found[0])
                self._note_loaded(key, found[1], found[0])
                return found[1]
        # the parts left out are `base`'s or `lent`'s (a memo entry that replaced it meanwhile
        # may lack them)
        against = base if base is not None else known
        decode_base = (against[1], against[0]) if against is not None and lent is None else lent
        try:
            record, layout = decode_layout(head, parts, decode_base)
        except RecordError as exc:
            self._get_errors.inc()
            self._note_stored(key, None)
            _log.warning("session store %s holds an unreadable record (%s)", self.backend.backend, exc)
            return None
        self._note_stored(key, layout)
        self._note_loaded(key, record, layout)
        self._remember(key, layout, record, 0.0)
        return record

    def _lent(self, tenant: str) -> tuple[SessionRecord, Layout] | None:
        """The tenant's donor (`_donors`: the parts of its newest record encoded in full, their
        sidecars decoded), as the base a read of a session the memo does not hold is decoded
        against: the parts it names by the donor's part names (xxh3-128 of the bytes, within the
        tenant) are neither read nor decoded again. Many sessions re-sending one history (an
        agent's sub-tasks, 32 sessions of the gateway bench's grow32 cell) name the same parts
        but the first, so such a read fetches and decodes the head and the session's own parts
        only: ~40 KB instead of ~600 KB, and its record shares the donor's sidecar objects."""
        donor = self._donors.get(tenant)
        return donor if donor is not None and donor[1].parts else None

    async def load_bytes(self, tenant: str, key: str) -> bytes | None:
        """A small value stored beside the tenant's records (`save_bytes_soon`), or `None`
        (absent, expired, or the store failed: counted and logged like `load`)."""
        pending = self._raw_pending.get((tenant, key))
        if pending is not None:
            return pending[0]
        if self._keys is not None and not self._keys.may_hold(tenant, key):
            self._local_reads.inc()
            return None
        got = await self._get(tenant, key, is_record=False)
        return got if isinstance(got, bytes) else None

    async def learn_keys(self) -> bool:
        """Sole writer: list the backend's keys (`keys()`, SQLite) into the filter that lets a
        load of a key the backend cannot hold skip the read. `False` (and every load reads)
        when not the sole writer, the backend cannot list, or the listing failed."""
        list_keys = getattr(self.backend, "keys", None)
        if self._keys_written is None or list_keys is None:
            return False
        try:
            listed = await list_keys()
        except Exception as exc:  # noqa: BLE001 - the filter is an optimisation: loads read instead
            # not counted as a fault: `check()` reports the store's health, this costs only reads
            _log.info("session store %s: listing keys failed (%s)", self.backend.backend, type(exc).__name__)
            return False
        keys, self._keys_written = self._keys_written, None
        if keys is None:  # another listing, run meanwhile, is done (a second caller: tests)
            return True
        for tenant, key in listed:
            keys.add(tenant, key)
        self._keys = keys
        return True

    async def _get(self, tenant: str, key: str, *, is_record: bool, known: frozenset[bytes] = frozenset()) -> Any:
        """One timed backend read (`get_parts` of a record, leaving out the parts named in
        `known`, else `get`); a failure is counted, logged and read as `None`."""
        started = time.perf_counter()
        try:
            if self._is_in_process:
                if is_record:
                    return await self.backend.get_parts(tenant, key, known)
                return await self.backend.get(tenant, key)
            return await self._bounded_get(tenant, key, is_record, known)
        except Exception as exc:  # noqa: BLE001 - a store failure never fails a request
            self._get_errors.inc()
            problem = self.health.problem
            kind = self._failed(exc)
            _log.log(
                self._level(kind, problem),
                "session store %s get failed (%s, %s)",
                self.backend.backend,
                type(exc).__name__,
                kind,
            )
            return None
        finally:
            self._get_time.observe(time.perf_counter() - started)

    async def _bounded_get(self, tenant: str, key: str, is_record: bool, known: frozenset[bytes]) -> Any:
        """`backend.get` bounded by `get_timeout`; raises `TimeoutError` past it. A read that
        finished while the event loop was busy elsewhere counts as in time: the bound is on the
        store, not on how long the loop took to look (`asyncio.timeout` around the call would
        throw such a result away); one whose answer still needs a few loop turns when the late
        timer fires gets one bound more (`LATE_LOOP`). A backend with `get_within` (SQLite) applies the bound to
        its own time itself (`SqliteStore.get_within`)."""
        if is_record:
            get_parts_within = getattr(self.backend, "get_parts_within", None)
            if get_parts_within is not None:
                return await get_parts_within(tenant, key, self.get_timeout, known)
        else:
            get_within = getattr(self.backend, "get_within", None)
            if get_within is not None:
                return await get_within(tenant, key, self.get_timeout)
        call = self.backend.get_parts(tenant, key, known) if is_record else self.backend.get(tenant, key)
        read = create_task(call, name="promptcache-store-get", is_awaited=True)  # `_get` logs its failure
        loop = asyncio.get_running_loop()
        due = loop.time() + self.get_timeout
        done, _ = await asyncio.wait((read,), timeout=self.get_timeout)
        if not done and loop.time() - due > self.get_timeout * LATE_LOOP:
            # the loop looked this late (busy elsewhere): the answer may be in, unread; the read
            # gets one more bound, so a busy loop does not make a fast store's answer a timeout
            done, _ = await asyncio.wait((read,), timeout=self.get_timeout)
        if not done:
            read.cancel()
            raise TimeoutError(f"no answer within {self.get_timeout:g} s")
        return read.result()

    def save_bytes_soon(self, tenant: str, key: str, data: bytes, ttl: float = RECORD_TTL) -> None:
        """Write a small value in the background (the newest one wins; one writer per key)."""
        slot = (tenant, key)
        is_new = slot not in self._raw_pending
        self._raw_pending[slot] = (data, ttl)
        if is_new and self._writers.spawn(self._write_bytes(slot), name="promptcache-store-save") is None:
            self._raw_pending.pop(slot, None)
            self._dropped.inc()

    async def _write_bytes(self, slot: tuple[str, str]) -> None:
        try:
            while (item := self._raw_pending.get(slot)) is not None:
                await self._put_bytes(slot, item[0], item[1])
                if self._raw_pending.get(slot) is item:
                    break
        finally:
            self._raw_pending.pop(slot, None)

    async def _put_bytes(
        self, slot: tuple[str, str], data: bytes, ttl: float, parts: list[Part] | None = None
    ) -> bool | None:
        """One timed backend write (`put`, or `put_parts` of `data` as the head when `parts` is
        given); a failure is counted, logged and returns `False`. A write in parts the backend
        refused (a part named is not held: nothing written) returns `None`."""
        keys = self._keys if self._keys is not None else self._keys_written
        if keys is not None:
            keys.add(*slot)  # before the write: one that times out here may still land
        started = time.perf_counter()
        is_written = True
        try:
            if self._is_in_process:
                if parts is not None:
                    is_written = await self.backend.put_parts(slot[0], slot[1], data, parts, ttl)
                else:
                    await self.backend.put(slot[0], slot[1], data, ttl)
            elif self._put_parts_within is not None and self._put_within is not None:
                # the backend bounds the write by its own time, not by its queue (SQLite)
                if parts is not None:
                    is_written = await self._put_parts_within(slot[0], slot[1], data, parts, ttl, self.put_timeout)
                else:
                    await self._put_within(slot[0], slot[1], data, ttl, self.put_timeout)
            else:
                async with asyncio.timeout(self.put_timeout):
                    if parts is not None:
                        is_written = await self.backend.put_parts(slot[0], slot[1], data, parts, ttl)
                    else:
                        await self.backend.put(slot[0], slot[1], data, ttl)
        except Exception as exc:  # noqa: BLE001 - a store failure never fails a request
            self._put_errors.inc()
            problem = self.health.problem
            kind = self._failed(exc)
            _log.log(
                self._level(kind, problem),
                "session store %s put failed (%s, %s)",
                self.backend.backend,
                type(exc).__name__,
                kind,
            )
            return False
        finally:
            self._put_time.observe(time.perf_counter() - started)
        self._succeeded()
        return True if is_written else None

    async def save(self, tenant: str, session: str, record: SessionRecord, ttl: float = RECORD_TTL) -> bool:
        """Write `record` for `ttl` seconds now; `False` when the store failed (counted, logged).

        The request path uses `save_soon`."""
        key = (tenant, session)
        return await self._put(key, encode_layout(record, self._base(key)), record, ttl)

    def _base(self, key: tuple[str, str]) -> tuple[SessionRecord, Layout] | None:
        """The session's newest record this replica knows and its layout (pending, else
        remembered), which the next record is encoded against; `None` without one."""
        pending = self._pending.get(key)
        if pending is not None:
            return (pending[0], pending[1]) if pending[0] is not None else None
        known = self._memo.get(key)
        if known is not None:
            return known[1], known[0]
        loaded = self._loaded.pop(key, None)
        record = loaded[0]() if loaded is not None else None
        return (record, loaded[1]) if loaded is not None and record is not None else None

    def _note_loaded(self, key: tuple[str, str], record: SessionRecord, layout: Layout) -> None:
        """Keep a weak reference to the record a load returned, and its parts (`_loaded`)."""
        if not layout.parts:
            return
        self._loaded.pop(key, None)
        self._loaded[key] = (weakref.ref(record), Layout(b"", layout.without_data().parts, layout.counts))
        if len(self._loaded) > LOADED_SESSIONS:
            self._loaded.popitem(last=False)

    async def _put(
        self, key: tuple[str, str], layout: Layout, record: SessionRecord | None, ttl: float, is_pending: bool = False
    ) -> bool:
        """Write `record` (`None`: remove the session's); `is_pending`: a pending write's
        (`_write_pending`), whose record stays at hand for the session's next load
        (`_keep_written`)."""
        expires = self._clock() + ttl
        if record is None or ttl <= 0:
            is_written = await self._put_bytes(key, b"", 0.0)
        else:
            held = self._stored_parts(key)  # of the value the backend holds before this write
            early = self._take_encoded(key, layout)
            if any(p.data is None and p.key not in held for p in layout.parts):
                # a pending layout keeps no part's bytes: its save's encoding, else encoded again,
                # against the tenant's donor (the same layout: a new session's parts are taken
                # from it as they are, not encoded again on the event loop; attack pass, s16)
                is_whole = early is not None and all(p.data is not None or p.key in held for p in early.parts)
                if early is None or not is_whole:
                    early = encode_layout(record, None, self._donors.get(key[0]))
                layout = early
            # parts the backend holds (written or read here) are named, not sent again
            parts = [Part(p.key, p.size) if p.key in held else p for p in layout.parts]
            is_written = await self._put_bytes(key, layout.head, ttl, parts)
            if is_written is None:  # a part named was gone: send them all
                held = set()
                layout = encode_layout(record, None, self._donors.get(key[0]))
                is_written = await self._put_bytes(key, layout.head, ttl, list(layout.parts))
        if not is_written:
            if self.is_sole_writer and record is not None and ttl > 0:
                self._keep_unwritten(key, layout, record, expires, held)
            else:
                self._forget(key)  # a failed write may still have landed (a timeout): read it next time
                self._note_stored(key, None)
            return False
        if record is not None and ttl > 0:
            self._note_stored(key, layout)
            kept = layout.without_data()
            self._remember(key, kept, record, expires)
            if is_pending:
                self._keep_written(key, kept, record, expires)
        else:  # removed
            self._note_stored(key, None)
            self._forget(key)
        return True

    def _keep_written(self, key: tuple[str, str], layout: Layout, record: SessionRecord, expires: float) -> None:
        """Sole writer: keep `record`, whose pending write just stored it for `key`, for the session's next load
        (`_written`) when the memo did not take it in (`_remember`) and it fits the room the
        pending writes leave of `max_pending_bytes` (each counted as `_held`, the oldest dropped
        for it). Many long sessions taking turns (32 of 600 KB: the memo holds six) then find
        their record in memory while the pending writes leave room, as they do while their
        writes are still pending, instead of reading the backend: a read that keeps the body
        gate's place (`proxy.admission`) for as long as the busy event loop takes to hand its
        answer back, tens of ms, with the CPU idle once every place waits so."""
        if not self.is_sole_writer or key in self._memo:
            return
        self._take_written(key)
        pending = self._pending.get(key)
        if pending is not None and pending[0] is not record:
            return  # superseded: the newer record is pending
        size = _held(layout, record)
        # the write's own pending entry leaves as this one comes
        room = self.max_pending_bytes - self._pending_bytes + (_held(pending[1], record) if pending else 0)
        if size > room:
            return
        self._written[key] = (layout, record, expires)
        self._written_bytes += size
        self._trim_written(room)

    def _take_written(self, key: tuple[str, str]) -> tuple[Layout, SessionRecord, float] | None:
        """Remove `key`'s entry of `_written`; it, or `None`."""
        found = self._written.pop(key, None)
        if found is not None:
            self._written_bytes -= _held(found[0], found[1])
        return found

    def _trim_written(self, room: int) -> None:
        """Drop the oldest `_written` entries until they take at most `room` bytes."""
        while self._written_bytes > room and self._written:
            _, (layout, record, _) = self._written.popitem(last=False)
            self._written_bytes -= _held(layout, record)

    @property
    def written_bytes(self) -> int:
        """Memory the records kept for their session's next load take (`_written`, each as `_held`)."""
        return self._written_bytes

    def _keep_unwritten(
        self, key: tuple[str, str], layout: Layout, record: SessionRecord, expires: float, held: set[bytes]
    ) -> None:
        """Sole writer: a write of `record` failed (a full disk, a read-only mount, a timeout).
        Nobody else writes the backend, so `record` is still the session's newest: the memo keeps
        it (until `expires`) and the session's next turn replays it rather than going without.
        The backend holds either its older value (whose parts are `held`) or this one (a
        timed-out write may have landed), so only the part names both hold are known to be
        stored: the next write sends the others (and every part when the backend still refuses
        one it names)."""
        self._remember(key, layout.without_data(), record, expires, is_forced=True)
        self._set_stored(key, b"".join(p.key for p in layout.parts if p.key in held))

    def _keep_encoded(self, key: tuple[str, str], pending: Layout, encoded: Layout) -> None:
        """Keep `encoded` (`pending` with its parts' bytes) for `key`'s write (`_encoded`). The
        bytes of the parts the entry it replaces carried and `encoded` names only (a superseded
        save's new parts: its write never ran, so the backend lacks them) are carried over, so
        the write does not encode the whole record again for them."""
        prior = self._encoded.get(key)
        self._take_encoded(key, None)
        if prior is not None and any(p.data is None for p in encoded.parts):
            carried = {p.key: p for p in prior[1].parts if p.data is not None}
            if carried:
                parts = tuple(carried.get(p.key, p) if p.data is None else p for p in encoded.parts)
                encoded = Layout(encoded.head, parts, encoded.counts)
        size = sum(p.size for p in encoded.parts if p.data is not None)
        if not size or size > ENCODED_BYTES:
            return
        self._encoded[key] = (pending, encoded)
        self._encoded_bytes += size
        while self._encoded_bytes > ENCODED_BYTES:
            _, (_, dropped) = self._encoded.popitem(last=False)
            self._encoded_bytes -= sum(p.size for p in dropped.parts if p.data is not None)

    def _take_encoded(self, key: tuple[str, str], pending: Layout | None) -> Layout | None:
        """Remove `key`'s entry of `_encoded`; its bytes-carrying layout when it is `pending`'s."""
        found = self._encoded.pop(key, None)
        if found is None:
            return None
        self._encoded_bytes -= sum(p.size for p in found[1].parts if p.data is not None)
        return found[1] if found[0] is pending else None

    def _stored_parts(self, key: tuple[str, str]) -> set[bytes]:
        """The names of the parts the backend holds for `key` (`_stored`, else the memo's
        layout); empty when unknown."""
        names = self._stored.get(key)
        if names is not None:
            self._stored.move_to_end(key)
            return {names[i : i + 16] for i in range(0, len(names), 16)}
        known = self._memo.get(key)
        return {p.key for p in known[0].parts} if known is not None else set()

    def _note_stored(self, key: tuple[str, str], layout: Layout | None) -> None:
        """The backend's value for `key` is now `layout` (`None`: absent or unknown)."""
        if layout is None or not layout.parts or any(len(p.key) != 16 for p in layout.parts):
            old = self._stored.pop(key, None)
            if old is not None:
                self._stored_bytes -= STORED_ENTRY_BYTES + len(old)
            return
        self._set_stored(key, b"".join(p.key for p in layout.parts))

    def _set_stored(self, key: tuple[str, str], names: bytes) -> None:
        """The backend holds the parts `names` (16 bytes each, back to back; empty: none of the
        memo's, which then no longer stands in for the index) for `key` (`_stored`, LRU)."""
        old = self._stored.pop(key, None)
        if old is not None:
            self._stored_bytes -= STORED_ENTRY_BYTES + len(old)
        self._stored[key] = names
        self._stored_bytes += STORED_ENTRY_BYTES + len(names)
        while self._stored_bytes > STORED_PARTS_BYTES:
            _, dropped = self._stored.popitem(last=False)
            self._stored_bytes -= STORED_ENTRY_BYTES + len(dropped)

    def save_soon(self, tenant: str, session: str, record: SessionRecord, ttl: float = RECORD_TTL) -> bool:
        """Save `record` in the background (module docstring); returns at once. `False` when it
        was dropped because too many writes are pending (counted)."""
        key = (tenant, session)
        base = self._base(key)
        donor = self._donors.get(tenant) if base is None else None
        encoded = layout = encode_layout(record, base, donor)
        stored: SessionRecord | None = record
        if self.max_record_bytes is not None and layout.size > self.max_record_bytes:
            # too large to keep: the older record goes too (the next turn goes without replay)
            self._skipped.inc()
            stored, layout, ttl = None, _REMOVED, 0.0
        else:
            # the parts wait as their names only: the write takes the bytes of the ones the
            # backend lacks (a first turn's, or after a refusal) from `_encoded` when the newest
            # saves' there still holds them, else encodes them again; not the memory of every wait
            layout = layout.without_data()
            self._keep_donor(tenant, record, encoded)
        old = self._pending.get(key)
        held = self._pending_bytes - (_held(old[1], old[0]) if old is not None else 0)
        size = _held(layout, stored)
        if (old is None and len(self._pending) >= MAX_PENDING_WRITES) or held + size > self.max_pending_bytes:
            self._dropped.inc()
            _log.warning("session store %s: too many pending writes, record dropped", self.backend.backend)
            return False
        self._pending[key] = (stored, layout, ttl)
        self._pending_bytes = held + size
        self._take_written(key)  # superseded
        self._trim_written(self.max_pending_bytes - self._pending_bytes)
        if stored is not None:
            self._keep_encoded(key, layout, encoded)
        else:
            self._take_encoded(key, None)
        if old is None and self._writers.spawn(self._write_pending(key), name="promptcache-store-save") is None:
            # the writers are shared with `save_bytes_soon`: a record no task would write is
            # dropped and counted, not left pending for ever (attack pass, session 9)
            del self._pending[key]
            self._pending_bytes = held
            self._take_encoded(key, None)
            self._dropped.inc()
            _log.warning("session store %s: too many pending writes, record dropped", self.backend.backend)
            return False
        self._pending_gauge.set(len(self._pending))
        return True

    def _keep_donor(self, tenant: str, record: SessionRecord, encoded: Layout) -> None:
        """Keep `record` as `tenant`'s donor (`_donors`) when `encoded`, its layout, carries
        every part's bytes and they fit `DONOR_BYTES`; else leave the tenant's donor as it is."""
        if not encoded.parts or any(p.data is None for p in encoded.parts):
            return
        # what `encode_layout` reads of a donor: the sidecars its parts hold, its parts and
        # their counts; not the record's head, pins or tail, which only the memo counts
        lent = SessionRecord(
            chain=b"", ends=(), model="", params_digest=b"", sidecars=record.sidecars[: sum(encoded.counts)]
        )
        donor = (lent, Layout(b"", encoded.parts, encoded.counts))
        size = _donor_held(donor)
        if size > DONOR_BYTES:
            return
        old = self._donors.pop(tenant, None)
        if old is not None:
            self._donor_bytes -= _donor_held(old)
        self._donors[tenant] = donor
        self._donor_bytes += size
        while self._donor_bytes > DONOR_BYTES:
            _, dropped = self._donors.popitem(last=False)
            self._donor_bytes -= _donor_held(dropped)

    async def _write_pending(self, key: tuple[str, str]) -> None:
        """Write `key`'s pending record until none newer is left (one task per key)."""
        try:
            while (item := self._pending.get(key)) is not None:
                await self._put(key, item[1], item[0], item[2], is_pending=True)
                if self._pending.get(key) is item:
                    break
        finally:
            done = self._pending.pop(key, None)
            if done is not None:
                self._pending_bytes -= _held(done[1], done[0])
            self._pending_gauge.set(len(self._pending))

    async def flush(self) -> None:
        """Wait until every pending record is written (or failed); tests and shutdown."""
        await self._writers.drain(DRAIN_TIMEOUT)

    @property
    def pending_writes(self) -> int:
        """Sessions whose record waits for its background write."""
        return len(self._pending)

    @property
    def encoded_bytes(self) -> int:
        """Part bytes kept from the saves' encoding for their writes (`ENCODED_BYTES` at most)."""
        return self._encoded_bytes

    @property
    def pending_bytes(self) -> int:
        """Memory the records waiting for their write take (each counted as `_held`)."""
        return self._pending_bytes

    def pending_value_bytes(self) -> tuple[int, int]:
        """`(counted, distinct)` bytes of the sidecar values the pending records hold: each
        record's own sum (what `_held` counts them as), and the sum over distinct value objects
        (what they take: records of sessions that share a conversation, or a session's
        successive turns, share their sidecars). A walk of every pending sidecar, for
        diagnostics such as `bench/memory_bench.py`, not the request path."""
        counted = 0
        distinct: dict[int, int] = {}
        for record, _, _ in self._pending.values():
            if record is None:
                continue
            for sidecar in record.sidecars:
                counted += len(sidecar.value)
                distinct[id(sidecar.value)] = len(sidecar.value)
        return counted, sum(distinct.values())

    def _note_use(self, key: tuple[str, str]) -> None:
        """A load of `key` at the clock `_loads` (`_used`)."""
        last = self._used.pop(key, None)
        self._used[key] = (self._loads, last[0] if last is not None else None)
        if len(self._used) > SEEN_SESSIONS:
            self._used.popitem(last=False)

    def _remember(
        self, key: tuple[str, str], layout: Layout, record: SessionRecord, expires: float, is_forced: bool = False
    ) -> None:
        """Keep `layout` and its decoded `record` for `key` (bounded in bytes; see the module
        docstring); `expires`: when the backend's copy expires (epoch seconds), `0.0` when
        unknown. A session the memo held replaces its record, evicting the least recently used;
        another is taken in by `proxy.cache_admission.admits` (how long it was away, between
        its last two loads, against the idle time of the records it would evict), or always
        when `is_forced`."""
        was_held = key in self._memo
        self._forget(key)
        size = _held(layout, record)
        if size > self.memo_bytes:
            return
        if not was_held and not is_forced:
            used = self._used
            last, before = used.get(key, (self._loads, None))
            held = ((used.get(k, (0, None))[0], _held(v[0], v[1])) for k, v in self._memo.items())
            gap = None if before is None else last - before
            if not admits(self._memo_bytes + size - self.memo_bytes, gap, self._loads, held, len(self._memo)):
                return
        self._memo[key] = (layout, record, expires)
        self._memo_bytes += size
        while self._memo_bytes > self.memo_bytes:
            _, (dropped, gone, _) = self._memo.popitem(last=False)
            self._memo_bytes -= _held(dropped, gone)

    def _forget(self, key: tuple[str, str]) -> None:
        self._take_written(key)
        old = self._memo.pop(key, None)
        if old is not None:
            self._memo_bytes -= _held(old[0], old[1])

    async def close(self) -> None:
        """Drain the pending writes (at most `DRAIN_TIMEOUT` seconds), then close the backend."""
        if self._checking is not None and not self._checking.done():
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checking
        left = await self._writers.drain(DRAIN_TIMEOUT)
        if left:
            _log.warning("session store %s: %d pending writes cancelled at shutdown", self.backend.backend, left)
        try:
            await self.backend.close()
        except Exception as exc:  # noqa: BLE001 - closing must not mask the shutdown
            _log.warning("session store %s close failed (%s)", self.backend.backend, type(exc).__name__)


class StateDirError(RuntimeError):
    """The state directory cannot be restricted to its owner (mode 0700)."""


def tighten_state_dir(path: Path) -> None:
    """Create `path` mode 0700, or restrict an existing one to 0700 (it holds prompt text and
    the tenant secret); raises `StateDirError` naming the directory when that is not possible."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError as exc:
        raise StateDirError(
            f"state_dir {path} cannot be restricted to mode 0700 ({exc.strerror}); "
            "set state_dir to a directory this user owns"
        ) from exc


async def store_ctx(app: web.Application) -> AsyncIterator[None]:
    """`app.cleanup_ctx` entry: sets `app[SERVICES].store` and `.sessions`, closes them on exit."""
    from proxy.appkeys import SERVICES
    from proxy.session_identity import SessionState

    services = app[SERVICES]
    settings = services.settings
    url = settings.store or default_store_url(settings.state_dir)
    tenant_bytes = settings.tenant_store_bytes
    backend = open_store(url, max_bytes=settings.store_max_bytes, max_tenant_bytes=tenant_bytes)
    if tenant_bytes >= settings.store_max_bytes and backend.backend == "sqlite":
        _log.warning(
            "store_max_bytes_per_tenant (%d) is not below store_max_bytes (%d): one tenant can evict "
            "every other tenant's session records",
            tenant_bytes,
            settings.store_max_bytes,
        )
    if backend.backend != "memory":
        tighten_state_dir(Path(settings.state_dir))
    if backend.backend == "redis" and not settings.secret:
        _log.warning(
            "redis session store without a configured secret: replicas share sessions only if they "
            "share %s (set `secret` on every replica)",
            Path(settings.state_dir) / "secret",
        )
    # one `serve` process on a SQLite file is its only writer (`--workers N` share it; Redis is
    # shared by replicas): what it wrote last is what the file holds
    store = RecordStore(
        backend,
        services.metrics,
        max_record_bytes=tenant_bytes,
        is_sole_writer=backend.backend == "sqlite" and settings.workers == 1,
        memo_bytes=MemoryBudget.of_mb(settings.memory_budget_mb).records,
    )
    # The file is created (and the store's health known) now, not on the first request's
    # bounded read; a broken store costs replay and readiness, never the start.
    await store.check()
    services.store = store
    services.sessions = await SessionState.start(settings, is_persistent=backend.backend != "memory")
    checker = create_task(_check_periodically(store), name="promptcache-store-health")
    learner = create_task(store.learn_keys(), name="promptcache-store-keys")
    try:
        yield
    finally:
        for task in (checker, learner):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        services.store = None
        services.sessions = None
        await store.close()


async def _check_periodically(store: RecordStore) -> None:
    """Run `store.check()` every `CHECK_INTERVAL` seconds (health without traffic)."""
    while True:
        await asyncio.sleep(CHECK_INTERVAL)
        await store.check()
