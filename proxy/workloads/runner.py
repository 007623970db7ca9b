"""The replay engine: run traces under each strategy against the simulator and tally usage.

Contract (`replay_traces`):
- The upstream is the promptcache simulator: started in-process with a manual clock
  (`upstream="sim"`), or an already running one at a URL (it must run `--clock manual`).
- Per trace and strategy, in that order: the simulator's cache is flushed (`DELETE
  /_sim/cache`, which also clears OpenAI routing windows), then each request is sent after
  moving the simulator's clock by the request's `gap` (`POST /_sim/clock`), one at a time, each
  response read to the end. Strategies never share entries: the cache is flushed between them
  and each uses its own API key (`sk-replay-<strategy>`, so its own tenant).
- `promptcache` runs through a fresh proxy per trace (`memory://` store) in front of the same
  simulator; its session clock follows the trace's time (the simulator's epoch plus the gaps),
  so pacing-based TTL choices see the gaps the simulator sees.
- Each request is answered as the recorded model answered it: a tool call where the
  conversation's next request carries one (`replies.py`), else text.
- `tenant_history` (`--tenant-history`): before the measured `promptcache` run, its proxy sees
  the trace once as an earlier conversation of the same tenant (`trace.earlier_conversation`),
  uncounted; a day passes and the simulator's cache is flushed before the measured run.
- `keep_warm` (`--keep-warm`): promptcache's proxy runs with `keep_warm: on`; its pings are
  sent on the trace clock (the clocks move to each ping's due time on the way to the next
  request), their input cost is added to the strategy's cost and listed per trace.
- Usage is read from each response (`usage.py`), priced with `proxy.pricing`, and tallied
  (`report.py`); the optimum comes from `oracle.py`, computed before the trace runs.
- Each 2xx request gets its divergence cause (`divergence.py`): for `promptcache` the cause the
  proxy counted in its `promptcache_prefix_divergences_total` (read after the response, once
  the counter moved: the proxy measures right after the last byte, `MEASURE_WAIT_S` at most);
  for `none` / `naive` the same pure core applied to the body the strategy sent.
Nothing is retried; a non-2xx answer is recorded as an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, TextIO

import aiohttp
import orjson
from prometheus_client import CollectorRegistry

from proxy.pricing import PricingTable, default_pricing
from proxy.providers.base import Usage
from proxy.rules import RuleSet, load_rules
from proxy.settings import Settings
from proxy.sim.clock import MANUAL_START, Clock
from proxy.sim.config import SimConfig
from proxy.sim.tokens import TokenCounter, load_o200k
from proxy.workloads.causes import CauseTracker, cause_counts, new_cause
from proxy.workloads.oracle import optimum
from proxy.workloads.replies import reply_headers
from proxy.workloads.report import KeepWarmTally, Report, RequestOutcome, Tally, TraceResult
from proxy.workloads.strategies import upstream_body
from proxy.workloads.trace import Trace, TraceRequest, earlier_conversation
from proxy.workloads.usage import read_usage

ANTHROPIC_VERSION: Final = "2023-06-01"
TIMEOUT: Final = aiohttp.ClientTimeout(total=600)
DAY: Final = 86400.0
MEASURE_WAIT_S: Final = 1.0
"""Longest wait (seconds) for the proxy's measurement of a request after its response."""


class TraceClock:
    """Trace time on the simulator's epoch (seconds); what the proxy's sessions see as now."""

    def __init__(self, start: float) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


class Progress:
    """A one-line text progress bar on a stream (a finished line per run when not a TTY)."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.is_tty = enabled and self.stream.isatty()
        self.label = ""
        self.total = 0

    def start(self, label: str, total: int) -> None:
        self.label, self.total = label, total
        self.step(0)

    def step(self, done: int) -> None:
        if self.is_tty:
            filled = 24 * done // max(1, self.total)
            bar = "#" * filled + "." * (24 - filled)
            self.stream.write(f"\r{self.label:<40} [{bar}] {done}/{self.total}")
            self.stream.flush()

    def finish(self, note: str = "") -> None:
        if self.is_tty:
            self.stream.write(f"\r{self.label:<40} [{'#' * 24}] {self.total}/{self.total} {note}\n")
        elif self.enabled:
            self.stream.write(f"{self.label:<40} {self.total} requests {note}\n")
        self.stream.flush()


def _headers(request: TraceRequest, key: str, reply: dict[str, str] | None = None) -> dict[str, str]:
    headers = {"content-type": "application/json", **request.headers, **(reply or {})}
    if request.provider == "anthropic":
        headers["x-api-key"] = key
        headers["anthropic-version"] = ANTHROPIC_VERSION
    else:
        headers["authorization"] = f"Bearer {key}"
    return headers


def _cost(pricing: PricingTable, request: TraceRequest, usage: Usage) -> tuple[float, float]:
    prices = pricing.prices(request.provider, str(request.body.get("model", "")))
    if prices is None:
        return 0.0, 0.0
    inputs = Usage(usage.input_none, usage.cache_read, usage.cache_write_5m, usage.cache_write_1h, 0, True)
    return prices.cost(inputs), prices.uncached_cost(inputs)


async def _send(
    http: aiohttp.ClientSession,
    base: str,
    strategy: str,
    request: TraceRequest,
    pricing: PricingTable,
    client_tokens: int,
    causes: CauseTracker | None = None,
    reply: dict[str, str] | None = None,
) -> RequestOutcome:
    """Send one request; `causes` (strategies without a proxy) names its divergence cause;
    `reply` headers make the simulator answer as the recorded model did (`replies.py`)."""
    body = upstream_body(strategy, request.path, request.body)
    headers = _headers(request, f"sk-replay-{strategy}", reply)
    async with http.post(base + request.path, data=orjson.dumps(body), headers=headers) as response:
        data = await response.read()
        status = response.status
        content_type = response.headers.get("content-type", "")
    if not 200 <= status < 300:
        usage = Usage(input_none=client_tokens, seen=True)
        cost, uncached = _cost(pricing, request, usage)
        return RequestOutcome(
            status, 0, 0, 0, client_tokens, cost, uncached, data[:300].decode("utf-8", "replace")
        )
    usage = read_usage(request.path, content_type, data)
    cost, uncached = _cost(pricing, request, usage)
    error = "" if usage.seen else "no usage in the response"
    outcome = RequestOutcome(
        status,
        usage.cache_read,
        usage.cache_write_5m,
        usage.cache_write_1h,
        usage.input_none,
        cost,
        uncached,
        error,
        has_usage=usage.seen,
    )
    if causes is not None:
        outcome.cause = causes.cause(request.path, request.headers, body, usage if usage.seen else None)
    return outcome


async def _admin(http: aiohttp.ClientSession, method: str, url: str, payload: Any = None) -> Any:
    async with http.request(method, url, json=payload) as response:
        data = await response.read()
        if response.status != 200:
            raise RuntimeError(
                f"{method} {url}: {response.status} {data[:200].decode('utf-8', 'replace')} "
                "(the upstream must be a promptcache simulator with --clock manual)"
            )
        return orjson.loads(data) if data else None


async def _measured_cause(registry: CollectorRegistry, before: Counter[str]) -> str | None:
    """The cause the proxy counted for its latest request: waits (`MEASURE_WAIT_S` at most) until
    the counter holds one request more than `before`, then moves `before` up to the reading."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + MEASURE_WAIT_S
    wanted = sum(before.values()) + 1
    after = cause_counts(registry)
    while sum(after.values()) < wanted and loop.time() < deadline:
        await asyncio.sleep(0.001)
        after = cause_counts(registry)
    cause = new_cause(before, after)
    before.clear()
    before.update(after)
    return cause


@contextlib.asynccontextmanager
async def _proxy(
    upstream: str, clock: TraceClock, keep_warm: bool = False
) -> AsyncIterator[tuple[str, CollectorRegistry, Any]]:
    from proxy.app import start_proxy
    from proxy.appkeys import SERVICES
    from proxy.settings import Settings

    registry = CollectorRegistry()
    settings = Settings(upstream=upstream, store="memory://", port=0, keep_warm="on" if keep_warm else "off")
    runner, url = await start_proxy(settings, registry)
    try:
        services = runner.app[SERVICES]
        sessions = services.sessions
        if sessions is not None:
            sessions.clock = clock.now
        if services.keep_warm is not None:
            services.keep_warm.stop_loop()  # pings play on the trace clock (`_advance`)
        yield url, registry, services.keep_warm
    finally:
        await runner.cleanup()


def _stage_errors(registry: CollectorRegistry) -> int:
    total = 0.0
    for metric in registry.collect():
        if metric.name == "promptcache_stage_errors":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return int(total)


async def _run_strategy(
    http: aiohttp.ClientSession,
    sim_url: str,
    clock: TraceClock,
    trace: Trace,
    strategy: str,
    totals: list[int],
    pricing: PricingTable,
    progress: Progress,
    rules: RuleSet | None,
    tenant_history: bool = False,
    warm: bool = False,
) -> tuple[Tally, list[RequestOutcome], int, KeepWarmTally | None]:
    await _admin(http, "DELETE", f"{sim_url}/_sim/cache")
    keep_warm: Any = None
    stack = contextlib.AsyncExitStack()
    async with stack:
        target, registry = sim_url, None
        tracker: CauseTracker | None = CauseTracker(rules, Settings().session_headers)
        if strategy == "promptcache":
            target, registry, keep_warm = await stack.enter_async_context(_proxy(sim_url, clock, warm))
            tracker = None
            if tenant_history:
                await _earlier(http, sim_url, target, clock, trace, strategy, totals, pricing)
        counted: Counter[str] = Counter()
        replies = reply_headers(trace)
        tally = Tally()
        outcomes = []
        progress.start(f"{trace.name} {strategy}", len(trace.requests))
        pinged = 0
        if keep_warm is not None:
            keep_warm.sent.clear()
        for i, request in enumerate(trace.requests):
            if request.gap:
                await _advance(http, sim_url, clock, request.gap, keep_warm)
            outcome = await _send(http, target, strategy, request, pricing, totals[i], tracker, replies[i])
            if registry is not None and outcome.status < 300:
                outcome.cause = await _measured_cause(registry, counted)
            outcomes.append(outcome)
            tally.add(
                Tally(
                    1,
                    1 if outcome.status >= 300 else 0,
                    outcome.read,
                    outcome.write_5m,
                    outcome.write_1h,
                    outcome.none,
                    outcome.cost,
                    outcome.uncached_cost,
                    {outcome.cause: 1} if outcome.cause is not None else {},
                    0 if outcome.has_usage else 1,
                )
            )
            progress.step(i + 1)
        stage_errors = _stage_errors(registry) if registry is not None else 0
        warm_tally = None
        if keep_warm is not None:
            warm_tally = KeepWarmTally()
            for _, _, usage in keep_warm.sent[pinged:]:
                cost, uncached = _cost(pricing, trace.requests[0], usage)
                warm_tally.pings += 1
                warm_tally.read += usage.cache_read
                warm_tally.cost += cost
                tally.cost += cost
                tally.uncached_cost += uncached
    progress.finish(f"hit {tally.hit_ratio:.1%}" + (f", {tally.errors} errors" if tally.errors else ""))
    return tally, outcomes, stage_errors, warm_tally


async def _advance(
    http: aiohttp.ClientSession, sim_url: str, clock: TraceClock, seconds: float, keep_warm: Any
) -> None:
    """Move the simulator's clock and the trace clock on by `seconds`, sending each keep-warm
    ping (`--keep-warm`) at its due time on the way."""
    end = clock.now() + seconds
    while keep_warm is not None and (due := keep_warm.next_due()) is not None and due <= end:
        step = max(0.0, due - clock.now())
        if step:
            await _admin(http, "POST", f"{sim_url}/_sim/clock", {"advance": step})
            clock.advance(step)
        await keep_warm.fire_due(clock.now())
    rest = end - clock.now()
    if rest > 0:
        await _admin(http, "POST", f"{sim_url}/_sim/clock", {"advance": rest})
        clock.advance(rest)


async def _earlier(
    http: aiohttp.ClientSession,
    sim_url: str,
    target: str,
    clock: TraceClock,
    trace: Trace,
    strategy: str,
    totals: list[int],
    pricing: PricingTable,
) -> None:
    """The trace once more as an earlier conversation of the same tenant (`--tenant-history`),
    through the same proxy, uncounted; then a day passes and the simulator's cache is flushed,
    so the measured run gains only what the proxy learned about the tenant."""
    earlier = earlier_conversation(trace)
    replies = reply_headers(earlier)
    for i, request in enumerate(earlier.requests):
        if request.gap:
            await _admin(http, "POST", f"{sim_url}/_sim/clock", {"advance": request.gap})
            clock.advance(request.gap)
        await _send(http, target, strategy, request, pricing, totals[i], None, replies[i])
    await _admin(http, "POST", f"{sim_url}/_sim/clock", {"advance": DAY})
    clock.advance(DAY)
    await _admin(http, "DELETE", f"{sim_url}/_sim/cache")


def _default_rules() -> RuleSet | None:
    """The rules a proxy with default settings loads (volatile patterns, model minimums)."""
    try:
        return load_rules(Settings().rules_dir)
    except (ValueError, OSError):
        return None


async def replay_traces(
    traces: Sequence[Trace],
    strategies: Sequence[str],
    upstream: str = "sim",
    progress: Progress | None = None,
    tenant_history: bool = False,
    keep_warm: bool = False,
) -> Report:
    """Replay every trace under every strategy (module docstring); returns the report.
    `tenant_history`: promptcache's proxy first sees the trace as an earlier conversation of
    the same tenant (`_earlier`), as a user with one conversation behind them."""
    progress = progress if progress is not None else Progress(enabled=False)
    config = await asyncio.to_thread(SimConfig.load)
    counter = TokenCounter(await asyncio.to_thread(load_o200k))
    pricing = await asyncio.to_thread(default_pricing)
    rules = await asyncio.to_thread(_default_rules)
    report = Report()
    async with contextlib.AsyncExitStack() as stack:
        if upstream == "sim":
            from proxy.sim.app import start_sim

            runner, sim_url = await start_sim(
                "127.0.0.1", 0, config=config, clock=Clock.manual_at(MANUAL_START)
            )
            stack.push_async_callback(runner.cleanup)
        else:
            sim_url = upstream.rstrip("/")
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=TIMEOUT))
        now = await _admin(http, "GET", f"{sim_url}/_sim/clock")
        clock = TraceClock(float(now["now"]))
        for trace in traces:
            best = await asyncio.to_thread(optimum, trace, config, counter, pricing)
            totals = [b.total for b in best.requests]
            result = TraceResult(trace.name, len(trace.requests), best.read, best.total, best.limit_binding)
            result.optimum_reads = [b.read for b in best.requests]
            result.client_totals = totals
            result.causal_read = best.causal_read
            result.min_cost = best.min_cost
            for strategy in strategies:
                tally, outcomes, stage_errors, warm = await _run_strategy(
                    http, sim_url, clock, trace, strategy, totals, pricing, progress, rules, tenant_history, keep_warm
                )
                if warm is not None:
                    result.keep_warm[strategy] = warm
                result.tallies[strategy] = tally
                result.outcomes[strategy] = outcomes
                result.stage_errors += stage_errors
            report.traces.append(result)
    return report
