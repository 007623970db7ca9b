"""Added latency of `promptcache serve` against calling the same fake upstream directly.

Starts `bench/fake_upstream.py` and `promptcache serve --upstream <fake>` as subprocesses on
loopback, then sends the same requests directly and through the proxy at concurrency 1 and 32,
with a ~1 KB and a ~600 KB Messages body. Prints p50/p99 per path and the added time, as one
table from one run (compare ratios, not absolute numbers). Not a test.

    python bench/proxy_bench.py [--requests 400] [--mode optimise|observe]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bodies import anthropic_body, small_body  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HEADERS = {"x-api-key": "bench", "anthropic-version": "2023-06-01", "content-type": "application/json"}


def scratch_dir(prefix: str) -> Path:
    """A new temporary directory for one bench run (state dirs, SQLite files, workloads),
    removed when the process exits (`atexit`: also after an exception or Ctrl-C); kept when
    `PROMPTCACHE_BENCH_KEEP` is set, and its path printed then. A gateway bench run leaves
    0.5-2.3 GB of stores behind, so a machine that runs it repeatedly filled its disk."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.environ.get("PROMPTCACHE_BENCH_KEEP"):
        print(f"bench scratch dir kept: {path}", file=sys.stderr)
    else:
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(url) as r:
                    await r.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not start")


async def run_load(url: str, body: bytes, concurrency: int, total: int) -> tuple[list[float], float]:
    """POST `body` to `url` `total` times from `concurrency` workers (after a short warm-up).

    Returns the per-request latencies (seconds) and the requests per second of the measured part.
    """
    latencies: list[float] = []
    headers = HEADERS
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(min(20, total)):
            async with http.post(url, data=body, headers=headers) as r:
                await r.read()
        remaining = total

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                async with http.post(url, data=body, headers=headers) as r:
                    await r.read()
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, total / elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--mode", default="optimise")
    parser.add_argument("--store", default=None,
                        help="session store URL (default: SQLite in a temp dir, as users run it)")
    args = parser.parse_args()
    store = args.store or f"sqlite://{scratch_dir('pc-bench-')}/sessions.db"
    up_port, px_port = free_port(), free_port()
    env = {**os.environ, "PROMPTCACHE_LOG_LEVEL": "WARNING"}
    procs = [
        subprocess.Popen([sys.executable, str(ROOT / "bench" / "fake_upstream.py"), str(up_port)]),
        subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--port", str(px_port), "--upstream",
             f"http://127.0.0.1:{up_port}", "--store", store, "--mode", args.mode],
            env=env, stdout=subprocess.DEVNULL,
        ),
    ]
    try:
        direct = f"http://127.0.0.1:{up_port}"
        proxied = f"http://127.0.0.1:{px_port}"
        await wait_ready(direct + "/ready")
        await wait_ready(proxied + "/healthz")
        bodies = {"1KB": orjson.dumps(small_body()), "600KB": orjson.dumps(anthropic_body(600_000))}
        print(f"promptcache serve --mode {args.mode} vs direct; {args.requests} requests per cell; ms")
        print(f"{'body':>6} {'conc':>4} | {'direct p50':>10} {'p99':>7} | {'proxy p50':>9} {'p99':>7} | "
              f"{'added p50':>9} {'p99':>7} | {'ratio p50':>9}")
        for name, body in bodies.items():
            for concurrency in (1, 32):
                n = args.requests if name == "1KB" else max(args.requests // 4, 50)
                d, _ = await run_load(direct + "/v1/messages", body, concurrency, n)
                p, _ = await run_load(proxied + "/v1/messages", body, concurrency, n)
                d50, d99, p50, p99 = pct(d, 0.5), pct(d, 0.99), pct(p, 0.5), pct(p, 0.99)
                print(f"{name:>6} {concurrency:>4} | {d50:10.2f} {d99:7.2f} | {p50:9.2f} {p99:7.2f} | "
                      f"{p50 - d50:9.2f} {p99 - d99:7.2f} | {p50 / d50:9.2f}x")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


if __name__ == "__main__":
    asyncio.run(main())
