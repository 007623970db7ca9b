"""One worker process of `serve --workers N` as the SQLite store sees it (run by
`tests/store/test_sqlite_shared.py`): a `RecordStore` over a `SqliteStore` on the file given,
writing its records with the bounds `serve` uses (`PUT_TIMEOUT`), waves of concurrent writes
as a loaded worker issues them.

    python -m tests.store.shared_writer PATH NAME RECORDS WAVE VALUE_BYTES MAX_BYTES

Prints `ready` once the file is open, waits for a line on stdin (every worker starts writing
at once), then writes `RECORDS` values (`value(NAME, i, VALUE_BYTES)`, key `(NAME-tenant,
NAME-i)`), `WAVE` at a time, and prints one JSON line: its put errors and fault kinds (its
`/metrics` counters) and the largest size of the file's WAL it saw between waves."""

from __future__ import annotations

import asyncio
import os
import sys

import orjson
from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.store import PUT_TIMEOUT, RecordStore
from proxy.store.base import FAULT_KINDS
from proxy.store.sqlite import SqliteStore

TTL = 3600.0


def value(name: str, i: int, size: int) -> bytes:
    """The bytes of record `i` of worker `name`: distinct per record, `size` long."""
    stamp = f"{name}:{i}:".encode()
    return (stamp * (size // len(stamp) + 1))[:size]


async def main(path: str, name: str, records: int, wave: int, size: int, max_bytes: int) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    backend = SqliteStore(path, max_bytes=max_bytes, max_tenant_bytes=max_bytes)
    store = RecordStore(backend, metrics, put_timeout=PUT_TIMEOUT)
    await backend.open()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    wal_max = 0
    for start in range(0, records, wave):
        wal_max = max(wal_max, os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0)
        await asyncio.gather(
            *(
                store._put_bytes((f"{name}-tenant", f"{name}-{i}"), value(name, i, size), TTL)
                for i in range(start, min(records, start + wave))
            )
        )
    get = registry.get_sample_value
    faults = {
        kind: found
        for kind in FAULT_KINDS
        if (found := get("promptcache_session_store_faults_total", {"backend": "sqlite", "kind": kind}))
    }
    errors = get("promptcache_session_store_errors_total", {"backend": "sqlite", "operation": "put"}) or 0.0
    await store.close()
    print(orjson.dumps({"put_errors": errors, "faults": faults, "wal_max": wal_max}).decode(), flush=True)


if __name__ == "__main__":
    p, n, r, w, z, m = sys.argv[1:7]
    asyncio.run(main(p, n, int(r), int(w), int(z), int(m)))
