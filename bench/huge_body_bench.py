"""Huge bodies against everyone else: `promptcache serve` (default SQLite store) in front of the
simulator in its own process; N clients each send one huge request at once while a probe
polls `/healthz` every 10 ms on its own connection. Prints, per N, the worst and p99 `/healthz`
latency while the huge requests are in flight, each huge request's time, and the proxy's
`promptcache_pipeline_budget_exceeded_total` (requests whose optimisation was skipped).

Bodies (`--shape`): `chat` = one OpenAI Chat body of 100,000 short messages (~5.9 MB, the
reviewer's case); `messages` = one Anthropic body of 600 messages of 10 KB (~6 MB, a long
agent conversation); `images` = one Anthropic body of 20 turns each carrying a 1.2 MB base64
screenshot (~24 MB, a computer-use agent's; over the byte budget, few blocks). `--budget-off`
raises the budgets so far that nothing is skipped (the "before" figure). Not a test; the load
average is printed, since the 2 cores are shared.

    python bench/huge_body_bench.py [--shape chat|messages|images] [--concurrency 1,2,4] [--budget-off]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_bench import free_port, pct, scratch_dir, wait_ready  # noqa: E402


def chat_body(n: int = 100_000) -> tuple[str, bytes, dict[str, str]]:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} ok"} for i in range(n)]
    body = {"model": "gpt-5.5", "max_completion_tokens": 8, "messages": messages}
    return "/v1/chat/completions", orjson.dumps(body), {"authorization": "Bearer sk-bench-huge"}


def messages_body(n: int = 600, size: int = 10_000) -> tuple[str, bytes, dict[str, str]]:
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "lorem ipsum dolor " * (size // 18)}
        for i in range(n - 1)
    ] + [{"role": "user", "content": "and now?"}]
    body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": messages}
    headers = {"x-api-key": "sk-ant-bench-huge", "anthropic-version": "2023-06-01"}
    return "/v1/messages", orjson.dumps(body), headers


def images_body(n: int = 20, size: int = 1_200_000) -> tuple[str, bytes, dict[str, str]]:
    data = base64.b64encode(bytes(range(256)) * (size * 3 // 4 // 256)).decode()
    messages: list[dict[str, object]] = []
    for i in range(n):
        shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        messages.append({"role": "user", "content": [{"type": "text", "text": f"step {i}: the screen"}, shot]})
        messages.append({"role": "assistant", "content": f"clicked at {i}, {i}"})
    messages.append({"role": "user", "content": "and now?"})
    body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": messages}
    headers = {"x-api-key": "sk-ant-bench-huge", "anthropic-version": "2023-06-01"}
    return "/v1/messages", orjson.dumps(body), headers


SHAPES = {"chat": chat_body, "messages": messages_body, "images": images_body}


async def metric(base: str, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


async def one_round(
    base: str, path: str, body: bytes, headers: dict[str, str], n: int
) -> tuple[list[float], list[float], list[int]]:
    probes: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        async with aiohttp.ClientSession() as http:
            while not done.is_set():
                started = time.perf_counter()
                async with http.get(base + "/healthz") as r:
                    await r.read()
                probes.append(time.perf_counter() - started)
                await asyncio.sleep(0.01)

    async def huge(i: int) -> tuple[float, int]:
        started = time.perf_counter()
        h = {**headers, "content-type": "application/json", "x-session-id": f"huge-{n}-{i}-{time.time_ns()}"}
        async with aiohttp.ClientSession() as http, http.post(base + path, data=body, headers=h) as r:
            await r.read()
            return time.perf_counter() - started, r.status

    prober = asyncio.ensure_future(probe())  # noqa: TID251
    try:
        results = await asyncio.gather(*(huge(i) for i in range(n)))
    finally:
        done.set()
        await prober
    return probes, [t for t, _ in results], [s for _, s in results]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=tuple(SHAPES), default="chat")
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--budget-off", action="store_true", help="budgets so high nothing is skipped (before)")
    args = parser.parse_args()
    path, body, headers = SHAPES[args.shape]()
    state = scratch_dir("pc-huge-") / "state"
    env = {**os.environ, "PROMPTCACHE_LOG_LEVEL": "WARNING", "PROMPTCACHE_STATE_DIR": str(state)}
    if args.budget_off:
        env["PROMPTCACHE_PIPELINE_BUDGET_BYTES"] = str(1 << 30)
        env["PROMPTCACHE_PIPELINE_BUDGET_BLOCKS"] = str(1 << 30)
    sim_port, port = free_port(), free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "proxy.sim", "--port", str(sim_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc = None
    try:
        await wait_ready(f"http://127.0.0.1:{sim_port}/v1/models")
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream", f"http://127.0.0.1:{sim_port}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        await wait_ready(base + "/healthz")
        print(
            f"huge bodies: {args.shape}, {len(body) / 1e6:.1f} MB each, "
            f"budgets {'off' if args.budget_off else 'default'}, load average {os.getloadavg()[0]:.1f}"
        )
        print("   N  /healthz worst  p99      huge request time (each)        statuses")
        for n in (int(x) for x in args.concurrency.split(",")):
            probes, times, statuses = await one_round(base, path, body, headers, n)
            each = ", ".join(f"{t:.2f}" for t in sorted(times))
            print(
                f"{n:4d}  {max(probes) * 1000:10.0f} ms {pct(probes, 0.99):5.0f} ms   "
                f"{each:30s}  {sorted(set(statuses))}"
            )
        skipped = await metric(base, "promptcache_pipeline_budget_exceeded_total")
        print(
            f"requests over the pipeline budget (optimisation skipped): {skipped:g}; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
    finally:
        for p in (proc, sim):
            if p is not None:
                p.terminate()
                p.wait(timeout=30)


if __name__ == "__main__":
    asyncio.run(main())
