"""`SqliteStore`'s byte caps on a real file: least recently written first, per tenant then in
total, bounded work per write, the figures shared by every connection to the file (worker
processes), and a version 1 file migrated in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from proxy.store import sqlite as sqlite_store
from proxy.store.sqlite import SqliteStore

TTL = 3600.0


def evictions(store: SqliteStore) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    store.on_evict = lambda cap, rows: seen.append((cap, rows))
    return seen


async def test_a_rewritten_record_counts_as_recently_written(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db", max_bytes=10_000, max_tenant_bytes=300)
    seen = evictions(store)
    try:
        for session in ("s1", "s2", "s3"):
            await store.put("t", session, b"x" * 100, TTL)
        await store.put("t", "s1", b"y" * 100, TTL)  # s1 is now the newest
        await store.put("t", "s4", b"z" * 100, TTL)
        assert [await store.get("t", s) is not None for s in ("s1", "s2", "s3", "s4")] == [True, False, True, True]
        assert seen == [("tenant", 1)]
        assert await store.usage() == {"": 300, "t": 300}
        await store.delete("t", "s1")
        assert await store.usage() == {"": 200, "t": 200}
    finally:
        await store.close()


async def test_a_value_over_the_tenant_cap_is_not_stored_and_removes_the_older(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db", max_bytes=10_000, max_tenant_bytes=300)
    seen = evictions(store)
    try:
        await store.put("t", "s1", b"small", TTL)
        await store.put("t", "s1", b"x" * 301, TTL)
        assert await store.get("t", "s1") is None
        assert seen == [("too_large", 1)]
        assert await store.usage() == {"": 0}
    finally:
        await store.close()


async def test_eviction_per_write_is_bounded_and_a_lowered_cap_is_reached_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    for n in range(30):
        await store.put("t", f"s{n}", b"x" * 10, TTL)
    await store.close()
    monkeypatch.setattr(sqlite_store, "MAX_EVICTIONS_PER_PUT", 8)
    store = SqliteStore(path, max_bytes=10_000, max_tenant_bytes=100)  # the cap lowered at restart
    seen = evictions(store)
    try:
        await store.put("t", "new-1", b"n" * 10, TTL)
        assert seen == [("tenant", 8)]  # 21 rows over the cap, 8 evicted by this write
        assert (await store.usage())["t"] == 310 - 80
        await store.put("t", "new-2", b"n" * 10, TTL)
        await store.put("t", "new-3", b"n" * 10, TTL)
        assert seen == [("tenant", 8), ("tenant", 8), ("tenant", 7)]
        assert (await store.usage())["t"] == 100  # within the cap again: the 10 newest rows
        assert [await store.get("t", f"s{n}") is not None for n in (22, 23)] == [False, True]
        assert await store.get("t", "new-1") is not None
    finally:
        await store.close()


async def test_two_connections_to_one_file_share_the_figures(tmp_path: Path) -> None:
    """Two stores on one file (as `--workers 2` runs): each write sees the other's bytes."""
    first = SqliteStore(tmp_path / "s.db", max_bytes=250, max_tenant_bytes=250)
    second = SqliteStore(tmp_path / "s.db", max_bytes=250, max_tenant_bytes=250)
    try:
        await first.put("a", "s1", b"x" * 100, TTL)
        await second.put("b", "s1", b"y" * 100, TTL)
        await first.put("a", "s2", b"x" * 100, TTL)  # 300 > 250: the oldest (a/s1) goes
        assert await second.get("a", "s1") is None
        assert await second.usage() == {"": 200, "a": 100, "b": 100}
    finally:
        await first.close()
        await second.close()


async def test_a_version_1_file_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE sessions (tenant TEXT NOT NULL, session TEXT NOT NULL, expires REAL NOT NULL,"
            " value BLOB NOT NULL, PRIMARY KEY (tenant, session))"
        )
        conn.execute("CREATE INDEX sessions_expires ON sessions (expires)")
        conn.executemany(
            "INSERT INTO sessions VALUES (?, ?, 9e12, ?)",
            [("a", "old", b"1" * 100), ("a", "older", b"2" * 50), ("b", "s", b"3" * 10)],
        )
        conn.execute("PRAGMA user_version = 1")
    store = SqliteStore(path, max_bytes=10_000, max_tenant_bytes=200)
    seen = evictions(store)
    try:
        assert await store.get("a", "old") == b"1" * 100
        assert await store.usage() == {"": 160, "a": 150, "b": 10}
        await store.put("a", "new", b"4" * 100, TTL)  # 250 > 200: the first written row goes
        assert await store.get("a", "old") is None
        assert await store.get("a", "older") == b"2" * 50
        assert seen == [("tenant", 1)]
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.SCHEMA_VERSION == 4


async def test_writes_issued_together_land_in_call_order(tmp_path: Path) -> None:
    """`put` queues the writes issued while the writer thread is busy and writes them together,
    in call order (a removal is queued with them), however the queue is cut into transactions."""
    import asyncio

    store = SqliteStore(tmp_path / "s.db", max_bytes=10_000, max_tenant_bytes=300)
    seen = evictions(store)
    try:
        await store.put("t", "warm", b"w", TTL)  # the file exists: the next writes queue together
        await asyncio.gather(
            store.put("u", "a", b"v1", TTL),
            store.delete("u", "a"),
            store.put("u", "a", b"v2", TTL),
            store.put("u", "b", b"v1", TTL),
            store.put("u", "b", b"v2", TTL),
            store.delete("u", "b"),
            *(store.put("t", f"s{i}", b"x" * 100, TTL) for i in range(4)),
        )
        assert await store.get("u", "a") == b"v2"
        assert await store.get("u", "b") is None
        # 401 bytes over tenant t's 300-byte cap: its least recently written go ("warm", then s0)
        kept = [await store.get("t", s) is not None for s in ("warm", "s0", "s1", "s2", "s3")]
        assert kept == [False, False, True, True, True]
        assert sum(rows for cap, rows in seen if cap == "tenant") == 2
        assert {cap for cap, _ in seen} == {"tenant"}
        assert await store.usage() == {"": 302, "t": 300, "u": 2}
    finally:
        await store.close()


async def test_an_eviction_writes_the_pages_it_changes_not_zeros_over_every_page_it_frees(tmp_path: Path) -> None:
    """A record evicted to make room frees its parts' overflow pages without writing each of them
    again: with SQLite's `secure_delete` on (Debian's build turns it on by default) every freed
    page was zeroed and appended to the WAL, so evicting a 600 KB record wrote 600 KB more and
    the writer fell behind the first requests of new sessions (session 11: 100 records dropped
    in the gateway bench's first1 cell, 6-10 with `FAST`). The WAL grows by the new record's
    pages and the few b-tree and freelist pages the eviction changes."""
    from proxy.store.base import Part

    def record(tag: bytes) -> list[Part]:
        blobs = [tag + bytes([n]) * (16 * 1024) for n in range(38)]
        return [Part(bytes([n]) * 8 + tag * (8 // len(tag)), len(b), b) for n, b in enumerate(blobs)]

    path = tmp_path / "s.db"
    store = SqliteStore(path, max_bytes=10**9, max_tenant_bytes=700_000)
    seen = evictions(store)
    try:
        assert await store.put_parts("t", "a", b"head", record(b"a"), TTL)
        wal = Path(f"{path}-wal")
        before = wal.stat().st_size
        assert await store.put_parts("t", "b", b"head", record(b"b"), TTL)
        frames = (wal.stat().st_size - before) // (sqlite_store.PAGE_SIZE + 24)
        assert seen == [("tenant", 1)]
        assert await store.get_parts("t", "a") is None
        # the new record's 38 parts of 16 KiB + 1 take 152 pages at least; zeroing the evicted
        # one's freed pages as well made it 323 frames
        assert 152 <= frames <= 200, frames
    finally:
        await store.close()
