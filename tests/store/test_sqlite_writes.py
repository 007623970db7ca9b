"""`SqliteStore`'s write transactions: a batch of writes goes in a few multi-row statements
(`STATEMENT_ROWS`), in call order, with the write order (`written`) kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from proxy.store import sqlite as sqlite_store
from proxy.store.sqlite import SqliteStore, _statement_sizes

TTL = 3600.0


def test_a_run_of_writes_is_cut_into_the_statement_sizes() -> None:
    assert _statement_sizes(0) == []
    assert _statement_sizes(1) == [1]
    assert _statement_sizes(37) == [16, 16, 4, 1]
    assert _statement_sizes(150) == [64, 64, 16, 4, 1, 1]
    assert sum(_statement_sizes(255)) == 255


async def test_one_batch_of_stores_and_removals_keeps_call_order(tmp_path: Path) -> None:
    """150 stores, then removals of every third key, then rewrites of some of those keys and
    of others, one key written twice in one statement: one transaction, exact results."""
    store = SqliteStore(tmp_path / "s.db")
    statements: list[str] = []
    try:
        await store.open()
        conn = store._conn
        assert conn is not None
        await store._call(conn.set_trace_callback, statements.append)  # on the writer thread
        writes: list[tuple[str, str, bytes, float]] = [("t", f"s{i}", f"v{i}".encode(), TTL) for i in range(150)]
        writes += [("t", f"s{i}", b"", 0.0) for i in range(0, 150, 3)]
        writes += [("t", "s3", b"again", TTL), ("t", "s4", b"first", TTL), ("t", "s4", b"second", TTL)]
        writes += [("u", "s0", b"other tenant", TTL)]
        await store._call(store._put_many, [(*w, None) for w in writes])
        await store._call(conn.set_trace_callback, None)
        expected = {f"s{i}": f"v{i}".encode() for i in range(150) if i % 3}
        expected |= {"s3": b"again", "s4": b"second"}
        got = {f"s{i}": await store.get("t", f"s{i}") for i in range(150)}
        assert {k: v for k, v in got.items() if v is not None} == expected
        assert await store.get("u", "s0") == b"other tenant"
        # the trace repeats a statement's (expanded, so unique) text for each trigger it fires
        kinds = ("INSERT INTO sessions", "DELETE FROM sessions WHERE (tenant")
        writing = {s for s in statements if s.startswith(kinds)}
        # 150 stores in 6 statements, 50 removals in 5, then 4 stores (s4 twice) in 1
        assert len(writing) == 6 + 5 + 1
        assert statements[0] == "BEGIN IMMEDIATE"
        assert (statements.count("BEGIN IMMEDIATE"), statements.count("COMMIT")) == (1, 1)
        assert await store.usage() == {
            "": sum(map(len, expected.values())) + len(b"other tenant"),
            "t": sum(map(len, expected.values())),
            "u": len(b"other tenant"),
        }
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        order = [s for (s,) in conn.execute("SELECT session FROM sessions WHERE tenant = 't' ORDER BY written")]
        (newest,) = conn.execute("SELECT max(written) FROM sessions").fetchone()
    # the write order is the call order, a rewritten key moving to its last write
    assert order == [f"s{i}" for i in range(150) if i % 3 and i != 4] + ["s3", "s4"]
    assert newest == 150 + 4


async def test_the_write_order_goes_on_across_transactions_and_connections(tmp_path: Path) -> None:
    first = SqliteStore(tmp_path / "s.db")
    await first.put("t", "a", b"1", TTL)
    await first.put("t", "b", b"2", TTL)
    await first.close()
    second = SqliteStore(tmp_path / "s.db")  # another process sharing the file
    await second.put("t", "a", b"3", TTL)
    await second.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        rows = conn.execute("SELECT session, written FROM sessions ORDER BY written").fetchall()
    assert rows == [("b", 2), ("a", 3)]
    assert sqlite_store.STATEMENT_ROWS == (64, 16, 4, 1)
