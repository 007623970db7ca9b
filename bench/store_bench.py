"""Session store latency: one `load` + one `save` of a session record, per backend and size.

`python bench/store_bench.py [--redis URL] [--rounds N]`: for records of about 1 KB, 64 KB and
600 KB (a long agent conversation), times `RecordStore.load` + `RecordStore.save` (encode,
backend call, decode: what one request costs) on memory, SQLite (a temp file) and Redis (a
`redis-server` started on a free port in a temp dir unless `--redis` is given), and prints
p50 / p99 in milliseconds and as ratios to the memory backend, in one run, under uvloop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson
import uvloop
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.metrics import Metrics  # noqa: E402
from proxy.store import RecordStore, open_store  # noqa: E402
from proxy.store.codec import SessionRecord, Sidecar, encode_record  # noqa: E402

SIZES = {"1KB": 1_000, "64KB": 64_000, "600KB": 600_000}


def make_record(target_bytes: int) -> SessionRecord:
    """A record whose encoding is about `target_bytes`: messages of ~2 KB text each."""
    sidecars = []
    position = 0
    size = 0
    while size < target_bytes:
        text = os.urandom(min(1500, max(32, target_bytes // 2))).hex()[: min(2000, target_bytes)]
        value = orjson.dumps({"role": "user", "content": [{"type": "text", "text": text}]})
        sidecars.append(Sidecar(position, os.urandom(16), value, os.urandom(16)))
        position += 1
        size += len(value) + 40
    blocks = max(1, position)
    return SessionRecord(
        chain=os.urandom(16 * blocks),
        ends=tuple(range(100, 100 * (blocks + 1), 100)),
        model="claude-sonnet-4-6",
        params_digest=os.urandom(16),
        breakpoints=(0, blocks - 1),
        ttls=("1h", "5m"),
        arrivals=tuple(1_800_000_000.0 + i for i in range(16)),
        last_response_id="msg_bench",
        sidecars=tuple(sidecars),
        pins={"pinned_tool_order": ["read", "edit"], "pinned_schemas": {}, "pinned_inputs": {}},
        turns=blocks,
        head=os.urandom(16),
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(url: str, record: SessionRecord, rounds: int) -> list[float]:
    store = RecordStore(open_store(url), Metrics(CollectorRegistry()), get_timeout=5.0, put_timeout=5.0)
    try:
        for i in range(20):  # warm up: connections, file pages
            await store.save("bench-tenant", f"s{i % 4}", record)
            await store.load("bench-tenant", f"s{i % 4}")
        samples = []
        for i in range(rounds):
            session = f"s{i % 64}"
            started = time.perf_counter()
            await store.load("bench-tenant", session)
            await store.save("bench-tenant", session, record)
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        await store.close()


async def run(redis_url: str | None, rounds: int, workdir: Path) -> None:
    server = None
    if redis_url is None:
        from tests.store.redis_server import RedisServer

        server = RedisServer(workdir / "redis").start()
        redis_url = server.url
    try:
        backends = {
            "memory": "memory://",
            "sqlite": f"sqlite://{workdir / 'sessions.db'}",
            "redis": redis_url,
        }
        print(f"session store: load + save of one record, {rounds} rounds, uvloop, ms (ratio to memory)")
        print(
            f"{'size':>6} {'backend':>8} {'record':>9} {'p50 ms':>9} {'p99 ms':>9} {'p50 x':>8} {'p99 x':>8}"
        )
        for label, target in SIZES.items():
            record = make_record(target)
            encoded = len(encode_record(record))
            n = rounds if target < 100_000 else max(50, rounds // 4)
            base: tuple[float, float] | None = None
            for name, url in backends.items():
                samples = await measure(url, record, n)
                p50, p99 = statistics.median(samples), percentile(samples, 0.99)
                if base is None:
                    base = (p50, p99)
                print(
                    f"{label:>6} {name:>8} {encoded:>9} {p50 * 1e3:>9.3f} {p99 * 1e3:>9.3f}"
                    f" {p50 / base[0]:>8.1f} {p99 / base[1]:>8.1f}"
                )
    finally:
        if server is not None:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", help="redis://host:port/db (default: start a redis-server)")
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="promptcache-store-bench-") as tmp:
        uvloop.run(run(args.redis, args.rounds, Path(tmp)))


if __name__ == "__main__":
    main()
