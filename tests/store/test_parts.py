"""Records in parts: an appended turn encodes and writes what is new, a read assembles the
parts and refuses mismatched ones, every backend keeps the `put_parts` contract, and a crash
mid-write leaves the old record or the new one, never a mix."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import subprocess
import sys
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.store import RecordStore
from proxy.store.base import Part
from proxy.store.codec import (
    PART_BYTES,
    RecordError,
    SessionRecord,
    Sidecar,
    decode_layout,
    decode_record,
    encode_layout,
    encode_record,
)
from proxy.store.memory import MemoryStore
from proxy.store.sqlite import SqliteStore

TTL = 3600.0
ROOT = Path(__file__).resolve().parents[2]


def message(i: int, size: int = 1000) -> Sidecar:
    value = b'{"role":"user","content":"' + bytes([97 + i % 26]) * size + b'"}'
    return Sidecar(i, bytes([i % 256]) * 16, value, bytes([(i + 1) % 256]) * 16)


def record(n: int, size: int = 1000, turns: int = 1) -> SessionRecord:
    return SessionRecord(
        chain=b"\x07" * 16 * n,
        ends=tuple(range(n)),
        model="m",
        params_digest=b"\x01" * 16,
        sidecars=tuple(message(i, size) for i in range(n)),
        turns=turns,
    )


def grown(before: SessionRecord, more: int, size: int = 1000) -> SessionRecord:
    """`before` plus `more` messages, its own sidecar objects kept (as `build_sidecars` keeps them)."""
    n = len(before.sidecars)
    added = tuple(message(i, size) for i in range(n, n + more))
    return replace(before, sidecars=before.sidecars + added, ends=tuple(range(n + more)), turns=before.turns + 1)


# --- the codec -------------------------------------------------------------------------------


def test_a_short_record_is_its_version_2_bytes() -> None:
    short = record(3)
    layout = encode_layout(short)
    assert (layout.head, layout.parts, layout.size) == (encode_record(short), (), len(encode_record(short)))
    assert decode_layout(layout.head, {}) == (short, layout)


def test_a_long_record_is_cut_into_parts_and_read_back_exactly() -> None:
    long = record(100)  # 100 messages of ~1,070 bytes with their index entries: 6 full parts
    layout = encode_layout(long)
    assert layout.counts == (16, 16, 16, 16, 16, 16)
    assert all(p.data is not None and p.size == len(p.data) > PART_BYTES for p in layout.parts)
    parts = {p.key: p.data for p in layout.parts if p.data is not None}
    decoded, read = decode_layout(layout.head, parts)
    assert decoded == long
    assert read == layout.without_data() and read.size == layout.size
    with pytest.raises(RecordError):
        decode_record(layout.head)  # a head without its parts is no record


def test_a_record_read_from_buffers_holds_bytes_of_its_own() -> None:
    """A head and parts handed over as other buffers (a `bytearray`, `memoryview`s) decode to
    the same record, every sidecar field a `bytes` object (sidecars are sliced from the bytes
    read), with the value digests of their values."""
    long = record(100)
    layout = encode_layout(long)
    parts = {p.key: memoryview(bytearray(p.data)) for p in layout.parts if p.data is not None}
    decoded, _ = decode_layout(bytearray(layout.head), parts)
    assert decoded == long
    fields = [(s.digest, s.exact, s.value, s.value_digest) for s in decoded.sidecars]
    assert {type(x) for row in fields for x in row} == {bytes}
    assert [s.value_digest for s in decoded.sidecars] == [xxhash.xxh3_128_digest(s.value) for s in long.sidecars]


def test_an_appended_turn_encodes_only_its_open_tail_and_new_parts() -> None:
    first = record(100)
    base = encode_layout(first)
    second = grown(first, 2)
    layout = encode_layout(second, (first, base))
    assert layout.parts == base.parts  # the same objects: nothing encoded again
    assert layout.counts == base.counts
    assert layout.head == encode_layout(second).head  # as if encoded whole: the same bytes
    assert len(layout.head) < base.size // 10  # the chain, the header and 6 messages
    parts = {p.key: p.data for p in base.parts if p.data is not None}
    assert decode_layout(layout.head, parts)[0] == second
    third = grown(second, 14)  # the open tail (4 + 2 + 14 messages) fills a part
    layout3 = encode_layout(third, (second, layout))
    assert layout3.parts[:6] == base.parts and layout3.counts == (16,) * 7
    assert decode_layout(layout3.head, parts | {layout3.parts[6].key: layout3.parts[6].data})[0] == third


def test_a_rewritten_history_is_encoded_again_from_its_part_on() -> None:
    first = record(100)
    base = encode_layout(first)
    edited = list(first.sidecars)
    edited[40] = replace(edited[40], value=b'{"role":"user","content":"edited"}')
    second = replace(first, sidecars=tuple(edited))
    layout = encode_layout(second, (first, base))
    assert layout.parts[:2] == base.parts[:2]  # messages 0-31 unchanged
    assert all(p.data is not None for p in layout.parts[2:])
    assert not {p.key for p in layout.parts[2:]} & {p.key for p in base.parts}
    parts = {p.key: p.data for p in base.parts + layout.parts if p.data is not None}
    assert decode_layout(layout.head, parts)[0] == second


def test_decoding_against_the_previous_record_reuses_its_sidecars() -> None:
    first = record(100)
    base = encode_layout(first)
    second = grown(first, 20)
    layout = encode_layout(second, (first, base))
    new = {p.key: p.data for p in layout.parts if p.data is not None}
    decoded, _ = decode_layout(layout.head, new, (first, base.without_data()))  # the old parts not read
    assert decoded == second
    assert decoded.sidecars[0] is first.sidecars[0] and decoded.sidecars[95] is first.sidecars[95]


def test_a_missing_or_different_part_is_no_record() -> None:
    long = record(40)
    layout = encode_layout(long)
    parts = {p.key: p.data for p in layout.parts if p.data is not None}
    first = layout.parts[0].key
    with pytest.raises(RecordError, match="missing"):
        decode_layout(layout.head, {k: v for k, v in parts.items() if k != first})
    other = encode_layout(record(40, size=999)).parts[0].data
    assert other is not None
    with pytest.raises(RecordError, match="does not match"):
        decode_layout(layout.head, parts | {first: other})  # another record's part under this name
    data = parts[first]
    with pytest.raises(RecordError, match="does not match"):
        decode_layout(layout.head, parts | {first: data[:-1] + b"x"})


# --- the SQLite backend ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9000), min_size=1, max_size=40),
    turns=st.lists(st.tuples(st.integers(0, 40), st.lists(st.integers(0, 9000), max_size=12)), max_size=5),
)
def test_a_record_encoded_without_its_base_has_the_same_parts(
    sizes: list[int], turns: list[tuple[int, list[int]]]
) -> None:
    """Parts are cut greedily from the first sidecar, so encoding against the previous record (kept
    parts) and encoding from nothing give the same layout, turn after turn, whether a turn
    appends or rewrites the history from some message on (`RecordStore` names the parts of a
    session whose record the memo dropped by this)."""
    current = replace(record(0), sidecars=tuple(message(i, n) for i, n in enumerate(sizes)))
    layout = encode_layout(current)
    for keep, added in turns:
        kept = current.sidecars[: min(keep, len(current.sidecars))]
        fresh = tuple(message(len(kept) + i, n + 1) for i, n in enumerate(added))  # other bytes
        nxt = replace(current, sidecars=kept + fresh)
        with_base = encode_layout(nxt, (current, layout))
        assert with_base == encode_layout(nxt)
        current, layout = nxt, with_base


def own_first(of: SessionRecord, size: int = 1000) -> SessionRecord:
    """`of` with a first message of its own (`size` bytes of content), every other sidecar the
    very object `of` holds: a new session re-sending a recent conversation."""
    first = Sidecar(0, b"\x55" * 16, b'{"role":"user","content":"' + b"z" * size + b'"}', b"\x56" * 16)
    return replace(of, sidecars=(first, *of.sidecars[1:]))


def test_a_new_session_takes_the_parts_of_a_donor_holding_the_same_messages() -> None:
    """A record encoded against another record (`donor`) takes each of the donor's parts that
    starts where one of its own would and holds equal sidecars, the very object (no encoding):
    the layout is the one encoding it from nothing gives. A donor naming its parts only lends
    their names (the write then encodes their bytes)."""
    donor = record(100)
    lent = encode_layout(donor)
    mine = own_first(donor)
    layout = encode_layout(mine, None, (donor, lent))
    assert layout == encode_layout(mine)
    assert layout.parts[0] != lent.parts[0]  # the first message is its own
    assert all(a is b for a, b in zip(layout.parts[1:], lent.parts[1:], strict=True))
    named = encode_layout(mine, None, (donor, lent.without_data()))
    assert named.head == layout.head and named.without_data() == layout.without_data()
    assert [p.data is None for p in named.parts] == [False, True, True, True, True, True]
    longer = own_first(donor, size=20_000)  # a first part of its own size: the cuts move
    assert encode_layout(longer, None, (donor, lent)) == encode_layout(longer)
    assert encode_layout(record(3), None, (donor, lent)) == encode_layout(record(3))  # too short to share


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9000), min_size=1, max_size=40),
    mine=st.lists(st.tuples(st.booleans(), st.integers(0, 9000)), min_size=1, max_size=40),
)
def test_a_record_encoded_against_a_donor_has_the_layout_encoded_from_nothing(
    sizes: list[int], mine: list[tuple[bool, int]]
) -> None:
    """Whatever the donor shares with the record (the same sidecar objects at some positions,
    others of their own sizes), encoding against it gives the same layout as from nothing."""
    donor = replace(record(0), sidecars=tuple(message(i, n) for i, n in enumerate(sizes)))
    lent = encode_layout(donor)
    sidecars = tuple(
        donor.sidecars[i] if is_shared and i < len(sizes) else message(i, n + 1)
        for i, (is_shared, n) in enumerate(mine)
    )
    current = replace(donor, sidecars=sidecars)
    assert encode_layout(current, None, (donor, lent)) == encode_layout(current)


def part(data: bytes) -> Part:
    import xxhash

    return Part(xxhash.xxh3_128_digest(data), len(data), data)


async def test_sqlite_counts_parts_in_its_caps_and_evicts_them_with_the_head(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db", max_bytes=10_000, max_tenant_bytes=1_000)
    try:
        a, b = part(b"a" * 400), part(b"b" * 400)
        assert await store.put_parts("t", "s1", b"h" * 100, [a], TTL)
        assert await store.usage() == {"": 500, "t": 500}
        assert await store.put_parts("t", "s2", b"h" * 100, [b], TTL)  # 1,000 bytes: at the cap
        assert await store.put_parts("t", "s3", b"h" * 10, [], TTL)  # over it: s1 goes, parts too
        assert await store.get_parts("t", "s1") is None
        assert await store.usage() == {"": 510, "t": 510}
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        named = "SELECT p.session, length(v.value) FROM parts AS p JOIN part_values AS v USING (tenant, key)"
        assert conn.execute(named).fetchall() == [("s2", 400)]
        assert conn.execute("SELECT length(value) FROM part_values").fetchall() == [(400,)]  # s1's went with it


def _stored_values(path: Path) -> list[tuple[str, int, int]]:
    """`(tenant, bytes, sessions naming them)` per part value the file holds."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT v.tenant, length(v.value), (SELECT count(*) FROM parts AS p"
            " WHERE p.tenant = v.tenant AND p.key = v.key) FROM part_values AS v ORDER BY v.tenant, length(v.value)"
        ).fetchall()
    conn.close()
    return rows


async def test_sqlite_keeps_a_part_once_per_tenant_until_no_session_names_it(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    try:
        shared, own, other = part(b"s" * 300), part(b"o" * 200), part(b"x" * 100)
        assert await store.put_parts("t", "s1", b"h1", [shared, own], TTL)
        assert await store.put_parts("t", "s2", b"h2", [shared, other], TTL)  # a fork: sends it again
        assert await store.put_parts("u", "s1", b"h3", [shared], TTL)  # another tenant: its own copy
        assert _stored_values(path) == [("t", 100, 1), ("t", 200, 1), ("t", 300, 2), ("u", 300, 1)]
        assert await store.usage() == {"": 2 + 500 + 2 + 400 + 2 + 300, "t": 904, "u": 302}  # each counts its own
        await store.delete("t", "s1")
        assert _stored_values(path) == [("t", 100, 1), ("t", 300, 1), ("u", 300, 1)]
        assert await store.get_parts("t", "s2") == (b"h2", {shared.key: b"s" * 300, other.key: b"x" * 100})
        assert await store.put_parts("t", "s2", b"h4", [Part(shared.key, shared.size)], TTL)  # `other` dropped
        assert _stored_values(path) == [("t", 300, 1), ("u", 300, 1)]
        await store.put("t", "s2", b"plain", TTL)  # a plain value: its parts go
        assert _stored_values(path) == [("u", 300, 1)]
        assert await store.get_parts("u", "s1") == (b"h3", {shared.key: b"s" * 300})
    finally:
        await store.close()


async def test_a_version_3_file_is_migrated_to_one_copy_of_each_part_per_tenant(tmp_path: Path) -> None:
    from proxy.store import sqlite as sqlite_store

    path = tmp_path / "s.db"
    a, b = part(b"a" * 40), part(b"b" * 30)
    with sqlite3.connect(path) as conn:
        for statement in (*sqlite_store._SCHEMA_V1, *sqlite_store._SCHEMA_V2, *sqlite_store._SCHEMA_V3):
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO sessions (tenant, session, expires, value, size, written, parts)"
            " VALUES (?, ?, 9e12, ?, ?, ?, ?)",
            [("t", "s1", b"h1", 72, 1, 2), ("t", "s2", b"h2", 42, 2, 1), ("u", "s1", b"h3", 42, 3, 1)],
        )
        conn.executemany(
            "INSERT INTO parts (tenant, session, key, value) VALUES (?, ?, ?, ?)",
            [
                ("t", "s1", a.key, a.data),
                ("t", "s1", b.key, b.data),
                ("t", "s2", a.key, a.data),
                ("u", "s1", a.key, a.data),
            ],
        )
        conn.execute("PRAGMA user_version = 3")
    conn.close()
    store = SqliteStore(path)
    try:
        assert await store.get_parts("t", "s1") == (b"h1", {a.key: a.data, b.key: b.data})
        assert await store.get_parts("t", "s2") == (b"h2", {a.key: a.data})
        assert await store.get_parts("u", "s1") == (b"h3", {a.key: a.data})
        assert await store.usage() == {"": 156, "t": 114, "u": 42}
        assert _stored_values(path) == [("t", 30, 1), ("t", 40, 2), ("u", 40, 1)]
        await store.delete("t", "s2")
        assert await store.get_parts("t", "s1") == (b"h1", {a.key: a.data, b.key: b.data})
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.SCHEMA_VERSION == 4
        assert [row[1] for row in conn.execute("PRAGMA table_info(parts)")] == ["tenant", "session", "key", "value"]
        assert conn.execute("SELECT count(*), sum(length(value)) FROM parts").fetchone() == (3, 0)  # names only
    conn.close()


# --- the record store ------------------------------------------------------------------------


class CountingStore(MemoryStore):
    """A memory backend that keeps the bytes of every write it is sent (head and parts)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[int] = []

    async def put_parts(self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float) -> bool:
        self.sent.append(len(head) + sum(len(p.data) for p in parts if p.data is not None))
        return await super().put_parts(tenant, session, head, parts, ttl)


async def test_an_appended_turn_sends_only_what_is_new() -> None:
    backend = CountingStore()
    store = RecordStore(backend, Metrics(CollectorRegistry()))
    first = record(100)
    second = grown(first, 2)
    assert await store.save("t", "s", first)
    assert await store.save("t", "s", second)
    whole = encode_layout(first)
    tail = encode_layout(second, (first, whole))
    assert backend.sent == [whole.size, len(tail.head)]  # the second write: its head only
    assert backend.sent[1] < whole.size // 10
    reader = RecordStore(backend, Metrics(CollectorRegistry()))  # another replica: nothing remembered
    assert await reader.load("t", "s") == second
    third = grown(second, 1)
    store.save_soon("t", "s", third)
    store.save_soon("t", "s", grown(third, 1))  # supersedes the pending one
    await store.flush()
    assert await reader.load("t", "s") == grown(third, 1)


async def test_a_part_the_backend_lost_is_sent_again() -> None:
    backend = CountingStore()
    store = RecordStore(backend, Metrics(CollectorRegistry()))
    first = record(100)
    assert await store.save("t", "s", first)
    await backend.put("t", "s", b"another replica's value", TTL)  # the parts are gone
    second = grown(first, 2)
    assert await store.save("t", "s", second)
    refused, resent = backend.sent[1:]
    assert (refused, resent) == (len(encode_layout(second).head), encode_layout(second).size)
    assert await RecordStore(backend, Metrics(CollectorRegistry())).load("t", "s") == second


class KeptParts(MemoryStore):
    """A memory backend that keeps the parts of every write in parts it is sent, by key."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: dict[tuple[str, str], Sequence[Part]] = {}

    async def put_parts(self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float) -> bool:
        self.parts[(tenant, session)] = parts
        return await super().put_parts(tenant, session, head, parts, ttl)


async def test_a_new_sessions_save_takes_its_tenants_last_record_s_parts_never_another_tenants() -> None:
    """A new session's save (`save_soon`) re-sending the conversation its tenant's last new
    session saved sends that save's part bytes as they are (the very objects: not encoded
    again), written as encoding it whole would; another tenant's save of the same conversation
    encodes its own."""
    backend = KeptParts()
    store = RecordStore(backend, Metrics(CollectorRegistry()))
    first = record(100)
    second = own_first(first)
    assert store.save_soon("t", "s1", first)
    assert store.save_soon("t", "s2", second)
    assert store.save_soon("u", "s3", second)
    await store.flush()
    sent = {key: [p.data for p in parts] for key, parts in backend.parts.items()}
    assert sent[("t", "s2")] == [p.data for p in encode_layout(second).parts] == sent[("u", "s3")]
    assert [a is b for a, b in zip(sent[("t", "s1")], sent[("t", "s2")], strict=True)] == [False] + [True] * 5
    assert not any(a is b for a, b in zip(sent[("t", "s2")], sent[("u", "s3")], strict=True))
    reader = RecordStore(backend, Metrics(CollectorRegistry()))
    assert [await reader.load(*key) for key in (("t", "s1"), ("t", "s2"), ("u", "s3"))] == [first, second, second]


async def test_a_superseded_saves_new_part_is_written_from_its_own_encoding() -> None:
    """Two saves of a session before its write runs: the first one's new part (cut by it, so
    named by the second's layout) is not held by the backend; the second's write sends the
    bytes the first save encoded (kept for it: `encoded_bytes`), not the whole record encoded
    again, and the record reads back whole."""
    backend = CountingStore()
    store = RecordStore(backend, Metrics(CollectorRegistry()))
    first = record(100)  # 6 parts and 4 messages in the head
    assert await store.save("t", "s", first)
    second = grown(first, 14)  # the open tail fills a seventh part
    third = grown(second, 1)  # no new part
    assert store.save_soon("t", "s", second) and store.save_soon("t", "s", third)  # no write ran between
    seventh = encode_layout(second).parts[6]
    assert store.encoded_bytes == seventh.size  # the seventh part's bytes, kept for third's write
    await store.flush()
    assert backend.sent[1:] == [len(encode_layout(third).head) + seventh.size]
    assert await RecordStore(backend, Metrics(CollectorRegistry())).load("t", "s") == third


class CountingSqlite(SqliteStore):
    """The SQLite backend, keeping the bytes of every write in parts it is sent (head and parts)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.sent: dict[str, list[int]] = {}

    async def put_parts_within(
        self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float, timeout: float
    ) -> bool:
        sent = len(head) + sum(len(p.data) for p in parts if p.data is not None)
        self.sent.setdefault(session, []).append(sent)
        return await super().put_parts_within(tenant, session, head, parts, ttl, timeout)


async def test_interleaved_sessions_send_only_new_parts_though_the_memo_dropped_them(tmp_path: Path) -> None:
    """32 sessions load, then save (as 32 concurrent requests do) through a memo that holds two
    records: every second write sends its head and new parts only, though no session's record
    was remembered at its save, and the pending records fit a bound that counts what they hold."""
    backend = CountingSqlite(tmp_path / "s.db")
    metrics = Metrics(CollectorRegistry())
    first, second = record(100), grown(record(100), 40)
    whole, tail = encode_layout(first), encode_layout(second)
    new = [p for p in tail.parts if p.key not in {q.key for q in whole.parts}]
    increment = len(tail.head) + sum(p.size for p in new)
    assert (len(whole.parts), len(tail.parts), len(new)) == (6, 8, 2) and increment < tail.size // 3
    # what a pending second record holds: the record (its parts wait as names), the values of the
    # sidecars after its parts once more (decoded beside the head that encodes them), 1,536 for
    # the record itself
    in_head = sum(len(s.value) for s in second.sidecars[sum(tail.counts) :])
    held = tail.size + in_head + 256 * 140 + 40 * 140 + 1536
    store = RecordStore(backend, metrics, memo_bytes=2 * held, max_pending_bytes=32 * held)
    sessions = [f"s{i}" for i in range(32)]
    for sid in sessions:
        assert await store.save("t", sid, first)
    assert [await store.load("t", sid) for sid in sessions] == [first] * 32
    assert len(store._memo) == 2  # the memo lost the others between their load and their save
    assert all(store.save_soon("t", sid, second) for sid in sessions)
    assert (store.pending_writes, store.pending_bytes) == (32, 32 * held)
    await store.flush()
    assert {sid: backend.sent[sid] for sid in sessions} == {sid: [whole.size, increment] for sid in sessions}
    dropped = metrics.registry.get_sample_value("promptcache_session_store_writes_dropped_total", {"backend": "sqlite"})
    assert dropped == 0
    reader = RecordStore(SqliteStore(tmp_path / "s.db"), Metrics(CollectorRegistry()))
    assert [await reader.load("t", sid) for sid in sessions] == [second] * 32
    await reader.close()
    await store.close()


class ReadCountingSqlite(SqliteStore):
    """The SQLite backend, keeping what every read in parts answered: the head's length and the
    names of the parts it carried."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.answered: list[tuple[int, list[bytes]]] = []

    async def get_parts_within(
        self, tenant: str, session: str, timeout: float, known: Collection[bytes] = ()
    ) -> tuple[bytes, dict[bytes, bytes]] | None:
        found = await super().get_parts_within(tenant, session, timeout, known)
        if found is not None:
            self.answered.append((len(found[0]), sorted(found[1])))
        return found


async def test_a_replica_reads_only_the_parts_added_since_the_record_it_remembers(tmp_path: Path) -> None:
    """Two processes on one file (`--workers 2`: neither is its sole writer): the one that read
    a session's record reads, at its next turn written by the other, the new head and the new
    parts only, and decodes the same record as a reader that remembers nothing."""
    writer = RecordStore(SqliteStore(tmp_path / "s.db"), Metrics(CollectorRegistry()))
    backend = ReadCountingSqlite(tmp_path / "s.db")
    reader = RecordStore(backend, Metrics(CollectorRegistry()))
    first, second = record(100), grown(record(100), 40)
    whole, tail = encode_layout(first), encode_layout(second)
    new = sorted({p.key for p in tail.parts} - {p.key for p in whole.parts})
    assert (len(whole.parts), len(tail.parts), len(new)) == (6, 8, 2)
    assert await writer.save("t", "s", first)
    remembered = await reader.load("t", "s")
    assert remembered == first
    assert await writer.save("t", "s", second)
    loaded = await reader.load("t", "s")
    assert loaded == second
    assert backend.answered == [(len(whole.head), sorted(p.key for p in whole.parts)), (len(tail.head), new)]
    assert loaded is not None and remembered is not None and loaded.sidecars[0] is remembered.sidecars[0]
    assert await reader.load("t", "s") is loaded  # the head it remembers: no part read
    assert backend.answered[2] == (len(tail.head), [])
    await writer.save("t", "s", first)  # the history rewritten: what the reader lacks is read
    assert await reader.load("t", "s") == first
    assert backend.answered[3] == (len(whole.head), [])  # first's parts: all held by the record remembered
    fresh = RecordStore(SqliteStore(tmp_path / "s.db"), Metrics(CollectorRegistry()))
    assert await fresh.load("t", "s") == first
    for store in (writer, reader, fresh):
        await store.close()


async def test_a_session_the_memo_does_not_hold_is_read_against_its_tenants_donor(tmp_path: Path) -> None:
    """Through a memo that holds nothing, a session's record is decoded against its tenant's
    donor (the newest record saved whole: `second`, re-sending `first`'s conversation under a
    first message of its own): the read answers the head and the parts the donor does not name
    only, and the record holds the donor's sidecar objects there. A store that saved nothing
    (no donor) reads every part; both decode the records saved."""
    backend = ReadCountingSqlite(tmp_path / "s.db")
    store = RecordStore(backend, Metrics(CollectorRegistry()), memo_bytes=1)  # remembers nothing
    first = record(100)
    second = own_first(first)
    assert store.save_soon("t", "s1", first) and store.save_soon("t", "s2", second)
    await store.flush()
    whole, own = encode_layout(first), encode_layout(second)
    assert [a.key == b.key for a, b in zip(whole.parts, own.parts, strict=True)] == [False] + [True] * 5
    assert [await store.load("t", sid) for sid in ("s1", "s2")] == [first, second]
    assert backend.answered == [(len(whole.head), [whole.parts[0].key]), (len(own.head), [])]
    loaded = await store.load("t", "s1")
    lent = store._donors["t"][0].sidecars  # the donor's: its parts' sidecars, part 0's its own
    assert loaded is not None and len(lent) == sum(whole.counts)
    shared = zip(loaded.sidecars[: len(lent)], lent, strict=True)
    assert [a is b for a, b in shared] == [False] * whole.counts[0] + [True] * (len(lent) - whole.counts[0])
    fresh = RecordStore(backend, Metrics(CollectorRegistry()), memo_bytes=1)
    assert [await fresh.load("t", sid) for sid in ("s1", "s2")] == [first, second]
    assert backend.answered[3:] == [
        (len(whole.head), sorted(p.key for p in whole.parts)),
        (len(own.head), sorted(p.key for p in own.parts)),
    ]
    await fresh.close()
    await store.close()


async def test_a_part_gone_from_the_backend_after_the_memo_dropped_the_record_is_sent_again() -> None:
    backend = CountingStore()
    store = RecordStore(backend, Metrics(CollectorRegistry()), memo_bytes=1)  # remembers nothing
    first = record(100)
    assert await store.save("t", "s", first)
    await backend.put("t", "s", b"another replica's value", TTL)  # the parts are gone
    second = grown(first, 2)
    assert await store.save("t", "s", second)
    assert backend.sent[1:] == [len(encode_layout(second).head), encode_layout(second).size]
    assert await RecordStore(backend, Metrics(CollectorRegistry())).load("t", "s") == second


async def test_a_save_encodes_against_the_record_its_load_returned_though_the_memo_dropped_it() -> None:
    """The request holds the record it loaded; the store keeps a weak reference to it and its
    parts, so the session's save encodes only its new parts. Once nobody holds the record, the
    save encodes from nothing (same parts: the property above)."""
    backend = MemoryStore()
    store = RecordStore(backend, Metrics(CollectorRegistry()), memo_bytes=1)  # remembers nothing
    first = record(100)
    for sid in ("s0", "s1"):
        assert await store.save("t", sid, first)
    held = await store.load("t", "s0")
    assert held == first and held is not first  # decoded from the backend
    assert await store.load("t", "s1") == first  # nobody keeps this one
    gc.collect()
    base = store._base(("t", "s0"))
    assert base is not None and base[0] is held
    assert [p.key for p in base[1].parts] == [p.key for p in encode_layout(first).parts]
    assert store._base(("t", "s0")) is None  # taken by the save it was kept for
    assert store._base(("t", "s1")) is None


def test_the_part_index_is_bounded_in_bytes() -> None:
    from proxy.store import STORED_ENTRY_BYTES, STORED_PARTS_BYTES
    from proxy.store.codec import Layout

    store = RecordStore(MemoryStore(), Metrics(CollectorRegistry()))
    layout = Layout(b"h", tuple(Part(bytes([i]) * 16, 1) for i in range(4)), (1, 1, 1, 1))
    one = STORED_ENTRY_BYTES + 4 * 16
    fit = STORED_PARTS_BYTES // one
    for i in range(fit + 3):
        store._note_stored(("t", f"s{i}"), layout)
    assert (len(store._stored), store._stored_bytes) == (fit, fit * one)
    assert ("t", "s2") not in store._stored and ("t", "s3") in store._stored
    assert store._stored_parts(("t", "s3")) == {p.key for p in layout.parts}
    store._note_stored(("t", "s3"), None)
    assert store._stored_parts(("t", "s3")) == set() and store._stored_bytes == (fit - 1) * one


# --- a crash mid-write -----------------------------------------------------------------------

CRASH = """
import asyncio, os, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
from prometheus_client import CollectorRegistry
from proxy.metrics import Metrics
from proxy.store import RecordStore
from proxy.store.sqlite import SqliteStore
from dataclasses import replace
from test_parts import grown, record

async def main():
    backend = SqliteStore({path!r})
    store = RecordStore(backend, Metrics(CollectorRegistry()))
    first = record(100)
    assert await store.save("t", "s", first)
    def crash(statement):
        if statement.startswith({at!r}):
            os._exit(17)  # the process dies: no rollback, no close
    await backend._call(backend._conn.set_trace_callback, crash)
    await store.save("t", "s", {second})
    os._exit(0)

asyncio.run(main())
"""


@pytest.mark.parametrize(
    "at, second",
    [
        ("INSERT OR IGNORE INTO part_values", "grown(first, 40)"),  # new parts going in, the head not yet
        ("INSERT OR IGNORE INTO parts", "grown(first, 40)"),  # their names going in
        ("INSERT INTO sessions", "grown(first, 40)"),  # the parts in, the head being written
        ("COMMIT", "grown(first, 40)"),  # everything written, not committed
        ("DELETE FROM parts", "replace(first, sidecars=first.sidecars[:40])"),  # stale parts going
    ],
)
async def test_a_crash_mid_write_leaves_the_old_record_whole(tmp_path: Path, at: str, second: str) -> None:
    """The writer process dies (`os._exit` from SQLite's statement trace) inside the second
    record's transaction; the file, opened again, holds the first record whole."""
    path = tmp_path / "s.db"
    script = CRASH.format(root=str(ROOT), tests=str(ROOT / "tests" / "store"), path=str(path), at=at, second=second)
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 17, done.stderr.decode()
    # opening a crashed file recovers its WAL: not what is timed here
    store = RecordStore(SqliteStore(path), Metrics(CollectorRegistry()), get_timeout=30.0)
    try:
        assert await store.load("t", "s") == record(100)
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM parts").fetchone()[0] == len(encode_layout(record(100)).parts)
