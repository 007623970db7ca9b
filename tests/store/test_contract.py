"""The `SessionStore` contract, run against every backend (memory, sqlite, real redis-server)."""

from __future__ import annotations

import asyncio
import os

import pytest

from proxy.store.base import SessionStore

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
