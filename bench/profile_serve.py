"""Profile `promptcache serve` under load: where a request's time goes, end to end.

Starts `bench/fake_upstream.py` and `python -m proxy serve` (SQLite store) as subprocesses, sends
growing conversations (`growing_bodies`) at a fixed concurrency for a while, and prints p50/p99 latency, requests per
second and the server's peak RSS. With `--spy FILE` it records the server with
`py-spy record -f raw` meanwhile and prints the top functions (inclusive and self time). Not a
test: one run, one machine.

    python bench/profile_serve.py [--mode optimise|observe] [--size 1KB|600KB]
        [--seconds 8] [--concurrency 1] [--spy /tmp/serve.txt] [--top 40]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead_bench import peak_rss_mb  # noqa: E402
from proxy_bench import HEADERS, free_port, pct, scratch_dir, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def summarise(raw: Path, top: int) -> None:
    """Inclusive and self shares of a `py-spy record -f raw` file (one stack per line)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        n = int(count)
        total += n
        frames = [f.replace(str(ROOT) + "/", "") for f in stack.split(";")]
        for name in {f.split(":")[0] for f in frames}:
            inclusive[name] += n
        own[frames[-1]] += n
    print(f"{total} samples; inclusive:")
    for name, n in inclusive.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {name}")
    print("self (line):")
    for name, n in own.most_common(top // 2):
        print(f"  {100 * n / total:5.1f}%  {name}")


def growing_bodies(size: str, sessions: int) -> list[Iterator[bytes]]:
    """One endless body sequence per concurrent client. 1KB: a new one-turn conversation per
    request. 600KB: a ~540 KB agent history growing by one tool round trip (~1.6 KB) per
    request, 40 turns per session, then a new session (`gateway_bench`'s workload)."""
    from gateway_bench import TURNS, _split, _turn, agent_body, small_request

    def small(slot: int) -> Iterator[bytes]:
        head_a, head_b = _split(small_request())
        for n in itertools.count():
            yield head_a + f"{slot}-{n}".encode() + head_b + b"]}"

    def grow(slot: int) -> Iterator[bytes]:
        head_a, head_b = _split(agent_body())
        pieces = [_turn(k) for k in range(1, TURNS + 1)]
        for gen in itertools.count():
            head = head_a + f"{slot}-{gen}".encode() + head_b
            for k in range(1, TURNS + 1):
                yield head + b"".join(pieces[:k]) + b"]}"

    return [(small if size == "1KB" else grow)(slot) for slot in range(sessions)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="optimise", choices=("optimise", "observe"))
    parser.add_argument("--size", default="600KB", choices=("1KB", "600KB"))
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--spy", type=Path, help="record the server with py-spy into this file")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--gil", action="store_true",
                        help="py-spy samples only the thread holding the GIL (CPU in Python, no idle waits)")
    parser.add_argument("--store", default=None,
                        help="session store URL (default: SQLite in a temp dir, as users run it)")
    args = parser.parse_args()
    store = args.store or f"sqlite://{scratch_dir('pc-profile-')}/sessions.db"
    up, port = free_port(), free_port()
    env = {**os.environ, "PROMPTCACHE_LOG_LEVEL": "WARNING"}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "bench/fake_upstream.py"), str(up)])]
    server = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream", f"http://127.0.0.1:{up}",
         "--store", store, "--mode", args.mode],
        env=env, stdout=subprocess.DEVNULL, cwd=ROOT,
    )
    procs.append(server)
    spy = None
    try:
        await wait_ready(f"http://127.0.0.1:{up}/ready")
        await wait_ready(f"http://127.0.0.1:{port}/healthz")
        bodies = growing_bodies(args.size, args.concurrency)
        url = f"http://127.0.0.1:{port}/v1/messages"
        latencies: list[float] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency)) as http:
            for _ in range(10):  # warm up: the first turns of each conversation
                async with http.post(url, data=next(bodies[0]), headers=HEADERS) as r:
                    await r.read()
            if args.spy:
                py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                spy = subprocess.Popen(
                    [py_spy, "record", "-f", "raw", "-r", "500", "-o", str(args.spy), "-p", str(server.pid),
                     "-d", str(max(1, int(args.seconds))), *(["--gil"] if args.gil else [])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                await asyncio.sleep(1.0)
            end = time.perf_counter() + args.seconds

            async def worker(turns: Iterator[bytes]) -> None:
                while time.perf_counter() < end:
                    body = next(turns)
                    t0 = time.perf_counter()
                    async with http.post(url, data=body, headers=HEADERS) as r:
                        await r.read()
                    latencies.append(time.perf_counter() - t0)

            await asyncio.gather(*(worker(turns) for turns in bodies))
        print(f"{args.mode} {args.size} x{args.concurrency}: {len(latencies)} requests, "
              f"{len(latencies) / args.seconds:.0f}/s, p50 {pct(latencies, 0.5):.2f} ms, "
              f"p99 {pct(latencies, 0.99):.2f} ms, peak RSS {peak_rss_mb(server.pid):.0f} MB")
        if spy is not None:
            spy.wait(timeout=args.seconds + 30)
            summarise(args.spy, args.top)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


if __name__ == "__main__":
    asyncio.run(main())
