"""End-to-end latency added by the session store: `promptcache serve` with `sqlite` and
`redis` against the same proxy with `memory`, in one run.

Starts the fast fake upstream, a `redis-server` on a free port (a temp dir), and three
`promptcache serve --mode optimise` processes that differ only in `--store`; sends the same
request (~1 KB and ~600 KB bodies; the session is inferred) at concurrency 1 and
prints p50/p99 per backend and the difference to `memory` (ms). Not a test.

    python bench/store_e2e_bench.py [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bodies import anthropic_body, small_body  # noqa: E402
from proxy_bench import free_port, pct, run_load, scratch_dir, wait_ready  # noqa: E402

from tests.store.redis_server import RedisServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    tmp = scratch_dir("pc-store-bench-")
    redis = RedisServer(tmp / "redis").start()
    up_port = free_port()
    stores = {
        "memory": "memory://",
        "sqlite": f"sqlite://{tmp / 'state' / 'sessions.db'}",
        "redis": redis.url,
    }
    env = {**os.environ, "PROMPTCACHE_LOG_LEVEL": "WARNING", "PROMPTCACHE_STATE_DIR": str(tmp / "state")}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "bench/fake_upstream.py"), str(up_port)])]
    urls: dict[str, str] = {}
    for name, store in stores.items():
        port = free_port()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream",
                 f"http://127.0.0.1:{up_port}", "--store", store],
                env=env, stdout=subprocess.DEVNULL,
            )
        )
        urls[name] = f"http://127.0.0.1:{port}"
    try:
        for url in urls.values():
            await wait_ready(url + "/healthz")
        bodies = {"1KB": orjson.dumps(small_body()), "600KB": orjson.dumps(anthropic_body(600_000))}
        print("session store, end to end through promptcache serve (optimise), concurrency 1; ms")
        columns = " | ".join(f"{n + ' p50/p99':>16}" for n in stores)
        print(f"{'body':>6} | {columns} | sqlite - memory | redis - memory")
        for body_name, body in bodies.items():
            total = args.requests if body_name == "1KB" else max(args.requests // 4, 40)
            cells, p50 = [], {}
            for name, url in urls.items():
                latencies, _ = await run_load(url + "/v1/messages", body, 1, total)
                p50[name] = pct(latencies, 0.5)
                cells.append(f"{p50[name]:7.2f}/{pct(latencies, 0.99):7.2f}")
            print(f"{body_name:>6} | " + " | ".join(f"{c:>16}" for c in cells)
                  + f" | {p50['sqlite'] - p50['memory']:15.2f} | {p50['redis'] - p50['memory']:14.2f}")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)
        redis.stop()


if __name__ == "__main__":
    asyncio.run(main())
