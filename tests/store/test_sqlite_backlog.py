"""SQLite record writes behind a busy writer (issue 14, session 7): no record is lost to the put
bound while the writer works through a backlog; only a write whose own transaction runs past the
bound times out.

Seen before: `bench/small_cpu.py` (sequential 1 KB requests, one process, a quiet machine) logged
~1,150 `session store sqlite put failed (TimeoutError, timeout)` in 1,900 records. Each record
write ran its own statements, each a GIL handoff costing up to 5 ms from a busy event loop, and
`put_timeout` counted the time a write waited in the queue behind them."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.store import RecordStore
from proxy.store.codec import SessionRecord, Sidecar
from proxy.store.sqlite import SqliteStore


def one_turn(i: int) -> SessionRecord:
    """A one-turn conversation's record (~1 KB, no parts), as `bench/small_cpu.py` writes."""
    text = b'{"role":"user","content":"' + f"request {i} ".encode() * 80 + b'"}'
    return SessionRecord(
        chain=bytes([i % 256]) * 32,
        ends=(len(text),),
        model="m",
        params_digest=b"\x01" * 16,
        sidecars=(Sidecar(0, bytes([i % 256]) * 16, text),),
    )


def counted(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_backlog_behind_a_busy_writer_and_a_busy_loop_is_written_whole(tmp_path: Path) -> None:
    """300 records saved while the writer thread is busy and the event loop then stays busy
    past the bound: every record is written (no put error, nothing dropped) and another
    process reads them all back. (How few statements a batch takes: `test_sqlite_writes.py`;
    a trace here would cost more than the writes: SQLite expands a 64-row statement's blobs
    for every row its triggers fire on.)"""
    metrics = Metrics(CollectorRegistry())
    backend = SqliteStore(tmp_path / "sessions.db")
    store = RecordStore(backend, metrics, put_timeout=0.2)
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    try:
        await backend.open()
        busy = loop.run_in_executor(backend._executor, gate.wait)  # the writer busy elsewhere
        for i in range(300):
            assert store.save_soon("t", f"s{i}", one_turn(i))
        for _ in range(10):  # each save's task queues its write at its first step
            if len(backend._batch) == 300:
                break
            await asyncio.sleep(0)
        assert len(backend._batch) == 300
        threading.Event().wait(0.3)  # the loop stays busy past the bound (serving requests)
        gate.set()
        await busy
        await store.flush()
        assert counted(metrics, "promptcache_session_store_errors_total", backend="sqlite", operation="put") == 0
        assert counted(metrics, "promptcache_session_store_writes_dropped_total", backend="sqlite") == 0
        assert store.pending_writes == 0
    finally:
        gate.set()
        await store.close()
    reader = RecordStore(SqliteStore(tmp_path / "sessions.db"), Metrics(CollectorRegistry()))
    try:
        loaded = [await reader.load("t", f"s{i}") for i in range(300)]
    finally:
        await reader.close()
    assert loaded == [one_turn(i) for i in range(300)]


async def test_a_write_whose_own_transaction_runs_past_the_bound_times_out(tmp_path: Path) -> None:
    """The bound still holds on the store's own time: a transaction held past `put_timeout`
    (here the writer thread stuck in the write's eviction report) fails the write, counted as a
    `timeout` fault; the store goes on once the writer is free."""
    metrics = Metrics(CollectorRegistry())
    backend = SqliteStore(tmp_path / "sessions.db", max_tenant_bytes=64)  # the record is too large
    store = RecordStore(backend, metrics, put_timeout=0.05)
    gate = threading.Event()
    report = backend.on_evict
    assert report is not None

    def stuck(cap: str, rows: int) -> None:
        gate.wait()
        report(cap, rows)

    backend.on_evict = stuck
    try:
        assert not await store.save("t", "s", one_turn(1))
        gate.set()
        assert counted(metrics, "promptcache_session_store_errors_total", backend="sqlite", operation="put") == 1
        assert counted(metrics, "promptcache_session_store_faults_total", backend="sqlite", kind="timeout") == 1
        backend.on_evict = report
        await backend.put("t", "small", b"fits", 60)
        assert await backend.get("t", "small") == b"fits"
        assert counted(metrics, "promptcache_session_store_records_skipped_total", backend="sqlite") == 1
    finally:
        gate.set()
        await store.close()
