"""SQLite record reads after a restart (session 7 attack finding F3): reads queued behind a busy
reader thread are answered together, up to `READ_ROWS[0]` reads and about
`READ_STATEMENT_BYTES` per statement (heads and parts as one row, one step of SQLite each), and
the read bound counts the store's own time, not the queue.

Seen before: after a restart, 120 concurrent requests on large parted records, 97 of 140 store
reads timed out and went without replay. Each read was a transaction of a head query and one
row (one step, one GIL handoff) per part, ~37 for a 600 KB record; every handoff from a busy
event loop costs up to 5 ms, and `GET_TIMEOUT` (50 ms) counted from when the read was queued."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.store import RecordStore
from proxy.store.codec import PART_BYTES, SessionRecord, Sidecar, encode_layout
from proxy.store.sqlite import (
    KEYS_PER_STATEMENT,
    READ_ROWS,
    READ_STATEMENT_BYTES,
    READER_STUCK,
    SqliteStore,
    _padded_sizes,
)

TTL = 3600.0


def long_record(i: int, messages: int = 40) -> SessionRecord:
    """A conversation's record of `messages` messages of 2,128 bytes (88,115 bytes: a head of
    1,855 and five parts of eight messages, 17,252 bytes each, `PART_BYTES` 16 KiB)."""
    sidecars = tuple(
        Sidecar(n, bytes([i % 256, n]) * 8, b'{"role":"user","content":"' + f"{i:03d}:{n:02d} ".encode() * 300 + b'"}')
        for n in range(messages)
    )
    return SessionRecord(
        chain=bytes([i % 256]) * 32 * messages,
        ends=tuple(range(1, messages + 1)),
        model="m",
        params_digest=b"\x01" * 16,
        sidecars=sidecars,
    )


class Ticker:
    """A manual monotonic clock (`SqliteStore.timer`): a statement's bound is measured in it,
    so how long the reader thread takes on a loaded machine (seconds at a load average of 13)
    counts for nothing; the test moves it where it means time to pass."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def counted(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def _write(path: Path, records: dict[str, SessionRecord]) -> None:
    """The records written by a first process, which then stops."""
    writer = RecordStore(SqliteStore(path), Metrics(CollectorRegistry()))
    try:
        for key, record in records.items():
            assert await writer.save("t", key, record)
    finally:
        await writer.close()


async def _traced(backend: SqliteStore) -> list[str]:
    """Start tracing every statement the reader connection runs; returns the growing list."""
    statements: list[str] = []

    def trace() -> None:
        backend._read_connection().set_trace_callback(statements.append)

    await asyncio.get_running_loop().run_in_executor(backend._reads, trace)
    return statements


def test_reads_are_cut_into_the_read_statement_sizes() -> None:
    assert READ_ROWS == (16, 4, 1)
    assert _padded_sizes(1, READ_ROWS) == [1]
    assert _padded_sizes(3, READ_ROWS) == [4]
    assert _padded_sizes(23, READ_ROWS) == [16, 16]
    assert _padded_sizes(140, READ_ROWS) == [16] * 8 + [16]
    assert _padded_sizes(36, READ_ROWS) == [16, 16, 4]


async def test_a_backlog_of_reads_after_a_restart_is_read_whole_in_few_statements(tmp_path: Path) -> None:
    """140 loads of 88 KB records in parts (and 3 of keys never written), issued while the
    reader thread is busy elsewhere; the event loop then stays busy past the bound (serving
    requests) until the reader is done. Every record is read (no get error, no timeout), in
    12 statements, each one step: no transaction, no row per part. A statement takes 16 reads
    and answers the first 12 (11 x 88,115 bytes before the 12th are below 1 MiB, 12 x are not),
    leaving 4 for the next: 11 statements answer 132 records, the 12th the last 8 and the 3
    absent keys. Time is the store's `Ticker` (it was the wall clock: at a load average of 13 a
    statement of 1 MiB took over the 50 ms bound, and loads came back as timeouts)."""
    path = tmp_path / "sessions.db"
    records = {f"s{i}": long_record(i) for i in range(140)}
    assert [encode_layout(r).size for r in records.values()] == [88_115] * 140
    assert [len(encode_layout(r).parts) for r in records.values()] == [5] * 140
    assert (READ_STATEMENT_BYTES, 11 * 88_115, 12 * 88_115) == (1_048_576, 969_265, 1_057_380)
    assert PART_BYTES == 16 * 1024
    await _write(path, records)
    metrics = Metrics(CollectorRegistry())
    ticker = Ticker()
    backend = SqliteStore(path, timer=ticker)  # the restarted process: nothing remembered
    store = RecordStore(backend, metrics, get_timeout=0.05)
    gate = threading.Event()
    try:
        await backend.open()
        statements = await _traced(backend)
        loop = asyncio.get_running_loop()
        busy = loop.run_in_executor(backend._reads, gate.wait)  # the reader busy elsewhere
        keys = [*records, "absent1", "absent2", "absent3"]
        loads = [asyncio.ensure_future(store.load("t", key)) for key in keys]  # noqa: TID251
        for _ in range(5):  # each load queues its read at its first step
            await asyncio.sleep(0)
        assert len(backend._read_queue) == 143
        ticker.now += 0.1  # past the bound while the reader is busy
        gate.set()
        backend._reads.submit(lambda: None).result()  # the loop blocks until every read is over ...
        ticker.now += 0.1  # ... and stays busy past the bound
        await busy
        loaded = await asyncio.gather(*loads)
    finally:
        gate.set()
        await store.close()
    assert loaded == [*records.values(), None, None, None]
    assert counted(metrics, "promptcache_session_store_errors_total", backend="sqlite", operation="get") == 0
    assert counted(metrics, "promptcache_session_store_faults_total", backend="sqlite", kind="timeout") == 0
    reading = [s for s in statements if s.startswith("WITH w(i, t, s, p, k)")]
    assert len(reading) == 12
    assert [s for s in statements if not s.startswith("WITH w(i, t, s, p, k)")] == []


async def test_one_read_is_one_statement(tmp_path: Path) -> None:
    """A lone read in parts and a plain read: one statement each, nothing else."""
    path = tmp_path / "sessions.db"
    await _write(path, {"s": long_record(1)})
    backend = SqliteStore(path)
    try:
        await backend.put("t", "plain", b"value", TTL)
        await backend.open()
        statements = await _traced(backend)
        got = await backend.get_parts_within("t", "s", 5.0)
        assert got is not None and len(got[1]) == 5
        assert await backend.get("t", "plain") == b"value"
        assert await backend.get_parts("t", "plain") == (b"value", {})
        assert await backend.get("t", "nothing") is None
    finally:
        await backend.close()
    assert len(statements) == 4
    assert all(s.startswith("WITH w(i, t, s, p, k)") for s in statements)


async def test_a_read_stuck_in_its_statement_is_bounded_and_so_is_the_read_behind_it(tmp_path: Path) -> None:
    """The reader thread stuck inside a read's statement (SQLite's progress handler waits, as
    on a frozen file system): that read times out at its bound, one queued behind it once the
    reader has moved for `READER_STUCK` seconds, and a read made while the reader is still
    stuck gives up without queueing; once the file answers again, reads go on."""
    backend = SqliteStore(tmp_path / "sessions.db")
    gate = threading.Event()
    try:
        await backend.put("t", "s", b"v", TTL)
        assert await backend.get("t", "s") == b"v"

        entered = threading.Event()

        def wait() -> int:
            entered.set()
            gate.wait()
            return 0

        def stick() -> None:
            backend._read_connection().set_progress_handler(wait, 1)

        await asyncio.get_running_loop().run_in_executor(backend._reads, stick)
        first = asyncio.ensure_future(backend.get_within("t", "s", 0.05))  # noqa: TID251
        await asyncio.to_thread(entered.wait)  # the first read's statement has begun
        second = asyncio.ensure_future(backend.get_within("t", "s", 0.05))  # noqa: TID251
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert [type(r) for r in results] == [TimeoutError, TimeoutError]
        assert [str(r) for r in results] == ["no answer within 0.05 s"] * 2
        with pytest.raises(TimeoutError, match="the reader thread has been in one statement over 0.25 s"):
            await backend.get_within("t", "s", 0.05)
        # not queued: only the second read waits, given up (the reader will skip it)
        assert [(r.read, r.is_dropped) for r in backend._read_queue] == [(("t", "s", False, b""), True)]
        assert READER_STUCK == 0.25
        gate.set()

        def unstick() -> None:
            backend._read_connection().set_progress_handler(None, 1)

        await asyncio.get_running_loop().run_in_executor(backend._reads, unstick)
        assert await backend.get_within("t", "s", 5.0) == b"v"
    finally:
        gate.set()
        await backend.close()


async def test_a_statement_answers_about_its_byte_bound_and_leaves_the_rest_for_the_next(tmp_path: Path) -> None:
    """Four 700,000-byte values queued together: the first statement answers two (700,000
    bytes before the second are below `READ_STATEMENT_BYTES`, 1,400,000 before the third are
    not) and the next the other two; every value comes back whole, in call order."""
    backend = SqliteStore(tmp_path / "sessions.db")
    gate = threading.Event()
    try:
        for n in range(4):
            await backend.put("t", f"s{n}", bytes([n]) * 700_000, TTL)
        assert await backend.get("t", "s0") == bytes([0]) * 700_000
        statements = await _traced(backend)
        loop = asyncio.get_running_loop()
        busy = loop.run_in_executor(backend._reads, gate.wait)
        reads = [asyncio.ensure_future(backend.get("t", f"s{n}")) for n in range(4)]  # noqa: TID251
        await asyncio.sleep(0)
        assert len(backend._read_queue) == 4
        gate.set()
        await busy
        assert await asyncio.gather(*reads) == [bytes([n]) * 700_000 for n in range(4)]
    finally:
        gate.set()
        await backend.close()
    assert len([s for s in statements if s.startswith("WITH w(i, t, s, p, k)")]) == 2


async def test_the_keys_are_listed_in_a_few_statements_on_the_reader_thread(tmp_path: Path) -> None:
    """A restarted `serve` lists the file's keys for its filter (`RecordStore.learn_keys`):
    20,000 keys in 3 statements of at most 8,192 (one step each: it was one step per key, on
    the writer thread, in front of every record write); expired keys are not listed."""
    now = [1_000_000.0]
    backend = SqliteStore(tmp_path / "sessions.db", clock=lambda: now[0])
    try:
        writes = [("t", f"s{i}", b"v", TTL, None) for i in range(20_000)]
        writes += [("u", f"gone{i}", b"v", 1.0, None) for i in range(5)]
        await backend._call(backend._put_many, writes)
        now[0] += 2.0  # the five short-lived keys expire
        await backend.open()
        statements = await _traced(backend)
        listed = await backend.keys()
    finally:
        await backend.close()
    assert sorted(listed) == sorted(("t", f"s{i}") for i in range(20_000))
    assert len([s for s in statements if s.startswith("SELECT max(id)")]) == 3
    assert KEYS_PER_STATEMENT == 8192


async def test_a_read_after_a_failed_write_does_not_wait_for_the_writer_thread(tmp_path: Path) -> None:
    """A locked file fails a write, which drops the writer's connection. The next read used to
    wait for the writer thread to reopen it (behind whatever the writer was doing: here a
    batch held up), with the read's bound running; the reader has its own connection and the
    file exists, so the read is answered with the writer still busy (bounded in the store's
    `Ticker`, which does not move: a read waiting for the writer would never be answered)."""
    path = tmp_path / "sessions.db"
    backend = SqliteStore(path, timer=Ticker())
    gate = threading.Event()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        await backend.put("t", "s", b"v", TTL)
        assert await backend.get("t", "s") == b"v"
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await backend.put("t", "s", b"w", TTL)
        holder.execute("ROLLBACK")
        assert backend._conn is None  # the failed write dropped it
        busy = asyncio.get_running_loop().run_in_executor(backend._executor, gate.wait)
        assert await asyncio.wait_for(backend.get_within("t", "s", 0.05), 10) == b"v"
        assert not busy.done()  # answered while the writer thread was still held
        gate.set()
        await busy
    finally:
        gate.set()
        holder.close()
        await backend.close()
