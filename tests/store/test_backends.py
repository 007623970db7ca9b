"""Backend-specific behaviour: bounds and expiry (memory), file handling (sqlite), keys and
failures (redis)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path

import pytest
import redis as sync_redis
import redis.exceptions

from proxy.store import default_store_url, open_store
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.sqlite import PAGE_SIZE, SCHEMA_VERSION, SqliteStore
from tests.store.redis_server import RedisServer


class ManualClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- open_store ---------------------------------------------------------------------------------


def test_open_store_schemes(tmp_path: Path) -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    sqlite_store = open_store(f"sqlite://{tmp_path}/x.db")
    assert isinstance(sqlite_store, SqliteStore) and sqlite_store.path == f"{tmp_path}/x.db"
    assert isinstance(open_store("redis://127.0.0.1:1/0"), RedisStore)
    with pytest.raises(ValueError):
        open_store("sqlite://")
    with pytest.raises(ValueError):
        open_store("postgres://x")


def test_default_store_url_is_sqlite_in_state_dir(tmp_path: Path) -> None:
    assert default_store_url(tmp_path) == f"sqlite://{tmp_path.resolve()}/sessions.db"
    assert open_store(default_store_url(tmp_path)).path == f"{tmp_path.resolve()}/sessions.db"
    assert open_store(f"sqlite:///{tmp_path}/y.db").path == f"{tmp_path}/y.db"


# --- memory -------------------------------------------------------------------------------------


async def test_memory_ttl_expires_on_its_clock() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    await store.put("t", "s", b"v", 10.0)
    clock.now += 9.999
    assert await store.get("t", "s") == b"v"
    clock.now += 0.001
    assert await store.get("t", "s") is None
    assert len(store) == 0 and store.size_bytes == 0


async def test_memory_lru_entry_cap() -> None:
    store = MemoryStore(max_entries=2)
    await store.put("t", "a", b"1", 60)
    await store.put("t", "b", b"2", 60)
    assert await store.get("t", "a") == b"1"  # a is now the most recent
    await store.put("t", "c", b"3", 60)
    assert await store.get("t", "b") is None
    assert await store.get("t", "a") == b"1"
    assert await store.get("t", "c") == b"3"


async def test_memory_byte_cap() -> None:
    store = MemoryStore(max_bytes=10)
    await store.put("t", "a", b"12345", 60)
    await store.put("t", "b", b"12345", 60)
    assert store.size_bytes == 10
    await store.put("t", "c", b"1", 60)
    assert await store.get("t", "a") is None
    assert store.size_bytes == 6
    await store.put("t", "huge", b"x" * 11, 60)
    assert await store.get("t", "huge") is None
    assert store.size_bytes == 6


# --- sqlite -------------------------------------------------------------------------------------


async def test_sqlite_survives_reopen_and_sets_pragmas(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "sessions.db"
    first = SqliteStore(path)
    await first.put("t", "s", b"kept", 60)
    await first.close()
    second = SqliteStore(path)
    assert await second.get("t", "s") == b"kept"
    await second.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 4096
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    conn.close()


async def test_sqlite_expiry_uses_wall_clock_and_purges(tmp_path: Path) -> None:
    clock = ManualClock()
    store = SqliteStore(tmp_path / "s.db", clock=clock)
    await store.put("t", "old", b"v", 10.0)
    clock.now += 10.0
    assert await store.get("t", "old") is None
    clock.now += 60.0  # past the purge interval: the next put purges expired rows
    await store.put("t", "new", b"w", 10.0)
    await store.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    assert [r[0] for r in conn.execute("SELECT session FROM sessions")] == ["new"]
    conn.close()


async def test_sqlite_corrupt_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    path.write_bytes(b"this is not a database" * 1000)
    store = SqliteStore(path)
    assert await store.get("t", "s") is None
    await store.put("t", "s", b"fresh", 60)
    assert await store.get("t", "s") == b"fresh"
    await store.close()
    aside = [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].startswith("sessions.db.corrupt-")


async def test_a_file_of_a_newer_schema_is_moved_aside_under_its_version_not_as_corrupt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rollback: the file a newer promptcache wrote (a valid database, `user_version` above
    `SCHEMA_VERSION`) is kept whole under a name giving its version, the log says so, and the
    store goes on in a fresh file (new user report, session 17: the old build called it "not a
    readable database")."""
    path = tmp_path / "sessions.db"
    newer = SCHEMA_VERSION + 1
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE future (x)")
        conn.execute("INSERT INTO future VALUES (7)")
        conn.execute(f"PRAGMA user_version = {newer}")
    conn.close()
    store = SqliteStore(path)
    with caplog.at_level(logging.WARNING, logger="promptcache.store.sqlite"):
        assert await store.get("t", "s") is None
        await store.put("t", "s", b"fresh", 60)
        assert await store.get("t", "s") == b"fresh"
    await store.close()
    aside = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("sessions.db."))
    assert len(aside) == 1 and aside[0].startswith(f"sessions.db.schema-{newer}-")
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name] == []
    with sqlite3.connect(tmp_path / aside[0]) as kept:
        assert kept.execute("PRAGMA user_version").fetchone()[0] == newer
        assert kept.execute("SELECT x FROM future").fetchall() == [(7,)]
    kept.close()
    [message] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert message == (
        f"session store {path} has schema version {newer}, from a newer promptcache than this one"
        f" (schema {SCHEMA_VERSION}); moved aside to {tmp_path / aside[0]}, starting empty"
        f" (move it back under a build of schema {newer} or newer to use it)"
    )


async def test_sqlite_locked_file_fails_fast_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SqliteStore(path)
    await store.put("t", "s", b"v", 60)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    started = time.perf_counter()
    with pytest.raises(sqlite3.OperationalError):
        await store.put("t", "s", b"w", 60)
    assert time.perf_counter() - started < 1.0
    holder.execute("ROLLBACK")
    holder.close()
    await store.put("t", "s", b"w", 60)
    assert await store.get("t", "s") == b"w"
    await store.close()


async def test_sqlite_runs_off_the_loop_thread(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    await store.put("t", "s", b"v", 60)
    threads = await asyncio.get_running_loop().run_in_executor(
        store._executor, lambda: __import__("threading").current_thread().name
    )
    assert threads.startswith("promptcache-sqlite")
    await store.close()


# --- redis --------------------------------------------------------------------------------------


async def test_redis_key_layout_and_ttl(redis_url: str, redis_server: RedisServer) -> None:
    store = RedisStore(redis_url)
    await store.put("tenant-a", "s1", b"v", 90.0)
    raw = sync_redis.Redis(host="127.0.0.1", port=redis_server.port)
    assert raw.keys("*") == [b"promptcache:{tenant-a}:s1"]
    assert 89_000 < raw.pttl("promptcache:{tenant-a}:s1") <= 90_000
    raw.close()
    await store.close()


async def test_redis_down_fails_fast_and_reconnects(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r").start()
    restarted: RedisServer | None = None
    store = RedisStore(server.url)
    try:
        await store.put("t", "s", b"v", 60)
        server.stop()
        started = time.perf_counter()
        with pytest.raises((redis.exceptions.RedisError, OSError)):
            await store.get("t", "s")
        assert time.perf_counter() - started < 1.0
        restarted = RedisServer(tmp_path / "r", port=server.port).start()
        await store.put("t", "s", b"back", 60)
        assert await store.get("t", "s") == b"back"
    finally:
        await store.close()
        server.stop()
        if restarted is not None:
            restarted.stop()
