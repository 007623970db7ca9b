"""Attack pass, session 17 (schema 4: a part's bytes once per tenant): findings as tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.store import RecordStore
from proxy.store.codec import encode_layout
from proxy.store.sqlite import SqliteStore
from tests.store.test_parts import grown, record


def _damage_part(path: Path, key: bytes) -> None:
    """Flip one bit of a stored part's bytes (bit rot, a torn page: SQLite keeps no page checksum)."""
    with sqlite3.connect(path) as conn:
        (value,) = conn.execute("SELECT value FROM part_values WHERE key = ?", (key,)).fetchone()
        damaged = bytearray(value)
        damaged[len(damaged) // 2] ^= 0x01
        assert conn.execute("UPDATE part_values SET value = ? WHERE key = ?", (bytes(damaged), key)).rowcount == 1
    conn.close()


async def test_a_damaged_part_is_rewritten_by_the_next_save_sending_its_bytes(tmp_path: Path) -> None:
    """A part whose stored bytes no longer match their name makes the session's read a miss
    (`RecordError`, never a wrong byte); the session's next save sends every part's bytes again
    (the store no longer knows what the file holds for it), and with version 3 that rewrote the
    part, so the session was back after one miss. With one copy per tenant the write keeps the
    damaged bytes (the tenant "holds" the name): the session, and every session of the tenant
    naming that part, misses on every turn for as long as any of them names it."""
    path = tmp_path / "s.db"
    first = record(100)
    parts = encode_layout(first).parts
    store = RecordStore(SqliteStore(path), Metrics(CollectorRegistry()), memo_bytes=1)  # remembers nothing
    assert await store.save("t", "s1", first) and await store.save("t", "s2", first)
    _damage_part(path, parts[2].key)
    assert await store.load("t", "s1") is None  # unreadable: a miss
    second = grown(first, 40)
    assert await store.save("t", "s1", second)  # the next turn's save sends every part again
    fresh = RecordStore(SqliteStore(path), Metrics(CollectorRegistry()))
    assert await fresh.load("t", "s1") == second
    await fresh.close()
    await store.close()
