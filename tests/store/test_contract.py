"""The `SessionStore` contract, run against every backend (memory, sqlite, real redis-server)."""

from __future__ import annotations

import asyncio
import os

import pytest
import xxhash

from proxy.store.base import Part, SessionStore

TTL = 3600.0


async def test_missing_key_is_none(store: SessionStore) -> None:
    assert await store.get("tenant-a", "s1") is None


async def test_put_get_round_trips_exact_bytes(store: SessionStore) -> None:
    value = bytes(range(256)) * 4 + b"\x00tail"
    await store.put("tenant-a", "s1", value, TTL)
    assert await store.get("tenant-a", "s1") == value


async def test_large_value(store: SessionStore) -> None:
    value = os.urandom(1024 * 1024)
    await store.put("tenant-a", "big", value, TTL)
    assert await store.get("tenant-a", "big") == value


async def test_put_overwrites(store: SessionStore) -> None:
    await store.put("tenant-a", "s1", b"one", TTL)
    await store.put("tenant-a", "s1", b"two", TTL)
    assert await store.get("tenant-a", "s1") == b"two"


async def test_tenants_are_partitioned(store: SessionStore) -> None:
    await store.put("tenant-a", "same-session", b"a-bytes", TTL)
    await store.put("tenant-b", "same-session", b"b-bytes", TTL)
    assert await store.get("tenant-a", "same-session") == b"a-bytes"
    assert await store.get("tenant-b", "same-session") == b"b-bytes"
    await store.delete("tenant-a", "same-session")
    assert await store.get("tenant-a", "same-session") is None
    assert await store.get("tenant-b", "same-session") == b"b-bytes"
    assert await store.get("tenant-c", "same-session") is None


async def test_delete_absent_is_fine(store: SessionStore) -> None:
    await store.delete("tenant-a", "never-written")
    assert await store.get("tenant-a", "never-written") is None


async def test_non_positive_ttl_stores_nothing_and_removes(store: SessionStore) -> None:
    await store.put("tenant-a", "s1", b"kept", TTL)
    await store.put("tenant-a", "s1", b"gone", 0)
    assert await store.get("tenant-a", "s1") is None


@pytest.mark.parametrize("tenant, session", [("", "s"), ("t", ""), ("t:x", "s"), ("t", "s/1"), ("t", "a b")])
async def test_unsafe_keys_are_refused(store: SessionStore, tenant: str, session: str) -> None:
    with pytest.raises(ValueError):
        await store.put(tenant, session, b"x", TTL)
    with pytest.raises(ValueError):
        await store.get(tenant, session)


async def test_concurrent_operations_stay_consistent(store: SessionStore) -> None:
    keys = [(f"tenant-{i % 3}", f"s{i}") for i in range(60)]
    await asyncio.gather(*(store.put(t, s, f"{t}/{s}".encode(), TTL) for t, s in keys))
    values = await asyncio.gather(*(store.get(t, s) for t, s in keys))
    assert values == [f"{t}/{s}".encode() for t, s in keys]


async def test_backend_label_is_known(store: SessionStore) -> None:
    assert store.backend in ("memory", "sqlite", "redis")


async def test_close_is_idempotent(store: SessionStore) -> None:
    await store.close()
    await store.close()


def part(data: bytes) -> Part:
    return Part(xxhash.xxh3_128_digest(data), len(data), data)


async def test_parts_round_trip_keep_and_go(store: SessionStore) -> None:
    a, b, c = part(b"a" * 100), part(b"b" * 50), part(b"c" * 10)
    assert await store.get_parts("t", "s") is None
    assert await store.put_parts("t", "s", b"head1", [a, b], TTL)
    assert await store.get_parts("t", "s") == (b"head1", {a.key: a.data, b.key: b.data})
    assert await store.get("t", "s") == b"head1"
    # a kept by name, b no longer named (removed), c new
    assert await store.put_parts("t", "s", b"head2", [Part(a.key, a.size), c], TTL)
    assert await store.get_parts("t", "s") == (b"head2", {a.key: a.data, c.key: c.data})
    # b is gone: naming it stores nothing and leaves the value as it was
    assert not await store.put_parts("t", "s", b"head3", [Part(b.key, b.size)], TTL)
    assert await store.get_parts("t", "s") == (b"head2", {a.key: a.data, c.key: c.data})
    await store.put("t", "s", b"plain", TTL)  # a plain value drops the parts
    assert await store.get_parts("t", "s") == (b"plain", {})
    assert not await store.put_parts("t", "s", b"head4", [Part(a.key, a.size)], TTL)
    assert await store.put_parts("t", "s", b"head5", [a], TTL)
    await store.delete("t", "s")
    assert await store.get_parts("t", "s") is None
    assert not await store.put_parts("t", "s", b"head6", [Part(a.key, a.size)], TTL)
    assert await store.put_parts("t", "s", b"head7", [a], 0)  # ttl <= 0 stores nothing
    assert await store.get_parts("t", "s") is None


async def test_parts_are_partitioned_by_tenant(store: SessionStore) -> None:
    a = part(b"tenant a's message" * 10)
    assert await store.put_parts("tenant-a", "same", b"ha", [a], TTL)
    # tenant b names a's part: it does not hold it, so nothing is stored
    assert not await store.put_parts("tenant-b", "same", b"hb", [Part(a.key, a.size)], TTL)
    assert await store.get_parts("tenant-b", "same") is None
    assert await store.put_parts("tenant-b", "same", b"hb", [], TTL)
    assert await store.get_parts("tenant-b", "same") == (b"hb", {})
    assert await store.get_parts("tenant-a", "same") == (b"ha", {a.key: a.data})
    await store.delete("tenant-b", "same")
    assert await store.get_parts("tenant-a", "same") == (b"ha", {a.key: a.data})


async def test_parts_the_caller_holds_are_left_out_and_no_other(store: SessionStore) -> None:
    a, b, c = part(b"a" * 100), part(b"b" * 50), part(b"c" * 10)
    assert await store.put_parts("t", "s", b"head", [a, b, c], TTL)
    assert await store.get_parts("t", "s", frozenset({a.key, b.key})) == (b"head", {c.key: c.data})
    assert await store.get_parts("t", "s", frozenset({a.key, b.key, c.key})) == (b"head", {})
    # a name the value does not hold, or one of another length, changes nothing
    stranger = xxhash.xxh3_128_digest(b"not a part")
    assert await store.get_parts("t", "s", frozenset({stranger, b"short"})) == (
        b"head",
        {a.key: a.data, b.key: b.data, c.key: c.data},
    )
    assert await store.get_parts("t", "absent", frozenset({a.key})) is None
    await store.put("t", "p", b"plain", TTL)
    assert await store.get_parts("t", "p", frozenset({a.key})) == (b"plain", {})


async def test_a_held_name_straddling_two_known_names_is_not_left_out(store: SessionStore) -> None:
    # the known names go to SQLite back to back: a part whose name is the second half of one
    # known name followed by the first half of the next is not known, and is read
    x, y = part(b"x" * 30), part(b"y" * 30)
    straddler = Part(x.key[8:] + y.key[:8], 5, b"zzzzz")
    assert await store.put_parts("t", "s", b"head", [x, straddler], TTL)
    assert await store.get_parts("t", "s", (x.key, y.key)) == (b"head", {straddler.key: b"zzzzz"})


async def test_a_value_of_many_parts_is_read_whole_but_for_the_known_ones(store: SessionStore) -> None:
    # Redis fetches the parts it sends 1,000 at a time: 2,500 parts, one known
    parts = [part(b"p%04d" % i) for i in range(2500)]
    assert await store.put_parts("t", "s", b"head", parts, TTL)
    assert await store.get_parts("t", "s", frozenset({parts[1200].key})) == (
        b"head",
        {p.key: p.data for i, p in enumerate(parts) if i != 1200},
    )
