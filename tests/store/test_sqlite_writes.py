"""`SqliteStore`'s write transactions: a batch of writes goes in a few multi-row statements
(`STATEMENT_ROWS`), in call order, with the write order (`written`) kept."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from proxy.store import sqlite as sqlite_store
from proxy.store.base import Part
from proxy.store.sqlite import SqliteStore, _statement_sizes

TTL = 3600.0


def test_a_run_of_writes_is_cut_into_the_statement_sizes() -> None:
    assert _statement_sizes(0) == []
    assert _statement_sizes(1) == [1]
    assert _statement_sizes(37) == [16, 16, 4, 1]
    assert _statement_sizes(150) == [64, 64, 16, 4, 1, 1]
    assert sum(_statement_sizes(255)) == 255


async def _traced_put_many(store: SqliteStore, writes: list[Any]) -> tuple[list[bool], list[str]]:
    """`writes` in one `_put_many` transaction on the writer thread (the store open), with
    every statement SQLite runs meanwhile (its trace: expanded, so each statement's text is
    unique; repeated for each row its triggers fire on)."""
    conn = store._conn
    assert conn is not None
    statements: list[str] = []
    await store._call(conn.set_trace_callback, statements.append)
    try:
        results: list[bool] = await store._call(store._put_many, writes)
    finally:
        await store._call(conn.set_trace_callback, None)
    return results, statements


async def test_one_batch_of_stores_and_removals_keeps_call_order(tmp_path: Path) -> None:
    """150 stores, then removals of every third key, then rewrites of some of those keys and
    of others, one key written twice in one statement: one transaction, exact results."""
    store = SqliteStore(tmp_path / "s.db")
    try:
        await store.open()
        writes: list[tuple[str, str, bytes, float]] = [("t", f"s{i}", f"v{i}".encode(), TTL) for i in range(150)]
        writes += [("t", f"s{i}", b"", 0.0) for i in range(0, 150, 3)]
        writes += [("t", "s3", b"again", TTL), ("t", "s4", b"first", TTL), ("t", "s4", b"second", TTL)]
        writes += [("u", "s0", b"other tenant", TTL)]
        _, statements = await _traced_put_many(store, [(*w, None) for w in writes])
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


def _key(session: int, n: int) -> bytes:
    return bytes([session, n]) * 8


async def test_writes_in_parts_go_in_a_few_statements_whatever_their_number(tmp_path: Path) -> None:
    """Every record is written with `put_parts` (a one-turn record has no parts: its head is all
    of it). Session 6 ran each such write on its own (a lookup of the parts held, read row by row,
    then a one-row upsert): every statement and every row read is a step that releases the GIL,
    and re-taking it from a busy event loop costs up to 5 ms, so the writer fell behind and
    ~1,150 of 1,900 records timed out in `bench/small_cpu.py` on a quiet machine. Now 100
    one-turn records, 10 appended turns of held sessions, one write naming a part not held and a
    second write of one session go in one transaction of 26 statements, exactly as before
    one by one."""
    store = SqliteStore(tmp_path / "s.db")
    try:
        await store.open()
        held = [("t", f"p{s}", b"head", TTL, tuple(Part(_key(s, n), 3, b"abc") for n in range(3))) for s in range(10)]
        await store._call(store._put_many, held)
        writes: list[tuple[str, str, bytes, float, tuple[Part, ...]]] = [
            ("t", f"s{i}", f"one-turn {i}".encode(), TTL, ()) for i in range(100)
        ]
        # each appended turn keeps parts 0 and 2, drops part 1 and adds part 3
        kept = [(Part(_key(s, 0), 3), Part(_key(s, 2), 3), Part(_key(s, 3), 3, b"new")) for s in range(10)]
        writes += [("t", f"p{s}", b"next", TTL, kept[s]) for s in range(10)]
        writes += [("t", "p10", b"gone", TTL, (Part(_key(10, 0), 3),))]  # a part not held: not written
        writes += [("t", "p0", b"again", TTL, (Part(_key(0, 3), 3), Part(_key(0, 4), 4, b"more")))]
        results, statements = await _traced_put_many(store, writes)
        assert results == [True] * 110 + [False, True]
        assert await store.get_parts("t", "s7") == (b"one-turn 7", {})
        p5 = {_key(5, 0): b"abc", _key(5, 2): b"abc", _key(5, 3): b"new"}
        assert await store.get_parts("t", "p5") == (b"next", p5)
        assert await store.get_parts("t", "p0") == (b"again", {_key(0, 3): b"new", _key(0, 4): b"more"})
        assert await store.get_parts("t", "p10") is None
        # the heads and parts held: the one-turn records, p1-p9 (head and three parts), p0
        heads = sum(len(f"one-turn {i}") for i in range(100)) + 9 * (4 + 3 * 3) + (5 + 3 + 4)
        assert await store.usage() == {"": heads, "t": heads}
    finally:
        await store.close()
    distinct = set(statements)  # the trace repeats a statement for each row its triggers fire on

    def count(prefix: str) -> int:
        return sum(s.startswith(prefix) for s in distinct)

    # heads: 100 one-turn records [64, 16, 16, 4], 10 appended turns [4, 4, 1, 1], then p0 again
    assert count("INSERT INTO sessions") == 4 + 4 + 1
    assert count("WITH w(i, t, s)") == 2  # the parts held: one lookup per run of distinct sessions
    assert count("DELETE FROM parts") == 4 + 2  # 10 dropped parts [4, 4, 1, 1]; p0's parts 0 and 2
    assert count("INSERT OR IGNORE INTO part_values") == 4 + 1  # the new parts' bytes, then names
    assert count("INSERT OR IGNORE INTO parts ") == 4 + 1
    assert count("SELECT group_concat(tenant") == 1  # the caps: one lookup of the usage
    assert (count("BEGIN IMMEDIATE"), count("COMMIT"), count("SELECT ifnull(max(written)")) == (1, 1, 1)
    assert len(distinct) == 26 + 5  # the new parts' bytes: a statement of their own


async def test_a_write_over_the_caps_evicts_in_one_statement(tmp_path: Path) -> None:
    """At the cap every write evicts: the oldest rows go in one statement (one step), however
    many it takes, not one row read and one deleted at a time."""
    store = SqliteStore(tmp_path / "s.db", max_tenant_bytes=1000)
    statements: list[str] = []
    try:
        await store._call(store._put_many, [("t", f"s{i}", b"x" * 10, TTL, None) for i in range(100)])
        conn = store._conn
        assert conn is not None
        await store._call(conn.set_trace_callback, statements.append)
        await store.put("t", "big", b"y" * 305, TTL)  # 1,305 bytes: the 31 oldest rows go
        await store._call(conn.set_trace_callback, None)
        assert await store.get("t", "s30") is None and await store.get("t", "s31") == b"x" * 10
        assert await store.usage() == {"": 995, "t": 995}
    finally:
        await store.close()
    assert len({s for s in statements if s.startswith("DELETE FROM sessions WHERE rowid IN")}) == 1


async def test_writes_within_the_interval_wait_and_share_one_transaction(tmp_path: Path) -> None:
    """Pacing (`write_interval`): a write after a quiet spell starts its transaction at once;
    the two queued within the interval of it wait and go in one transaction together, which
    `close()` starts rather than waiting the interval out. Exactly two write transactions."""
    store = SqliteStore(tmp_path / "s.db", write_interval=3600.0)
    await store.open()
    conn = store._conn
    assert conn is not None
    statements: list[str] = []
    await store._call(conn.set_trace_callback, statements.append)
    await store.put("t", "a", b"first", TTL)  # at once: an hour's wait would fail the test run
    later = [
        asyncio.ensure_future(store.put("t", "b", b"second", TTL)),  # noqa: TID251
        asyncio.ensure_future(store.put("t", "c", b"third", TTL)),  # noqa: TID251
    ]
    for _ in range(10):  # each put queues its write at its first step
        if len(store._batch) == 2:
            break
        await asyncio.sleep(0)
    assert len(store._batch) == 2  # waiting for the interval, not taken by the writer
    await store.close()
    assert [await put for put in later] == [None, None]
    assert sum(s == "BEGIN IMMEDIATE" for s in statements) == 2
    reopened = SqliteStore(tmp_path / "s.db")
    try:
        assert [await reopened.get("t", k) for k in "abc"] == [b"first", b"second", b"third"]
    finally:
        await reopened.close()


async def test_a_large_write_starts_the_paced_transaction_at_once(tmp_path: Path) -> None:
    """A write of `PACED_BYTES` or more is not paced: queued after a small one that waits for
    the interval, it starts their shared transaction at once (no `close()` needed)."""
    store = SqliteStore(tmp_path / "s.db", write_interval=3600.0)
    try:
        await store.open()
        conn = store._conn
        assert conn is not None
        statements: list[str] = []
        await store._call(conn.set_trace_callback, statements.append)
        await store.put("t", "a", b"first", TTL)
        small = asyncio.ensure_future(store.put("t", "b", b"small", TTL))  # noqa: TID251
        for _ in range(10):
            if len(store._batch) == 1:
                break
            await asyncio.sleep(0)
        assert len(store._batch) == 1  # waiting for the interval
        big = b"x" * sqlite_store.PACED_BYTES
        async with asyncio.timeout(30):  # paced, it would wait the hour: a failure, not a hang
            await store.put_parts("t", "c", b"head", [Part(b"k" * 16, len(big), big)], TTL)
            await small
        assert sum(s == "BEGIN IMMEDIATE" for s in statements) == 2
        assert await store.get("t", "b") == b"small"
        assert await store.get_parts("t", "c") == (b"head", {b"k" * 16: big})
    finally:
        await store.close()
