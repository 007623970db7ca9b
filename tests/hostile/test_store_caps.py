"""The SQLite store's byte caps (reviewer's gap 1): a tenant flooding the store with large
records under new session ids evicts only its own least recently written records (the
per-tenant cap), the file's total stays within `store_max_bytes`, a record larger than the
per-tenant cap is not stored at all, and every eviction and skipped record is counted. Real
HTTP through the proxy in front of the simulator, the real SQLite file read back."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson

from proxy.session_identity import explicit_id
from proxy.settings import Settings
from tests.sessions.conftest import Client, Proxy, Sim

MODEL = "claude-sonnet-4-6"
EVICTED = "promptcache_session_store_evictions_total"
SKIPPED = "promptcache_session_store_records_skipped_total"


def body(text: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": text}]}


def records(db: Path) -> list[tuple[str, str, int]]:
    """`(tenant, session, size)` of every session record (not the tenants' pacing rows)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT tenant, session, size, value FROM sessions ORDER BY written").fetchall()
    return [(t, s, n) for t, s, n, v in rows if bytes(v).startswith(b"PCR")]


async def test_one_tenants_flood_evicts_its_own_oldest_records_never_another_tenants(
    start_proxy: Any, sim: Sim, client: Client, tmp_path: Path
) -> None:
    db = tmp_path / "sessions.db"
    per_tenant = 1_000_000
    proxy: Proxy = await start_proxy(
        upstream=sim.url,
        store=f"sqlite://{db}",
        store_max_bytes=1_500_000,
        store_max_bytes_per_tenant=per_tenant,
    )
    status, _ = await client.messages(
        proxy, body("tenant B's one conversation"), key="key-b", headers={"x-session-id": "b-1"}
    )
    assert status == 200
    await client.settle(proxy)
    ((tenant_b, session_b, _),) = records(db)
    assert session_b == explicit_id("b-1")
    for n in range(12):  # ~200 KB records under new session ids: 2.4 MB in all
        status, _ = await client.messages(
            proxy, body(f"flood {n} " + "x" * 200_000), key="key-a", headers={"x-session-id": f"a-{n}"}
        )
        assert status == 200
        await client.settle(proxy)
    rows = records(db)
    flood = [(s, n) for t, s, n in rows if t != tenant_b]
    assert (tenant_b, session_b) in [(t, s) for t, s, _ in rows]  # B's record survived A's flood
    assert sum(n for _, n in flood) <= per_tenant
    kept = [s for s, _ in flood]
    assert kept == [explicit_id(f"a-{n}") for n in range(12 - len(kept), 12)]  # A's newest, in order
    assert len(kept) == 4
    # the 8 oldest records and A's pacing row (written after its first response, never since)
    assert proxy.sample(EVICTED, backend="sqlite", cap="tenant") == 9
    assert proxy.sample(EVICTED, backend="sqlite", cap="total") == 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (total,) = conn.execute("SELECT sum(size) FROM sessions").fetchone()
        usage = dict(conn.execute("SELECT tenant, bytes FROM usage"))
    assert usage[""] == total <= 1_500_000
    # B's next turn still replays: its record is there
    status, _ = await client.messages(
        proxy, body("tenant B's one conversation"), key="key-b", headers={"x-session-id": "b-1"}
    )
    assert status == 200


async def test_the_total_cap_evicts_the_least_recently_written_of_any_tenant(
    start_proxy: Any, sim: Sim, client: Client, tmp_path: Path
) -> None:
    """Two tenants flooding, each within its own cap, together over the total: the file's
    oldest records go first, whoever wrote them (B's, then A's oldest), and the total holds."""
    db = tmp_path / "sessions.db"
    proxy: Proxy = await start_proxy(
        upstream=sim.url, store=f"sqlite://{db}", store_max_bytes=1_500_000, store_max_bytes_per_tenant=1_000_000
    )
    await client.messages(proxy, body("tenant B's one conversation"), key="key-b", headers={"x-session-id": "b-1"})
    await client.settle(proxy)
    ((tenant_b, _, _),) = records(db)
    for key in ("key-a", "key-c"):
        for n in range(4):
            await client.messages(
                proxy, body(f"flood {n} " + "x" * 200_000), key=key, headers={"x-session-id": f"f-{n}"}
            )
            await client.settle(proxy)
    rows = records(db)
    tenants = [t for t, _, _ in rows]
    assert tenant_b not in tenants
    assert len(set(tenants)) == 2
    assert tenants.count(tenants[-1]) == 4  # the last flooder kept all of its four
    assert tenants.count(tenants[0]) == 3  # the first lost its oldest
    assert sum(n for _, _, n in rows) <= 1_500_000
    # B's record, B's pacing row, then the first flooder's oldest record
    assert proxy.sample(EVICTED, backend="sqlite", cap="total") == 3
    assert proxy.sample(EVICTED, backend="sqlite", cap="tenant") == 0


async def test_a_record_larger_than_the_per_tenant_cap_is_not_stored(
    start_proxy: Any, sim: Sim, client: Client, tmp_path: Path
) -> None:
    db = tmp_path / "sessions.db"
    proxy: Proxy = await start_proxy(upstream=sim.url, store=f"sqlite://{db}", store_max_bytes_per_tenant=300_000)
    first = body("a small first turn")
    status, answer = await client.messages(proxy, first, key="key-a", headers={"x-session-id": "s-1"})
    assert status == 200
    await client.settle(proxy)
    assert [s for _, s, _ in records(db)] == [explicit_id("s-1")]
    second = {
        **first,
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "y" * 400_000},
        ],
    }
    status, _ = await client.messages(proxy, second, key="key-a", headers={"x-session-id": "s-1"})
    assert status == 200  # the request is served; only its record is not kept
    await client.settle(proxy)
    assert records(db) == []  # neither the large record nor the older one it replaces
    assert proxy.sample(SKIPPED, backend="sqlite") == 1
    assert orjson.loads(orjson.dumps(answer))["type"] == "message"


def test_the_per_tenant_cap_follows_a_lowered_total_unless_set() -> None:
    assert Settings().tenant_store_bytes == 256 * 1024 * 1024
    assert Settings(store_max_bytes=1_500_000).tenant_store_bytes == 375_000
    assert Settings(store_max_bytes=1_500_000, store_max_bytes_per_tenant=2_000_000).tenant_store_bytes == 2_000_000
    assert Settings(store_max_bytes=3).tenant_store_bytes == 1


async def test_lowering_only_the_total_keeps_one_tenants_flood_from_evicting_another(
    start_proxy: Any, sim: Sim, client: Client, tmp_path: Path
) -> None:
    """Review finding (session 4): with only `store_max_bytes` lowered, the per-tenant cap was
    the total, and one tenant's flood evicted everyone else's records."""
    db = tmp_path / "sessions.db"
    proxy: Proxy = await start_proxy(upstream=sim.url, store=f"sqlite://{db}", store_max_bytes=1_500_000)
    await client.messages(proxy, body("tenant B's one conversation"), key="key-b", headers={"x-session-id": "b-1"})
    await client.settle(proxy)
    ((tenant_b, session_b, _),) = records(db)
    for n in range(8):  # ~200 KB records: 1.6 MB in all, over the total
        await client.messages(
            proxy, body(f"flood {n} " + "x" * 200_000), key="key-a", headers={"x-session-id": f"a-{n}"}
        )
        await client.settle(proxy)
    rows = records(db)
    assert (tenant_b, session_b) in [(t, s) for t, s, _ in rows]
    assert [s for t, s, _ in rows if t != tenant_b] == [explicit_id("a-7")]  # 375,000 holds one
    assert proxy.sample(EVICTED, backend="sqlite", cap="total") == 0
