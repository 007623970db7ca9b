"""`RecordStore`: timing and error metrics per backend, bounded waits, failures absorbed."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Collection, Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.store import RecordStore, open_store
from proxy.store.base import Part
from proxy.store.codec import PART_BYTES, SessionRecord, Sidecar, encode_layout, encode_record
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.sqlite import SqliteStore

RECORD = SessionRecord(
    chain=b"\x00" * 32,
    ends=(5, 9),
    model="m",
    params_digest=b"\x01" * 16,
    sidecars=(Sidecar(0, b"\x02" * 16, b'{"role":"user","content":"hi"}'),),
)


def sample(metrics: Metrics, name: str, backend: str, operation: str) -> float:
    value = metrics.registry.get_sample_value(name, {"backend": backend, "operation": operation})
    return 0.0 if value is None else value


def errors(metrics: Metrics, backend: str, operation: str) -> float:
    return sample(metrics, "promptcache_session_store_errors_total", backend, operation)


def timings(metrics: Metrics, backend: str, operation: str) -> float:
    return sample(metrics, "promptcache_session_store_operation_duration_seconds_count", backend, operation)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


async def test_save_load_counts_timings(metrics: Metrics) -> None:
    store = RecordStore(open_store("memory://"), metrics)
    assert await store.save("t", "s", RECORD)
    assert await store.load("t", "s") == RECORD
    assert await store.load("t", "other") is None
    assert timings(metrics, "memory", "put") == 1
    assert timings(metrics, "memory", "get") == 2
    assert errors(metrics, "memory", "get") == 0


async def test_unreadable_record_is_a_counted_miss(metrics: Metrics) -> None:
    backend = open_store("memory://")
    await backend.put("t", "s", b"garbage", 60)
    store = RecordStore(backend, metrics)
    assert await store.load("t", "s") is None
    assert errors(metrics, "memory", "get") == 1


@pytest.fixture
async def blackhole() -> AsyncIterator[int]:
    """A TCP server that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_slow_store_is_bounded_and_counted(metrics: Metrics, blackhole: int) -> None:
    backend = RedisStore(f"redis://127.0.0.1:{blackhole}/0")
    store = RecordStore(backend, metrics, get_timeout=0.05, put_timeout=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await store.load("t", "s") is None
    assert not await store.save("t", "s", RECORD)
    assert loop.time() - started < 0.5
    assert errors(metrics, "redis", "get") == 1
    assert errors(metrics, "redis", "put") == 1
    await store.close()


async def test_unreachable_redis_is_counted(metrics: Metrics) -> None:
    from tests.store.redis_server import free_port

    store = RecordStore(open_store(f"redis://127.0.0.1:{free_port()}/0"), metrics)
    assert await store.load("t", "s") is None
    assert not await store.save("t", "s", RECORD)
    assert errors(metrics, "redis", "get") == 1
    assert errors(metrics, "redis", "put") == 1
    await store.close()


async def test_locked_sqlite_is_counted_then_recovers(metrics: Metrics, tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = RecordStore(SqliteStore(path), metrics)
    assert await store.save("t", "s", RECORD)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    assert not await store.save("t", "s", RECORD)
    assert errors(metrics, "sqlite", "put") == 1
    holder.execute("ROLLBACK")
    holder.close()
    assert await store.load("t", "s") == RECORD
    await store.close()


async def test_a_read_of_unchanged_bytes_is_not_decoded_again(metrics: Metrics) -> None:
    backend = open_store("memory://")
    store = RecordStore(backend, metrics)
    assert await store.save("t", "s", RECORD)
    first = await store.load("t", "s")
    assert first is RECORD  # the bytes are the ones written: the record written
    other = SessionRecord(chain=b"\x09" * 16, ends=(3,), model="m2", params_digest=b"\x01" * 16)
    from proxy.store.codec import encode_record

    await backend.put("t", "s", encode_record(other), 60)  # another replica wrote: decoded anew
    assert await store.load("t", "s") == other
    assert await store.load("t", "other") is None
    await backend.put("u", "s", b"garbage", 60)  # another key: never the memo of ("t", "s")
    assert await store.load("u", "s") is None


async def test_the_decoded_memo_is_bounded_in_bytes(metrics: Metrics) -> None:
    from proxy.store.codec import encode_record

    # what a decoded record holds: its bytes, its one sidecar's value again (decoded beside the
    # bytes that encode it), 256 per sidecar, 40 per `ends` entry, 1,536 for the record itself
    size = len(encode_record(RECORD)) + len(RECORD.sidecars[0].value) + 256 * 1 + 40 * 2 + 1536
    store = RecordStore(open_store("memory://"), metrics, memo_bytes=3 * size)
    for i in range(10):
        assert await store.save("t", f"s{i}", RECORD)
    # sessions never seen again evict none of the held ones (proxy.cache_admission)
    assert list(store._memo) == [("t", "s0"), ("t", "s1"), ("t", "s2")]
    assert store._memo_bytes == 3 * size


async def test_more_sessions_than_the_memo_holds_take_turns_and_the_ones_held_stay(metrics: Metrics) -> None:
    from proxy.store.codec import encode_record

    size = len(encode_record(RECORD)) + len(RECORD.sidecars[0].value) + 256 * 1 + 40 * 2 + 1536
    store = RecordStore(open_store("memory://"), metrics, is_sole_writer=True, memo_bytes=3 * size)

    async def rounds(sessions: Sequence[str], count: int) -> None:
        for _ in range(count):
            for s in sessions:
                await store.load("t", s)
                assert await store.save("t", s, RECORD)

    # a new session counts as away for as many loads as the memo holds records: s3 displaces s0
    await rounds(["s0", "s1", "s2", "s3"], 1)
    assert list(store._memo) == [("t", "s1"), ("t", "s2"), ("t", "s3")]
    before = local_reads(metrics, "memory")
    await rounds(["s0", "s1", "s2", "s3"], 2)
    # s0, away 4 loads, displaces none of the three, idle 3 at most; plain LRU evicted each
    # record just before its next load: no local read at all
    assert local_reads(metrics, "memory") - before == 6
    assert list(store._memo) == [("t", "s1"), ("t", "s2"), ("t", "s3")]
    # s1 stops: a round later s0, away 3 loads, takes the place of s1, idle 4
    await rounds(["s0", "s2", "s3"], 1)
    assert list(store._memo) == [("t", "s1"), ("t", "s2"), ("t", "s3")]
    await rounds(["s0", "s2", "s3"], 1)
    assert list(store._memo) == [("t", "s0"), ("t", "s2"), ("t", "s3")]
    assert store._memo_bytes == 3 * size


def local_reads(metrics: Metrics, backend: str) -> float:
    value = metrics.registry.get_sample_value("promptcache_session_store_local_reads_total", {"backend": backend})
    return 0.0 if value is None else value


async def test_the_sole_writer_answers_its_own_newest_record_without_a_read(metrics: Metrics, tmp_path: Path) -> None:
    now = [1000.0]
    backend = SqliteStore(tmp_path / "sessions.db", clock=lambda: now[0])
    store = RecordStore(backend, metrics, is_sole_writer=True, clock=lambda: now[0])
    assert await store.save("t", "s", RECORD, ttl=60)
    assert await store.load("t", "s") is RECORD
    assert await store.load("t", "s") is RECORD
    assert (local_reads(metrics, "sqlite"), timings(metrics, "sqlite", "get")) == (2, 0)
    assert await store.load("t", "other") is None  # not written here: read
    assert timings(metrics, "sqlite", "get") == 1
    now[0] += 61  # the written copy expired: read, and the store has none
    assert await store.load("t", "s") is None
    assert (local_reads(metrics, "sqlite"), timings(metrics, "sqlite", "get")) == (2, 2)
    await store.close()


async def test_a_replaced_file_clears_the_sole_writers_memory(metrics: Metrics, tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = RecordStore(SqliteStore(path), metrics, is_sole_writer=True)
    assert await store.save("t", "s", RECORD)
    path.unlink()  # someone purged the file: what was deleted stays deleted
    await store.check()  # the backend sees the file gone and starts a new one
    assert await store.load("t", "s") is None
    assert local_reads(metrics, "sqlite") == 0
    await store.close()


async def test_another_writer_is_seen_unless_sole_writer(metrics: Metrics) -> None:
    backend = open_store("memory://")
    store = RecordStore(backend, metrics)
    assert await store.save("t", "s", RECORD)
    other = SessionRecord(chain=b"\x09" * 16, ends=(3,), model="m2", params_digest=b"\x01" * 16)
    from proxy.store.codec import encode_record

    await backend.put("t", "s", encode_record(other), 60)  # another worker or replica wrote
    assert await store.load("t", "s") == other
    assert local_reads(metrics, "memory") == 0


async def test_the_sole_writer_knows_a_key_absent_without_a_read(metrics: Metrics, tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    first = SqliteStore(path)
    await first.put("t", "before", b"x", 60)  # written by an earlier run
    await first.close()
    store = RecordStore(SqliteStore(path), metrics, is_sole_writer=True)
    assert await store.load("t", "new") is None  # not listed yet: read
    assert timings(metrics, "sqlite", "get") == 1
    assert await store.learn_keys()
    assert await store.load("t", "new") is None  # listed as absent: no read
    assert await store.load_bytes("t", "pacing") is None
    assert timings(metrics, "sqlite", "get") == 1
    assert await store.load_bytes("t", "before") == b"x"  # listed: read
    assert await store.save("t", "later", RECORD)
    assert await store.load("t", "later") is RECORD
    assert (timings(metrics, "sqlite", "get"), local_reads(metrics, "sqlite")) == (2, 3)
    await store.close()


async def test_only_the_sole_writer_skips_reads(metrics: Metrics, tmp_path: Path) -> None:
    store = RecordStore(SqliteStore(tmp_path / "sessions.db"), metrics)
    assert not await store.learn_keys()
    assert await store.load("t", "new") is None
    assert timings(metrics, "sqlite", "get") == 1
    await store.close()


def test_the_key_filter_holds_what_was_added() -> None:
    from proxy.store import KeyFilter

    keys = KeyFilter(1 << 16)
    added = [("t", f"s{i}") for i in range(500)]
    for tenant, key in added:
        keys.add(tenant, key)
    assert all(keys.may_hold(t, k) for t, k in added)
    assert sum(keys.may_hold("t", f"other{i}") for i in range(10_000)) < 100  # ~0.01% expected
    assert not keys.may_hold("u", "s1")  # another tenant's key


class HeldWrites(MemoryStore):
    """A memory backend whose writes wait until `release` is set (a writer that is busy)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def put(self, tenant: str, session: str, value: bytes, ttl: float) -> None:
        await self.release.wait()
        await super().put(tenant, session, value, ttl)

    async def put_parts(self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float) -> bool:
        await self.release.wait()
        return await super().put_parts(tenant, session, head, parts, ttl)


async def test_pending_writes_are_bounded_in_bytes_counting_both_copies(metrics: Metrics) -> None:
    """Records waiting for a busy writer hold the record and its head (their parts wait as names
    and are encoded at the write): the bound counts them, and the saves beyond it are dropped
    and counted."""
    backend = HeldWrites()
    big = SessionRecord(
        chain=b"\x00" * 32, ends=(1,), model="m", params_digest=b"\x01" * 16,
        sidecars=(Sidecar(0, b"\x02" * 16, b'"' + b"x" * 100_000 + b'"'),),
    )
    layout = encode_layout(big)  # the head and its one part (the sidecar is over PART_BYTES)
    assert layout.size > len(encode_record(big)) > PART_BYTES
    # the record: its encoded size, 256 per sidecar, 40 per `ends` entry, 1,536 for the record
    # itself (its one sidecar is in the part, not in the head)
    size = layout.size + 256 + 40 + 1536
    store = RecordStore(backend, metrics, max_pending_bytes=5 * size)
    accepted = [store.save_soon("t", f"s{i}", big) for i in range(8)]
    assert accepted == [True] * 5 + [False] * 3
    dropped = metrics.registry.get_sample_value("promptcache_session_store_writes_dropped_total", {"backend": "memory"})
    assert dropped == 3
    assert (store.pending_writes, store.pending_bytes) == (5, 5 * size)
    assert store.save_soon("t", "s0", big)  # a newer record of a pending session replaces it
    assert (store.pending_writes, store.pending_bytes) == (5, 5 * size)
    backend.release.set()
    await store.flush()
    assert (store.pending_writes, store.pending_bytes) == (0, 0)
    assert [await backend.get("t", f"s{i}") is not None for i in range(8)] == [True] * 5 + [False] * 3


async def test_a_save_no_writer_would_take_is_dropped_not_left_pending(metrics: Metrics) -> None:
    """The background writers are shared by the records and the small values
    (`save_bytes_soon`, a tenant's pacing): with one small value and 1,023 records waiting, the
    1,024th session's record passed the pending bound but got no writer, and stayed pending for
    ever (never written, `pending_bytes` never back to 0: attack pass, session 9). It is
    dropped and counted instead, and everything else is written."""
    from proxy.store import MAX_PENDING_WRITES

    backend = HeldWrites()
    store = RecordStore(backend, metrics)
    store.save_bytes_soon("t", "pacing", b"p")
    accepted = [store.save_soon("t", f"s{i}", RECORD) for i in range(MAX_PENDING_WRITES)]
    assert accepted == [True] * (MAX_PENDING_WRITES - 1) + [False]
    dropped = metrics.registry.get_sample_value("promptcache_session_store_writes_dropped_total", {"backend": "memory"})
    assert dropped == 1
    assert store.pending_writes == MAX_PENDING_WRITES - 1
    backend.release.set()
    await store.flush()
    assert (store.pending_writes, store.pending_bytes) == (0, 0)
    assert await backend.get("t", "pacing") == b"p"
    last = MAX_PENDING_WRITES - 1
    assert [await store.load("t", f"s{i}") is not None for i in (0, last - 1, last)] == [True, True, False]


async def test_a_write_sends_the_parts_its_save_encoded_the_newest_within_their_bound(metrics: Metrics) -> None:
    """A save keeps the bytes of the parts it encoded for its write (`ENCODED_BYTES` in all, the
    newest saves'), so a first turn is encoded once; a burst beyond the bound keeps the newest
    and the older writes encode theirs again: every record is written whole either way, and
    nothing stays kept once the writes are done."""
    from proxy.store import ENCODED_BYTES

    def record(i: int) -> SessionRecord:
        return SessionRecord(
            chain=b"\x00" * 32, ends=(1,), model="m", params_digest=b"\x01" * 16,
            sidecars=tuple(Sidecar(n, bytes([i]) * 16, b'"' + b"x" * 100_000 + b'"') for n in range(3)),
        )

    parts = sum(p.size for p in encode_layout(record(0)).parts)
    assert parts > 3 * 100_000 and 6 * parts < ENCODED_BYTES < 7 * parts
    backend = HeldWrites()
    store = RecordStore(backend, metrics)
    assert store.save_soon("t", "s0", record(0))
    assert store.encoded_bytes == parts
    assert store.save_soon("t", "s0", record(1))  # a newer record of the session replaces it
    assert store.encoded_bytes == parts
    assert all(store.save_soon("t", f"s{i}", record(i)) for i in range(1, 10))
    assert store.encoded_bytes == 6 * parts  # s4 .. s9
    backend.release.set()
    await store.flush()
    assert store.encoded_bytes == 0
    assert [await store.load("t", f"s{i}") for i in range(10)] == [record(1), *(record(i) for i in range(1, 10))]
    reread = RecordStore(backend, Metrics(CollectorRegistry()))
    assert [await reread.load("t", f"s{i}") for i in range(10)] == [record(1), *(record(i) for i in range(1, 10))]


class BusyLoopRedis(RedisStore):
    """Redis whose read finds the event loop busy (CPU work elsewhere) for `busy` seconds
    before it is sent: the store itself answers at once."""

    def __init__(self, url: str, busy: float) -> None:
        super().__init__(url)
        self.busy = busy

    async def get_parts(
        self, tenant: str, session: str, known: Collection[bytes] = ()
    ) -> tuple[bytes, dict[bytes, bytes]] | None:
        end = time.perf_counter() + self.busy
        while time.perf_counter() < end:  # the loop busy, as under a burst of requests
            pass
        return await super().get_parts(tenant, session, known)


async def test_a_busy_loop_does_not_make_a_fast_redis_answer_a_timeout(metrics: Metrics, redis_url: str) -> None:
    """Leftover of session 10: a Redis read whose bound's timer fired late because the loop was
    busy came back as a timeout though Redis answered at once (its answer needed a loop turn
    more than the late timer); it now gets one bound more. A store that does not answer is
    still a timeout."""
    writer = RecordStore(RedisStore(redis_url), Metrics(CollectorRegistry()))
    assert await writer.save("t", "s", RECORD)
    reader = RecordStore(BusyLoopRedis(redis_url, busy=0.5), metrics, get_timeout=0.1)
    assert await reader.load("t", "s") == RECORD
    assert errors(metrics, "redis", "get") == 0
    timeouts = {"backend": "redis", "kind": "timeout"}
    assert metrics.registry.get_sample_value("promptcache_session_store_faults_total", timeouts) == 0.0
    await writer.close()
    await reader.close()


async def test_a_lock_held_by_another_process_is_not_a_warning_per_write(
    metrics: Metrics, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review (session 15, user/hostile pass): another process holding the file's write lock
    (a stuck `--workers` peer, a backup) failed every write as `locked`, each with its own
    WARNING: 276 lines in 6 s live. One WARNING for the cause, DEBUG after, as a full disk."""
    import logging

    path = tmp_path / "sessions.db"
    store = RecordStore(SqliteStore(path), metrics)
    assert await store.save("t", "s", RECORD)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    caplog.set_level(logging.DEBUG, logger="promptcache")
    try:
        for n in range(4):
            assert not await store.save("t", f"s{n}", RECORD)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert errors(metrics, "sqlite", "put") == 4
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([m for m in loud if "locked" in m]) == 1, loud
    await store.close()


async def test_the_donors_keep_at_most_their_bound_whatever_their_records_hold(metrics: Metrics) -> None:
    """Each tenant's last new-session record is kept as the donor its next new session is
    encoded against (`RecordStore._donors`, `DONOR_BYTES`). Attack pass, session 16: the bound
    counted the donors' part bytes only, but each kept its whole record and head: 57 tenants'
    records of two 9 KB messages (one 18 KB part) and 256 KB of pinned tool schemas held 32 MB
    of this process's memory once their writes were done and the memo had none of them,
    against the 1 MiB counted. What the donors keep is within `DONOR_BYTES` now."""
    import gc
    import tracemalloc

    from proxy.store import DONOR_BYTES

    def record(tenant: int) -> SessionRecord:
        return SessionRecord(
            chain=b"\x00" * 32, ends=(1,), model="m", params_digest=b"\x01" * 16,
            sidecars=tuple(
                Sidecar(i, bytes([tenant, i]) * 8, b'"' + bytes([97 + i]) * 9000 + b'"', bytes([i, tenant]) * 8)
                for i in range(2)
            ),
            pins={"pinned_schemas": {"tool": "x" * 256 * 1024}},
        )

    layout = encode_layout(record(0))
    assert [p.size for p in layout.parts] == [18_096] and len(layout.head) > 256 * 1024
    store = RecordStore(MemoryStore(), metrics, memo_bytes=0)
    gc.collect()
    tracemalloc.start()
    try:
        for tenant in range(64):
            assert store.save_soon(f"t{tenant}", "s", record(tenant))
        await store.flush()
        await store.backend.close()  # the backend's copies are not the donors'
        gc.collect()
        with_donors = tracemalloc.get_traced_memory()[0]
        store._donors.clear()
        gc.collect()
        kept = with_donors - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert DONOR_BYTES // 2 < kept <= DONOR_BYTES  # was 32 MB


class SentParts(HeldWrites):
    """`HeldWrites` that keeps the parts each write sent, by session."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: dict[str, list[Part]] = {}

    async def put_parts(self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float) -> bool:
        self.sent[session] = list(parts)
        return await super().put_parts(tenant, session, head, parts, ttl)


async def test_new_sessions_waiting_for_their_writes_are_not_encoded_again_at_the_write(metrics: Metrics) -> None:
    """32 new sessions of one tenant re-send the conversation its last new session sent (the
    gateway bench's first1 cell) while the writer is busy: each save takes the donor's parts
    (no encoding), but the bytes kept for the writes (`ENCODED_BYTES`) hold three of them, and
    the other 29 writes encoded their ~600 KB records again on the event loop (attack pass,
    session 16: 1,073 parts). A write encodes against the tenant's donor too: every part sent
    is the donor's own bytes, and every record reads back whole."""
    sidecars = tuple(
        Sidecar(i, bytes([i % 256]) * 16, b'"' + bytes([97 + i % 26]) * 700 + b'"', bytes([(i + 1) % 256]) * 16)
        for i in range(833)
    )
    conversation = SessionRecord(
        chain=b"\x00" * 16, ends=(1,), model="m", params_digest=b"\x01" * 16, sidecars=sidecars
    )
    backend = SentParts()
    store = RecordStore(backend, metrics)
    assert store.save_soon("t", "warm", conversation)
    backend.release.set()
    await store.flush()
    lent = {p.key: p.data for p in backend.sent["warm"]}
    assert len(lent) == 37
    backend.release.clear()
    assert all(store.save_soon("t", f"s{i}", conversation) for i in range(32))
    backend.release.set()
    await store.flush()
    reused = [sum(p.data is lent[p.key] for p in backend.sent[f"s{i}"]) for i in range(32)]
    assert reused == [37] * 32  # was 0 for s0 .. s28
    reread = RecordStore(backend, Metrics(CollectorRegistry()))
    assert [await reread.load("t", f"s{i}") for i in range(32)] == [conversation] * 32
