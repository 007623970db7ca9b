"""CPU per 1 KB request in one process: promptcache's fixed pipeline cost against a bare handler (issue 14).

The gateway bench's small workload (`bench/gateway_bench.py` `small_request()`): every request is
the first request of a new one-turn conversation with distinct bytes (about 1 KB). The fake
upstream, the peers and an aiohttp client run in one process and one event loop:
- `bare`: a bare aiohttp pass-through handler (as `bench/bare_passthrough.py`), no pipeline;
- `observe` and `optimise`: `promptcache` (`create_app`, its default SQLite store in a temp dir);
- `transport`: promptcache in observe mode with its request and response stages replaced by
  no-ops in this bench (no setting switches them off): the server, handler, admission, forward,
  relay and the handler's own metrics only, so "over bare" is the cost outside the stages.

The peers are measured in interleaved rounds (`--rounds` x `--requests` each) so that all three
see the same machine load; it prints each peer's process CPU per request (`time.process_time`:
the client's and the upstream's share are included and the same for every peer, so the column
"over bare" is promptcache's own cost; "off-loop" is the part spent in other threads than the
event loop's: the SQLite store's), the p50 of each request stage's and response stage's wall
time, and with `--profile N` a cProfile of the `--profile-mode` peer's requests (top N functions
by cumulative and own time; `--profile-scope stages`: only inside the request and response
stages). The cyclic garbage collector is tuned as `promptcache serve` tunes it (`--gc default`:
Python's thresholds, which add collections inside the stages that `serve` does not have). Not a
test; the load average is printed with the figures.

`--account` splits each peer's CPU per request by where it ran (`LoopAccount`, median of rounds):
the event loop's thread by task (each task step's thread CPU, keyed by its coroutine's name: the
handlers' `RequestHandler._handle_request`, which holds the stages, the store's background
writes `RecordStore._write_pending`, ...), the loop's work outside any task step (protocol
callbacks, the store's settle callbacks, timers, the loop itself, and the bench client's main
task, which starts before the account does: the same for every peer), the cyclic collector, and
every other thread by name; a round then also waits for its store writes (`RecordStore.flush`),
so the writer's transaction of the round's records is counted in it. The wrapper around each
step costs about 1 us per step itself (counted in the steps).

    .venv/bin/python bench/small_cpu.py [--rounds 5] [--requests 300] [--profile 40 --profile-mode optimise]
    .venv/bin/python bench/small_cpu.py --account --peers transport,observe,optimise
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bare_passthrough import make_app  # noqa: E402
from gateway_bench import MARK, small_request  # noqa: E402
from turn_cpu import _serve, _stage_totals, _upstream, report_profile  # noqa: E402

import proxy.handlers  # noqa: E402
from proxy.app import create_app  # noqa: E402
from proxy.appkeys import SERVICES  # noqa: E402
from proxy.cli import _tune_gc  # noqa: E402
from proxy.response import RESPONSE_STAGES, run_response_stages  # noqa: E402
from proxy.settings import Settings  # noqa: E402

HEADERS = {"x-api-key": "bench-key", "anthropic-version": "2023-06-01", "content-type": "application/json"}
PEERS = ("bare", "transport", "observe", "optimise")


class _TimedStage:
    """A response stage whose wall time per call is appended to `times` (bench only)."""

    def __init__(self, stage: Any, times: dict[str, list[float]]) -> None:
        self._stage = stage
        self.name = stage.name
        self.error_label = stage.error_label
        self.runs_over_budget = stage.runs_over_budget
        self._times = times.setdefault(stage.name, [])

    def run(self, exchange: Any, services: Any) -> None:
        started = time.perf_counter()
        try:
            self._stage.run(exchange, services)
        finally:
            self._times.append(time.perf_counter() - started)


def _timed_response_stages(times: dict[str, list[float]]) -> Callable[[Any, Any], None]:
    stages = tuple(_TimedStage(stage, times) for stage in RESPONSE_STAGES)

    def run(exchange: Any, services: Any) -> None:
        run_response_stages(exchange, services, stages)  # type: ignore[arg-type]

    return run


class _TimedCoroutine(Coroutine[Any, Any, Any]):
    """A task's coroutine whose every step's thread CPU seconds are added to `totals[name]`."""

    __slots__ = ("_coro", "_name", "_totals")

    def __init__(self, coro: Coroutine[Any, Any, Any], name: str, totals: defaultdict[str, float]) -> None:
        self._coro, self._name, self._totals = coro, name, totals

    def send(self, value: Any) -> Any:
        started = time.thread_time()
        try:
            return self._coro.send(value)
        finally:
            self._totals[self._name] += time.thread_time() - started

    def throw(self, *args: Any) -> Any:
        started = time.thread_time()
        try:
            return self._coro.throw(*args)
        finally:
            self._totals[self._name] += time.thread_time() - started

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()


class LoopAccount:
    """Where the CPU goes (`--account`): the event loop thread's CPU seconds per task (by
    coroutine name), in the cyclic collector (`gc`), and every other thread's by name, as
    running totals; `snapshot()` reads them all at once."""

    def __init__(self) -> None:
        self.totals: defaultdict[str, float] = defaultdict(float)
        self._gc_started = 0.0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Time the tasks created from now on and the collector's passes."""

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            name = "task " + getattr(coro, "__qualname__", type(coro).__name__)
            return asyncio.Task(_TimedCoroutine(coro, name, self.totals), loop=loop, **kwargs)

        loop.set_task_factory(factory)  # type: ignore[arg-type]
        gc.callbacks.append(self._collected)

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.thread_time()
        else:
            self.totals[f"gc gen{info['generation']}"] += time.thread_time() - self._gc_started

    def snapshot(self) -> dict[str, float]:
        """The totals so far, with `loop thread` (this thread's CPU) and `thread NAME` (each other's)."""
        found = dict(self.totals)
        found["loop thread"] = time.thread_time()
        for thread in threading.enumerate():
            if thread is threading.current_thread() or thread.ident is None:
                continue
            try:
                spent = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, ProcessLookupError):  # the thread ended meanwhile
                continue
            key = f"thread {thread.name}"
            found[key] = found.get(key, 0.0) + spent
        return found


def _account_rows(before: dict[str, float], after: dict[str, float], stages: float, count: int) -> dict[str, float]:
    """One round's split, ms per request: the loop thread, the stages in it, each task, the loop
    outside any task step (`loop, no task`, with the bench client's own task, started before the
    account), the collector, the other threads."""
    rows = {k: 1000 * (v - before.get(k, 0.0)) / count for k, v in after.items()}
    tasks = sum(v for k, v in rows.items() if k.startswith("task "))
    rows["  of which stages"] = 1000 * stages / count
    rows["loop, no task (and the client)"] = rows["loop thread"] - tasks
    return {k: v for k, v in rows.items() if abs(v) >= 0.0005 or k == "  of which stages"}


def small_bodies(count: int, salt: str) -> list[bytes]:
    """`count` distinct 1 KB bodies, each the first request of its own conversation."""
    head_a, head_b = orjson.dumps(small_request()).split(MARK.encode())
    return [head_a + f"{salt}-{i}".encode() + head_b for i in range(count)]


def _other_threads_cpu() -> float:
    """CPU seconds so far of every Python thread but this one (the store's threads: the event
    loop and everything on it run in this one)."""
    total = 0.0
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.ident is None:
            continue
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return total


async def _round(
    http: aiohttp.ClientSession, url: str, bodies: list[bytes], profile: cProfile.Profile | None
) -> tuple[float, float]:
    """Send `bodies` one after another; the process CPU seconds per request and the part of
    it spent outside the loop's thread (a thread that ended during the round is not in the
    second figure)."""
    if profile is not None:
        profile.enable()
    started, others = time.process_time(), _other_threads_cpu()
    for body in bodies:
        async with http.post(url + "/v1/messages", data=body, headers=HEADERS) as r:
            await r.read()
            assert r.status == 200, r.status
    spent, others = time.process_time() - started, _other_threads_cpu() - others
    if profile is not None:
        profile.disable()
    return spent / len(bodies), max(0.0, others) / len(bodies)


async def main(args: argparse.Namespace) -> None:
    upstream_app = web.Application(client_max_size=64 * 1024 * 1024)
    upstream_app.router.add_route("*", "/{tail:.*}", _upstream)
    up_runner, up_url = await _serve(upstream_app)
    response_ms: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runners, urls, apps = [], {}, {}
        bare = make_app(up_url)
        runner, urls["bare"] = await _serve(bare)
        runners.append(runner)
        for mode in ("transport", "observe", "optimise"):
            settings = Settings(
                mode="observe" if mode == "transport" else mode,
                upstream=up_url,
                state_dir=Path(tmp) / mode,
                store=f"sqlite://{tmp}/{mode}.db",
                log_level="WARNING",
            )
            apps[mode] = create_app(settings, CollectorRegistry())
            runner, urls[mode] = await _serve(apps[mode])
            runners.append(runner)
        timed = {mode: _timed_response_stages(response_ms.setdefault(mode, {})) for mode in apps}
        if args.gc == "serve":  # the collector as `promptcache serve` sets it up (proxy.cli)
            _tune_gc()
        by_services = {id(app[SERVICES]): mode for mode, app in apps.items()}
        pipeline_cpu = dict.fromkeys(apps, 0.0)
        """Thread CPU seconds inside the request and response stages, per mode (so far)."""
        original_response = proxy.handlers.run_response_stages
        original_request = proxy.handlers.run_request_stages

        def response_side(exchange: Any, services: Any) -> None:
            mode = by_services[id(services)]
            if mode == "transport":
                return
            inner = stage_profile if mode == profiling[0] else None
            if inner is not None:
                inner.enable()
            started = time.thread_time()
            timed[mode](exchange, services)
            pipeline_cpu[mode] += time.thread_time() - started
            if inner is not None:
                inner.disable()

        async def request_side(exchange: Any, services: Any) -> None:
            # one request at a time: while this awaits (the store read) the loop is idle, so the
            # thread CPU between the two readings is the request stages' own
            mode = by_services[id(services)]
            if mode == "transport":
                return
            inner = stage_profile if mode == profiling[0] else None
            if inner is not None:
                inner.enable()
            started = time.thread_time()
            await original_request(exchange, services)
            pipeline_cpu[mode] += time.thread_time() - started
            if inner is not None:
                inner.disable()

        proxy.handlers.run_response_stages = response_side  # type: ignore[assignment]
        proxy.handlers.run_request_stages = request_side  # type: ignore[assignment]
        cpu: dict[str, list[float]] = {peer: [] for peer in PEERS}
        thread_cpu: dict[str, list[float]] = {peer: [] for peer in PEERS}
        """CPU per request outside the loop's thread (the SQLite store's threads), per round."""
        stage_cpu: dict[str, list[float]] = {mode: [] for mode in apps}
        stage_ms: dict[str, dict[str, list[float]]] = {mode: {} for mode in apps}
        profile = cProfile.Profile() if args.profile and args.profile_scope == "all" else None
        stage_profile = cProfile.Profile() if args.profile and args.profile_scope == "stages" else None
        profiling = [""]
        """The mode whose stages `stage_profile` records in the current round ("" none)."""
        account = LoopAccount() if args.account else None
        accounts: dict[str, list[dict[str, float]]] = {peer: [] for peer in PEERS}
        if account is not None:
            account.install(asyncio.get_running_loop())
        async with aiohttp.ClientSession() as http:
            for peer in PEERS:  # warm-up: connections, tokenizer, store schema
                await _round(http, urls[peer], small_bodies(50, f"warm-{peer}"), None)
            for times in response_ms.values():
                for values in times.values():
                    values.clear()
            for r in range(args.rounds):
                for peer in args.peers.split(","):
                    bodies = small_bodies(args.requests, f"r{r}-{peer}")
                    before = _stage_totals(apps[peer]) if peer in apps else {}
                    cpu_before = pipeline_cpu.get(peer, 0.0)
                    use = profile if peer == args.profile_mode else None
                    profiling[0] = peer if peer == args.profile_mode else ""
                    seen = account.snapshot() if account is not None else {}
                    spent, off_loop = await _round(http, urls[peer], bodies, use)
                    if account is not None:
                        store = apps[peer][SERVICES].store if peer in apps else None
                        if store is not None:
                            await store.flush()  # the round's records written in the round
                        stages = pipeline_cpu.get(peer, 0.0) - cpu_before
                        accounts[peer].append(_account_rows(seen, account.snapshot(), stages, len(bodies)))
                    cpu[peer].append(spent)
                    thread_cpu[peer].append(off_loop)
                    if peer in apps:  # the mean per request of each stage over this round
                        stage_cpu[peer].append((pipeline_cpu[peer] - cpu_before) / len(bodies))
                        for name, (n, total) in _stage_totals(apps[peer]).items():
                            n0, total0 = before.get(name, (0.0, 0.0))
                            if n > n0:
                                stage_ms[peer].setdefault(name, []).append(1000 * (total - total0) / (n - n0))
        proxy.handlers.run_response_stages = original_response  # type: ignore[assignment]
        proxy.handlers.run_request_stages = original_request  # type: ignore[assignment]
        for runner in runners:
            await runner.cleanup()
    await up_runner.cleanup()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"1 KB first requests: {args.rounds} rounds x {args.requests} requests per peer, load average {load}")
    base = statistics.median(cpu["bare"]) if cpu["bare"] else float("nan")
    print(f"{'peer':<10}{'CPU/request ms (median of rounds)':>36}{'over bare ms':>14}{'x bare':>8}{'off-loop ms':>13}")
    for peer in args.peers.split(","):
        value, off_loop = statistics.median(cpu[peer]), statistics.median(thread_cpu[peer])
        print(
            f"{peer:<10}{1000 * value:>36.3f}{1000 * (value - base):>14.3f}{value / base:>8.2f}{1000 * off_loop:>13.3f}"
        )
    for mode in (m for m in apps if stage_cpu[m] and m != "transport"):
        values = stage_cpu[mode]
        print(
            f"{mode} pipeline thread CPU per request (request + response stages): median "
            f"{1000 * statistics.median(values):.3f} ms, min {1000 * min(values):.3f} ms"
        )
    for mode in (m for m in apps if stage_ms[m]):
        print(
            f"{mode} request stages, mean ms per request (median of rounds): "
            + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in stage_ms[mode].items())
        )
        print(
            f"{mode} response stages, p50 ms: "
            + ", ".join(f"{k} {1000 * statistics.median(v):.3f}" for k, v in response_ms[mode].items() if v)
        )
    for peer in (p for p in args.peers.split(",") if accounts[p]):
        rounds = accounts[peer]
        keys = sorted({k for r in rounds for k in r}, key=lambda k: (not k.startswith(("loop thread", "  ")), k))
        print(f"{peer} CPU per request by where it ran, ms (median of rounds, min-max):")
        for key in keys:
            values = [r.get(key, 0.0) for r in rounds]
            print(f"  {key:<44}{statistics.median(values):>8.3f}  ({min(values):.3f}-{max(values):.3f})")
    if profile is not None or stage_profile is not None:
        report_profile(profile or stage_profile, args.profile, args.profile_out)  # type: ignore[arg-type]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    parser.add_argument("--profile", type=int, default=0, help="print this many profile rows")
    parser.add_argument("--profile-mode", choices=PEERS, default="optimise")
    parser.add_argument(
        "--gc",
        choices=("serve", "default"),
        default="serve",
        help="the cyclic collector as `promptcache serve` tunes it (serve: frozen start-up objects, "
        "gen-0 threshold 50,000) or Python's defaults (default: what this bench measured before 2026-12-02)",
    )
    parser.add_argument(
        "--profile-scope",
        choices=("all", "stages"),
        default="all",
        help="profile the whole process (all) or only the request and response stages (stages)",
    )
    parser.add_argument("--profile-out", default="", help="also write the raw cProfile stats to this file")
    parser.add_argument(
        "--account", action="store_true", help="split each peer's CPU by task, loop, collector and thread (LoopAccount)"
    )
    uvloop.run(main(parser.parse_args()))
