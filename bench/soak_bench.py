"""Soak: `promptcache serve` with the default SQLite store under steady load, in front of the
simulator running in its own process (`python -m proxy.sim`), as a real upstream would be: the
proxy's RSS and event loop are its own (`serve --upstream sim` would run the simulator, and its
growing cache model, inside the proxy's process; `--in-process-sim` measures that set-up).

16 concurrent clients (default) each run multi-turn sessions over the three APIs in turn
(Anthropic Messages, OpenAI Chat, OpenAI Responses): a long system prompt, turns that grow the
conversation, every other turn a tool round trip (the simulator's `x-sim-tool-call` reply, then
the tool result). Prints errors (non-200 or transport errors), store read timeouts and errors
(from `/metrics`), request latency p50/p99 over the first and the last 30 s, the proxy's RSS
every 10 s (and the simulator's), and the SQLite file and WAL sizes at the end. Not a test.

    python bench/soak_bench.py [--seconds 300] [--concurrency 16] [--in-process-sim]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_bench import free_port, pct, scratch_dir, wait_ready  # noqa: E402

SYSTEM = "You are a careful coding agent working in a large repository. " * 120
TOOL = "read_file"
ANTHROPIC_TOOLS = [
    {
        "name": TOOL,
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
OPENAI_PARAMS = {"type": "object", "properties": {"path": {"type": "string"}}}
TURNS = 12


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Stats:
    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.errors = 0
        self.requests = 0


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], stats: Stats
) -> Any:
    started = time.perf_counter()
    stats.requests += 1
    try:
        async with http.post(url, data=orjson.dumps(body), headers=headers) as r:
            data = await r.read()
            if r.status != 200:
                stats.errors += 1
                return None
    except aiohttp.ClientError:
        stats.errors += 1
        return None
    stats.samples.append((time.monotonic(), time.perf_counter() - started))
    return orjson.loads(data)


async def anthropic_session(http: aiohttp.ClientSession, base: str, n: int, stats: Stats, deadline: float) -> None:
    headers = {"x-api-key": f"key-{n % 4}", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    messages: list[dict[str, Any]] = []
    for turn in range(TURNS):
        if time.monotonic() > deadline:
            return
        messages.append({"role": "user", "content": f"session {n} turn {turn}: please look at module {turn}."})
        extra = {"x-sim-tool-call": TOOL, "x-sim-tool-input": '{"path": "a.py"}'} if turn % 2 else {}
        body = {
            "model": "claude-sonnet-4-6",
            "max_tokens": 64,
            "system": SYSTEM,
            "tools": ANTHROPIC_TOOLS,
            "messages": messages,
        }
        answer = await post(http, base + "/v1/messages", body, {**headers, **extra}, stats)
        if answer is None:
            return
        messages.append({"role": "assistant", "content": answer["content"]})
        calls = [b for b in answer["content"] if b.get("type") == "tool_use"]
        if calls:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": c["id"], "content": "x = 1\n" * 40} for c in calls
                    ],
                }
            )
            answer = await post(http, base + "/v1/messages", {**body, "messages": messages}, headers, stats)
            if answer is None:
                return
            messages.append({"role": "assistant", "content": answer["content"]})


async def chat_session(http: aiohttp.ClientSession, base: str, n: int, stats: Stats, deadline: float) -> None:
    headers = {"Authorization": f"Bearer key-{n % 4}", "content-type": "application/json"}
    tools = [{"type": "function", "function": {"name": TOOL, "parameters": OPENAI_PARAMS}}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(TURNS):
        if time.monotonic() > deadline:
            return
        messages.append({"role": "user", "content": f"session {n} turn {turn}: please look at module {turn}."})
        extra = {"x-sim-tool-call": TOOL, "x-sim-tool-input": '{"path": "a.py"}'} if turn % 2 else {}
        body = {"model": "gpt-5.1", "messages": messages, "tools": tools, "user": f"soak-{n}"}
        answer = await post(http, base + "/v1/chat/completions", body, {**headers, **extra}, stats)
        if answer is None:
            return
        message = answer["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if v is not None})
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "x = 1\n" * 40})
        if message.get("tool_calls"):
            answer = await post(http, base + "/v1/chat/completions", {**body, "messages": messages}, headers, stats)
            if answer is None:
                return
            messages.append({k: v for k, v in answer["choices"][0]["message"].items() if v is not None})


async def responses_session(http: aiohttp.ClientSession, base: str, n: int, stats: Stats, deadline: float) -> None:
    headers = {"Authorization": f"Bearer key-{n % 4}", "content-type": "application/json"}
    tools = [{"type": "function", "name": TOOL, "parameters": OPENAI_PARAMS}]
    items: list[dict[str, Any]] = []
    for turn in range(TURNS):
        if time.monotonic() > deadline:
            return
        items.append({"role": "user", "content": f"session {n} turn {turn}: please look at module {turn}."})
        extra = {"x-sim-tool-call": TOOL, "x-sim-tool-input": '{"path": "a.py"}'} if turn % 2 else {}
        body = {
            "model": "gpt-5.1",
            "instructions": SYSTEM,
            "input": items,
            "tools": tools,
            "prompt_cache_key": f"soak-{n}",
        }
        answer = await post(http, base + "/v1/responses", body, {**headers, **extra}, stats)
        if answer is None:
            return
        output = answer["output"]
        items.extend(output)
        calls = [o for o in output if o.get("type") == "function_call"]
        for call in calls:
            items.append({"type": "function_call_output", "call_id": call["call_id"], "output": "x = 1\n" * 40})
        if calls:
            answer = await post(http, base + "/v1/responses", {**body, "input": items}, headers, stats)
            if answer is None:
                return
            items.extend(answer["output"])


async def worker(base: str, index: int, stats: Stats, deadline: float) -> None:
    kinds = (anthropic_session, chat_session, responses_session)
    n = index
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            await kinds[n % 3](http, base, n, stats, deadline)
            n += 1000


async def metric(base: str, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--in-process-sim", action="store_true", help="serve --upstream sim (one process)")
    args = parser.parse_args()
    state = scratch_dir("pc-soak-") / "state"
    port = free_port()
    env = {**os.environ, "PROMPTCACHE_LOG_LEVEL": "WARNING", "PROMPTCACHE_STATE_DIR": str(state)}
    sim = None
    upstream = "sim"
    if not args.in_process_sim:
        sim_port = free_port()
        sim = subprocess.Popen(
            [sys.executable, "-m", "proxy.sim", "--port", str(sim_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        upstream = f"http://127.0.0.1:{sim_port}"
        await wait_ready(upstream + "/v1/models")
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream", upstream],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(base + "/healthz")
        stats = Stats()
        started = time.monotonic()
        deadline = started + args.seconds
        workers = [asyncio.ensure_future(worker(base, i, stats, deadline)) for i in range(args.concurrency)]  # noqa: TID251
        where = "simulator in-process" if sim is None else "simulator in its own process"
        print(f"soak: {args.seconds:g} s, concurrency {args.concurrency}, {where}, SQLite in {state}")
        print(f"  startup RSS {rss_kb(proc.pid) / 1024:.1f} MB, load average {os.getloadavg()[0]:.2f}")
        print("   t(s)  requests  errors  RSS(MB)  sim RSS(MB)  load(1m)")
        while time.monotonic() < deadline:
            await asyncio.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
            print(
                f"{time.monotonic() - started:7.0f} {stats.requests:9d} {stats.errors:7d} "
                f"{rss_kb(proc.pid) / 1024:8.1f} {rss_kb(sim.pid) / 1024 if sim else 0:12.1f} "
                f"{os.getloadavg()[0]:9.2f}"
            )
        await asyncio.gather(*workers)
        first = [d for t, d in stats.samples if t - started <= 30]
        last = [d for t, d in stats.samples if t >= started + args.seconds - 30]
        get_errors = await metric(base, "promptcache_session_store_errors_total", backend="sqlite", operation="get")
        timeouts = await metric(base, "promptcache_session_store_faults_total", backend="sqlite", kind="timeout")
        put_errors = await metric(base, "promptcache_session_store_errors_total", backend="sqlite", operation="put")
        dropped = await metric(base, "promptcache_session_store_writes_dropped_total", backend="sqlite")
        reads = await metric(
            base, "promptcache_session_store_operation_duration_seconds_count", backend="sqlite", operation="get"
        )
        local = await metric(base, "promptcache_session_store_local_reads_total", backend="sqlite")
        db, wal = state / "sessions.db", state / "sessions.db-wal"
        print(
            f"requests {stats.requests}, errors {stats.errors}, store read errors {get_errors:g} "
            f"(timeouts, reads and writes: {timeouts:g}), "
            f"write errors {put_errors:g}, writes dropped {dropped:g}"
        )
        print(f"store reads {reads:g}, record loads answered from this process's own newest write {local:g}")
        print(
            f"latency first 30 s: p50 {pct(first, 0.5):.1f} ms, p99 {pct(first, 0.99):.1f} ms ({len(first)} requests)"
        )
        print(f"latency last 30 s:  p50 {pct(last, 0.5):.1f} ms, p99 {pct(last, 0.99):.1f} ms ({len(last)} requests)")
        print(
            f"sessions.db {db.stat().st_size / 1e6:.1f} MB, "
            f"WAL {wal.stat().st_size / 1e6 if wal.exists() else 0:.1f} MB, "
            f"RSS at end {rss_kb(proc.pid) / 1024:.1f} MB"
        )
        print("load average at end (1/5/15 min): {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if sim is not None:
            sim.terminate()
            sim.wait(timeout=30)


if __name__ == "__main__":
    asyncio.run(main())
