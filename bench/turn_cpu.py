"""CPU per appended turn of a 600 KB growing session, in one process, per stage (issue 14).

Runs the fake upstream, `promptcache` (`create_app`, default SQLite store in a temp dir) and an
aiohttp client in one process and one event loop, and sends the gateway bench's growing agent
sessions (`bench/gateway_bench.py`: a ~540 KB history, then one tool round trip of ~1.6 KB per
request for 40 turns). For the appended turns (2..40) it prints the process CPU per request
(`time.process_time`, so the client's and the upstream's share are included: compare modes and
commits, not against the gateway bench), the p50 of each request stage's wall time and, with
`--profile`, a cProfile of those turns (top functions by cumulative and own time). `--mode bare`
runs the bare aiohttp pass-through (`bench/bare_passthrough.py`) in the same harness: the
baseline the issue's ratios are against. Not a test.

With `--first`, every request is instead the first request of a new session (the gateway bench's
`first1` cell): the full ~600 KB body (history plus all 40 turns), distinct bytes each time (its
own id in the first message), `--sessions` of them after one unmeasured warm-up request; with
`--cold` every tool result differs as well (no message the process saw before).

`--interleave --lag L`: the odd half of the sessions runs L turns behind the even half (as the gateway
bench's two wrk threads once they drift apart); `--budget-mb N` sets `memory_budget_mb`.

`--workload small`: the gateway bench's 1 KB workload instead (every request a new one-turn
conversation, so every one writes a new session record), `--concurrency` requests in flight
(the SQLite writer then batches); CPU per request over all of them. `--store memory` puts the
records in memory instead of the default SQLite file: the difference is the store's CPU.

    .venv/bin/python bench/turn_cpu.py [--mode bare|observe|optimise] [--sessions 3] [--profile 40]
    .venv/bin/python bench/turn_cpu.py --first [--cold] [--mode bare|observe|optimise] [--sessions 20] [--profile 40]
    .venv/bin/python bench/turn_cpu.py --workload small [--requests 2000] [--concurrency 8] [--store memory]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import aiohttp
import orjson
import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bare_passthrough import make_app as bare_app  # noqa: E402
from fake_upstream import ANSWER  # noqa: E402
from gateway_bench import MARK, TURNS, _split, _turn, agent_body, small_request  # noqa: E402

from proxy.app import create_app  # noqa: E402
from proxy.appkeys import SERVICES  # noqa: E402
from proxy.cli import _tune_gc  # noqa: E402
from proxy.settings import Settings  # noqa: E402

HEADERS = {"x-api-key": "bench-key", "anthropic-version": "2023-06-01", "content-type": "application/json"}


def session_bodies(session: int) -> list[bytes]:
    """The bodies of one growing session, turn 1 .. TURNS (as `gateway.lua` builds them)."""
    head_a, head_b = _split(agent_body())
    ident = f"turncpu-{session}".encode()
    out = []
    tail = b""
    for k in range(1, TURNS + 1):
        tail += _turn(k)
        out.append(head_a + ident + head_b + tail + b"]}")
    return out


def interleaved(sessions: int, turns: int, is_distinct: bool = False, lag: int = 0) -> Iterator[tuple[int, bytes]]:
    """`(k, body)`: turn `k` (0-based) of each of `sessions` growing sessions, then turn `k + 1`
    of each (bodies as `session_bodies`, built one at a time: 32 sessions' would not fit).
    `is_distinct`: each session's tool results carry its own salt (as `--cold` salts them), so
    no two sessions share a message after the system prompt and tools (the gateway bench's
    sessions share their history: a new session's request reuses another's parsed messages).
    `lag`: the odd-numbered half of the sessions runs `lag` turns behind the even ones (as the
    gateway bench's second wrk thread when the two drift apart), their requests alternating."""
    head_a, head_b = _split(agent_body())
    pieces = [_turn(k) for k in range(1, turns + 1)]
    for step in range(turns + lag):
        for s in range(sessions):
            k = step - lag if s % 2 else step
            if not 0 <= k < turns:
                continue
            tail = b"".join(pieces[: k + 1])
            body = head_a + f"turncpu-{s}".encode() + head_b + tail + b"]}"
            if is_distinct:
                body = body.replace(b"line ", b"line%d " % s).replace(b"return x", b"return x%d" % s)
            yield k, body


def first_bodies(count: int, is_cold: bool = False) -> list[bytes]:
    """`count` full-length first requests of distinct sessions (as `gateway.lua` mode "first"):
    they differ in their first message only, so the rest of each is bytes the process saw in the
    previous one. `is_cold`: every tool result differs too (no message seen before)."""
    head_a, head_b = _split(agent_body())
    tail = b"".join(_turn(k) for k in range(1, TURNS + 1))
    bodies = [head_a + f"turncpu-first-{n}".encode() + head_b + tail + b"]}" for n in range(count)]
    if is_cold:  # `line 12\n` in the history's and `return x + 12` in the turns' tool results
        bodies = [
            b.replace(b"line ", b"line%d " % n).replace(b"return x", b"return x%d" % n) for n, b in enumerate(bodies)
        ]
    return bodies


async def _upstream(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _stage_totals(app: web.Application) -> dict[str, tuple[float, float]]:
    """Each request stage's `(observations, seconds)` so far (its histogram's count and sum)."""
    out = {}
    if SERVICES not in app:  # the bare pass-through has no stages
        return {}
    for name, timer in app[SERVICES].metrics.stage_timers.items():
        samples = {s.name: s.value for s in timer._samples()}
        out[name] = (samples.get("_count", 0.0), samples.get("_sum", 0.0))
    return out


def small_bodies(count: int) -> list[bytes]:
    """`count` distinct 1 KB first requests (as `gateway.lua` builds them in mode `first`)."""
    head_a, head_b = orjson.dumps(small_request()).split(MARK.encode())
    return [head_a + f"turncpu-{i}".encode() + head_b for i in range(count)]


async def small(args: argparse.Namespace, http: aiohttp.ClientSession, url: str) -> None:
    """The 1 KB workload: CPU per request over `args.requests` new conversations."""
    bodies = small_bodies(args.requests + 200)
    queue = iter(bodies)

    async def client() -> None:
        for body in queue:
            async with http.post(url + "/v1/messages", data=body, headers=HEADERS) as r:
                await r.read()
                assert r.status == 200, r.status

    warm, queue = iter(bodies[:200]), iter(bodies[200:])
    for body in warm:
        async with http.post(url + "/v1/messages", data=body, headers=HEADERS) as r:
            await r.read()
    profile = cProfile.Profile() if args.profile else None
    started, started_loop = time.process_time(), time.thread_time()
    if profile is not None:
        profile.enable()
    await asyncio.gather(*(client() for _ in range(args.concurrency)))
    if profile is not None:
        profile.disable()
    spent, spent_loop = time.process_time() - started, time.thread_time() - started_loop
    if args.store == "memory":
        print("store: memory:// (a friendlier set-up than users run: the default is SQLite)")
    print(
        f"mode {args.mode}, store {args.store}: {args.requests} 1 KB first requests at concurrency "
        f"{args.concurrency}, CPU per request {1000 * spent / args.requests:.3f} ms, the event loop's "
        f"thread {1000 * spent_loop / args.requests:.3f} ms (the rest: the store's threads)"
    )
    if profile is not None:
        report_profile(profile, args.profile, args.profile_out)


async def main(args: argparse.Namespace) -> None:
    upstream_app = web.Application(client_max_size=64 * 1024 * 1024)
    upstream_app.router.add_route("*", "/{tail:.*}", _upstream)
    up_runner, up_url = await _serve(upstream_app)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            mode="observe" if args.mode == "bare" else args.mode,
            upstream=up_url,
            state_dir=Path(tmp),
            store="memory://" if args.store == "memory" else f"sqlite://{tmp}/sessions.db",
            log_level="WARNING",
            memory_budget_mb=args.budget_mb,
        )
        app = bare_app(up_url) if args.mode == "bare" else create_app(settings, CollectorRegistry())
        runner, url = await _serve(app)
        if args.gc == "serve":
            _tune_gc()  # as `promptcache serve` does once it listens (the gateway bench's peers)
        if args.workload == "small":
            async with aiohttp.ClientSession() as http:
                await small(args, http, url)
            await runner.cleanup()
            await up_runner.cleanup()
            return
        if args.first:  # one session of `sessions + 1` distinct first requests; the first is warm-up
            sessions = [first_bodies(args.sessions + 1, args.cold)]
        elif args.interleave:
            sessions = []
        else:
            sessions = [session_bodies(s) for s in range(args.sessions)]
        cpu: list[float] = []
        loop_cpu: list[float] = []
        stage_ms: dict[str, list[float]] = {}
        before = _stage_totals(app)
        profile = cProfile.Profile() if args.profile else None
        order: Iterable[tuple[int, bytes]]
        if args.interleave:  # turn k of every session before turn k + 1 of any (as wrk's round robin)
            order = interleaved(args.sessions, args.turns, args.distinct, args.lag)
        else:
            cut = None if args.first else args.turns
            order = [(k, body) for bodies in sessions for k, body in enumerate(bodies[:cut])]
        async with aiohttp.ClientSession() as http:
            for k, body in order:
                is_measured = k > 0
                if profile is not None and is_measured:
                    profile.enable()
                started = time.process_time()
                started_loop = time.thread_time()
                async with http.post(url + "/v1/messages", data=body, headers=HEADERS) as r:
                    await r.read()
                    assert r.status == 200, r.status
                spent = time.process_time() - started
                spent_loop = time.thread_time() - started_loop
                if profile is not None and is_measured:
                    profile.disable()
                if is_measured:
                    cpu.append(spent)
                    loop_cpu.append(spent_loop)
                    after = _stage_totals(app)
                    for name, (n, total) in after.items():
                        n0, total0 = before.get(name, (0.0, 0.0))
                        if n > n0:
                            stage_ms.setdefault(name, []).append(1000 * (total - total0))
                before = _stage_totals(app)
        await runner.cleanup()
    await up_runner.cleanup()
    what = "first requests" if args.first else "appended turns"
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.store == "memory":
        print("store: memory:// (a friendlier set-up than users run: the default is SQLite)")
    print(
        f"mode {args.mode}: {len(cpu)} {what}, CPU per request p50 {1000 * statistics.median(cpu):.2f} ms, "
        f"mean {1000 * statistics.fmean(cpu):.2f} ms; the event loop's thread p50 "
        f"{1000 * statistics.median(loop_cpu):.2f} ms (the rest: the store's writer thread)"
    )
    print(
        f"stage wall ms per {what[:-1]}, p50: "
        + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in stage_ms.items())
    )
    if profile is not None:
        report_profile(profile, args.profile, args.profile_out)


def report_profile(profile: cProfile.Profile, rows: int, out: str | None) -> None:
    """Print the top `rows` functions by cumulative and by own time; the raw stats to `out`."""
    if out:
        profile.dump_stats(out)
    stats = pstats.Stats(profile).strip_dirs()
    stats.sort_stats("cumulative").print_stats(rows)
    stats.sort_stats("tottime").print_stats(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("bare", "observe", "optimise"), default="observe")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--first", action="store_true", help="first requests of new sessions (600 KB each)")
    parser.add_argument("--cold", action="store_true", help="with --first: no message seen before")
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="send the sessions' turns round robin (turn k of each, then turn k + 1): with --sessions 32 "
        "the recent bodies the process keeps parsed no longer hold the previous turn (the grow32 cell)",
    )
    parser.add_argument("--distinct", action="store_true", help="with --interleave: no message shared between sessions")
    parser.add_argument(
        "--lag", type=int, default=0, help="with --interleave: the odd sessions run this many turns behind"
    )
    parser.add_argument("--budget-mb", type=int, default=16, help="memory_budget_mb (default 16, the default's)")
    parser.add_argument("--turns", type=int, default=TURNS, help=f"turns per session (default {TURNS})")
    parser.add_argument("--profile", type=int, default=0, help="print this many profile rows")
    parser.add_argument("--workload", choices=("grow", "small"), default="grow")
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    parser.add_argument("--requests", type=int, default=2000, help="1 KB requests (--workload small)")
    parser.add_argument("--concurrency", type=int, default=8, help="1 KB requests in flight")
    parser.add_argument(
        "--gc",
        choices=("serve", "default"),
        default="serve",
        help="the cyclic collector as `promptcache serve` tunes it (default) or Python's defaults",
    )
    parser.add_argument("--profile-out", help="also write the cProfile stats to this file (pstats)")
    uvloop.run(main(parser.parse_args()))
