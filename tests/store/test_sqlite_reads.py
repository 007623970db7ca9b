"""SQLite reads never queue behind writes (issue 11, soak): reads have their own thread and
read-only connection, so a session's record is read while a large write (or a purge, or a WAL
checkpoint) is still going on; a file replaced under the reader is reopened at its path."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.store import RecordStore
from proxy.store.sqlite import SqliteStore


async def test_a_read_is_answered_while_a_large_write_is_still_running(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "sessions.db")
    try:
        await store.put("t", "small", b"old", 60)
        big = asyncio.ensure_future(store.put("t", "big", b"x" * (64 * 1024 * 1024), 60))  # noqa: TID251
        await asyncio.sleep(0)  # the write is handed to the writer thread first
        assert await store.get("t", "small") == b"old"
        assert not big.done()  # one thread for both would have run the whole write first
        await big
        assert await store.get("t", "big") == b"x" * (64 * 1024 * 1024)
    finally:
        await store.close()


async def test_the_reader_follows_a_file_recreated_at_its_path(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SqliteStore(path)
    try:
        await store.put("t", "s", b"v1", 60)
        assert await store.get("t", "s") == b"v1"
        path.unlink()
        await store.put("t", "s", b"v2", 60)  # the writer sees the file gone and starts a new one
        assert await store.get("t", "s") == b"v2"  # the reader reopens the new file, not the old
    finally:
        await store.close()


async def test_a_read_answered_in_time_counts_though_the_loop_looks_late(tmp_path: Path) -> None:
    backend = SqliteStore(tmp_path / "sessions.db")
    store = RecordStore(backend, Metrics(CollectorRegistry()), get_timeout=0.5)
    try:
        await backend.put("t", "k", b"v", 60)
        await backend.get("t", "k")  # the reader's connection is open
        read = asyncio.ensure_future(store.load_bytes("t", "k"))  # noqa: TID251
        await asyncio.sleep(0)  # the read is handed to the reader thread
        backend._reads.submit(lambda: None).result()  # the loop blocks until the reader is done ...
        threading.Event().wait(0.6)  # ... and stays busy past the bound (a loop backlog)
        assert await read == b"v"  # the store answered in time: not a timeout
    finally:
        await store.close()


async def test_a_stuck_reader_is_bounded(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "sessions.db")
    release = threading.Event()
    try:
        await store.put("t", "s", b"v", 60)
        store._reads.submit(release.wait)  # the reader thread is stuck (a frozen file system)
        with pytest.raises(TimeoutError):
            await store.get_within("t", "s", 0.05)
        release.set()
        assert await store.get_within("t", "s", 5.0) == b"v"  # the dropped read never ran
    finally:
        release.set()
        await store.close()
