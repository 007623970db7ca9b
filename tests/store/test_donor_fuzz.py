"""Saves of new and growing sessions of a few tenants, interleaved with writes that succeed or
fail (the donors and the carried-over parts in play): every record read back is one saved for
its key, and once the writes go through, the newest."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.store import RecordStore
from proxy.store.base import Part
from proxy.store.codec import SessionRecord, Sidecar
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.sqlite import SqliteStore

POOL = [
    Sidecar(i, bytes([i]) * 16, b'"' + bytes([97 + i % 26]) * (3000 + 997 * (i % 5)) + b'"', bytes([i + 1]) * 16)
    for i in range(24)
]
EDITED = [
    Sidecar(i, bytes([i, 1]) * 8, b'"' + b"e" * (2000 + 1500 * (i % 3)) + b'"', bytes([i, 2]) * 8) for i in range(24)
]


class Gate:
    """Each write of the store it is mixed into waits for the test to let it go (`waiting`:
    one future per write, set `True` for a success, `False` for a failure raising `error`)."""

    error = "disk I/O error"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.waiting: list[asyncio.Future[bool]] = []

    async def _gate(self) -> None:
        gate: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.waiting.append(gate)
        if not await gate:
            raise OSError(self.error)


class GatedWrites(Gate):
    """A backend whose `RecordStore` writes are its plain `put_parts` and `put` (memory, Redis), gated."""

    async def put_parts(self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float) -> bool:
        await self._gate()
        return await super().put_parts(tenant, session, head, parts, ttl)

    async def put(self, tenant: str, session: str, value: bytes, ttl: float) -> None:
        await self._gate()
        await super().put(tenant, session, value, ttl)


class GatedStore(GatedWrites, MemoryStore):
    """The memory backend, gated."""


class GatedSqlite(Gate, SqliteStore):
    """The SQLite file, gated (its bounded writes, which `RecordStore` calls)."""

    async def put_parts_within(
        self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float, timeout: float
    ) -> bool:
        await self._gate()
        return await super().put_parts_within(tenant, session, head, parts, ttl, timeout)

    async def put_within(self, tenant: str, session: str, value: bytes, ttl: float, timeout: float) -> None:
        await self._gate()
        await super().put_within(tenant, session, value, ttl, timeout)


class GatedRedis(GatedWrites, RedisStore):
    """Redis, gated."""

    error = "Connection refused"


def make(n: int, edits: frozenset[int], turns: int) -> SessionRecord:
    sidecars = tuple(EDITED[i] if i in edits else POOL[i] for i in range(n))
    return SessionRecord(
        chain=b"\x00" * 16, ends=(n,), model="m", params_digest=b"\x01" * 16, sidecars=sidecars, turns=turns
    )


op = st.one_of(
    st.tuples(
        st.just("save"),
        st.integers(0, 1),
        st.integers(0, 2),
        st.integers(1, 24),
        st.frozensets(st.integers(0, 23), max_size=3),
    ),
    st.tuples(st.just("write"), st.booleans()),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(op, min_size=1, max_size=30), sole=st.booleans(), kind=st.sampled_from(["memory", "sqlite", "redis"])
)
def test_records_read_back_are_ones_saved_whatever_the_interleaving(
    ops: list[tuple], sole: bool, kind: str, redis_url: str
) -> None:
    async def run(folder: str) -> None:
        backend: GatedStore | GatedSqlite | GatedRedis
        if kind == "redis":
            client = redis.Redis.from_url(redis_url)
            client.flushall()
            client.close()
            backend = GatedRedis(redis_url)
        else:
            backend = GatedSqlite(f"{folder}/s.db") if kind == "sqlite" else GatedStore()
        store = RecordStore(backend, Metrics(CollectorRegistry()), is_sole_writer=sole)
        saved: dict[tuple[str, str], list[SessionRecord]] = {}
        turns = 0
        for item in ops:
            if item[0] == "save":
                _, t, s, n, edits = item
                turns += 1
                record = make(n, edits, turns)
                key = (f"t{t}", f"s{s}")
                assert store.save_soon(*key, record)
                saved.setdefault(key, []).append(record)
            elif backend.waiting:
                backend.waiting.pop(0).set_result(item[1])
            for _ in range(5):
                await asyncio.sleep(0)
        while store.pending_writes:
            while backend.waiting:
                backend.waiting.pop(0).set_result(True)
            await asyncio.sleep(0)
        await store.flush()
        fresh = RecordStore(backend, Metrics(CollectorRegistry()))
        for key, records in saved.items():
            got = await fresh.load(*key)
            assert got is None or got in records, key
            mine = await store.load(*key)
            assert mine == records[-1] if sole else (mine is None or mine in records)  # the sole writer: its newest
        # once every write goes through, the backend holds the newest of each key
        for key, records in saved.items():
            assert store.save_soon(*key, records[-1])
        while store.pending_writes:
            while backend.waiting:
                backend.waiting.pop(0).set_result(True)
            await asyncio.sleep(0)
        fresh = RecordStore(backend, Metrics(CollectorRegistry()))
        for key, records in saved.items():
            assert await fresh.load(*key) == records[-1], key
        await backend.close()

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(run(folder))
