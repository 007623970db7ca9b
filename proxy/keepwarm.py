"""Keep-warm: ping the upstream shortly before a 5-minute entry expires while a person is
likely to come back (docs/provider-rules.md 9). Off unless `keep_warm` is `on` or a cap.

Contract:
- `arm(exchange, services, base_url)` after a 2xx pipeline response (`optimise` mode only) that
  ended the turn (`Usage.turn` `human`) or called a tool (`tool`: a tool call unanswered for
  minutes waits on a person, a permission prompt or a long command) and whose last marker is 5m, on a session, not a
  subagent, not a signed request: opens the session's **window**, holding in memory only the
  URL, the headers as sent upstream (the credential among them) and the body as sent, cut
  after its last marker (`ProviderAdapter.prefix_request`: the same prefix bytes, nothing
  uncached after them; the whole body where the adapter cannot cut), with `max_tokens: 1` and
  without `stream` (neither field is part of the cached prefix). The entry lives from the
  request's start (docs/provider-rules.md 1.7), so the first ping is due `MARGIN` seconds before 5
  minutes after it.
- `fire_due(now)` sends every due ping, one at a time: a ping goes out only if the window has
  not ended (an hour after the last real request: then it is dropped with its credential),
  the tenant's breaker is closed, the expected cost fits the cap (USD spent by the tenant's
  pings in the current clock hour), no newer request of the session was recorded in the store
  (another replica served it: only the replica that served the last request pings), and it
  pays: the chance that the person comes back within the next 5 minutes, given they have not
  yet (`return_chance`: the tenant's human gaps, the prior of `proxy.pacing` below
  `MIN_SAMPLES`, and the chance they come back at all, `Pacing.return_share`; after a tool
  call the held tool gaps and the chance it is not abandoned, `silence_model`), times the
  re-write it saves (1.25 - 0.1 per token of the part no 1h entry keeps: all of it without
  a 1h marker, else what the request wrote at 5m) exceeds the ping's read (0.1 per prompt
  token). A window that would not pay its first ping is not opened. A ping that fails (any error or
  non-2xx) drops the window and opens the tenant's breaker for `BREAKER_SECONDS`. Each ping
  reschedules itself `TTL - MARGIN` later (a read refreshes the entry).
- `cancel(tenant, session, now)` when the session's next real request starts: the window goes
  (with its credential); `True` when a ping kept the entry alive past its first expiry, so the
  request's read is one the pings saved (`promptcache_keepwarm_saved_read_tokens_total`).
- Time comes from an injectable clock; `run()` is the live loop (sleeps until the next due
  ping, woken when a window opens); tests and `promptcache replay --keep-warm` call
  `fire_due` themselves on their own clock and never start it.
Metrics: pings sent by outcome, their cost in USD, reads they saved (tokens).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson

from proxy.exchange import Exchange
from proxy.forward import request_headers
from proxy.pacing import FIVE_MINUTES, ONE_HOUR, READ, RETURN_WEIGHT, TOOL_PRIOR, WRITE_5M, Pacing
from proxy.pricing import PricingTable, default_pricing
from proxy.providers.base import HUMAN, TOOL, Usage

_log = logging.getLogger("promptcache.keepwarm")

MARGIN: Final = 30.0
"""Seconds before expiry a ping is due."""
BREAKER_SECONDS: Final = 3600.0
MIN_SAMPLES: Final = 3
"""Human gaps longer than the time waited needed before they replace the prior's hazard."""
PRIOR_MEDIAN, PRIOR_SIGMA = 240.0, 1.65
"""The prior human gap (lognormal, `proxy.pacing.HUMAN_PRIOR`)."""
PING_TIMEOUT: Final = 60.0
MAX_WINDOWS: Final = 10_000
ABANDON_PRIOR: Final = 0.015
"""Chance that a tool call's result never comes (the conversation abandoned mid-loop): about
15% of conversations abandoned mid-loop over ~10 tool calls each (the realistic workloads)."""


def parse_setting(value: str) -> tuple[bool, float | None]:
    """`(enabled, cap in USD per tenant per hour or None)` of the `keep_warm` setting."""
    if value == "off":
        return False, None
    if value == "on":
        return True, None
    return True, float(value)


def _lognormal_survival(seconds: float) -> float:
    if seconds <= 0:
        return 1.0
    z = math.log(seconds / PRIOR_MEDIAN) / PRIOR_SIGMA
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def return_chance(
    gaps: tuple[float, ...], waited: float, horizon: float = FIVE_MINUTES, returning: float = 1.0
) -> float:
    """Chance that a person who has been away `waited` seconds comes back within `horizon`
    more. `returning` is the chance they come back at all (`Pacing.return_share`); the gap of
    those who do follows the observed human gaps when `MIN_SAMPLES` of them are longer than
    `waited`, else the prior lognormal. With S the survival of that gap:
    `returning * (S(waited) - S(waited + horizon)) / (returning * S(waited) + 1 - returning)`
    (the longer the silence, the likelier it is one that never ends)."""
    longer = [g for g in gaps if g > waited]
    if len(longer) >= MIN_SAMPLES:
        alive = len(longer) / len(gaps)
        back = sum(1 for g in longer if g <= waited + horizon) / len(gaps)
    else:
        alive = _lognormal_survival(waited)
        back = alive - _lognormal_survival(waited + horizon)
    still = returning * alive + 1.0 - returning
    return returning * back / still if still > 0 else 0.0


def ping_pays(gaps: tuple[float, ...], waited: float, share: float = 1.0, returning: float = 1.0) -> bool:
    """The saving (a re-write avoided, 1.25 - 0.1 per token, on the `share` of the prompt no
    1h entry keeps) times the chance beats the read of the whole prompt (0.1 per token)."""
    return return_chance(gaps, waited, returning=returning) * (WRITE_5M - READ) * share > READ


def silence_model(pacing: Pacing, turn: str | None) -> tuple[tuple[float, ...], float]:
    """`(gaps, returning)` for `return_chance` after a response of `turn` (a tenant's `Pacing`).

    After a turn-ending response: the human gaps and `Pacing.return_share`. After a tool call
    the machine answers in seconds, so a call still open after minutes is either held by a
    person (a permission prompt, a command they watch) or abandoned: the gaps are the tool gaps
    of 5 minutes or more (held calls; the human prior below `MIN_SAMPLES`), and `returning` is
    `q / (q + ABANDON_PRIOR)` with `q` the share of tool gaps held that long,
    `(held + 0.02 * RETURN_WEIGHT) / (tool gaps + RETURN_WEIGHT)` (prior `TOOL_PRIOR`'s 2%).
    A new tenant: `returning` = 0.02 / 0.035 = 0.571, one ping at 4.5 minutes pays; a tenant
    whose tool results all came within seconds stops paying for them."""
    if turn != TOOL:
        return pacing.human, pacing.return_share
    held = tuple(g for g in pacing.tool if g >= FIVE_MINUTES)
    q = (len(held) + TOOL_PRIOR[1] * RETURN_WEIGHT) / (len(pacing.tool) + RETURN_WEIGHT)
    return held, q / (q + ABANDON_PRIOR)


@dataclass(slots=True)
class Window:
    """One session's keep-warm window (credential in memory only)."""

    tenant: str
    session: str
    provider: str
    model: str
    url: str
    headers: dict[str, str]
    body: bytes
    arrival: float
    """Start of the last real request (the entry's write or read)."""
    due: float
    prompt_tokens: int
    adapter: Any
    """The request's API adapter (it reads the ping's usage)."""
    share: float = 1.0
    """Part of the prompt only the 5m entry holds (the rest is under a 1h anchor that lives on)."""
    turn: str = HUMAN
    """What the response asked for: `human` (it ended the turn) or `tool` (a tool call)."""
    pings: int = 0
    warm_until: float = 0.0


@dataclass(slots=True)
class KeepWarm:
    """The keep-warm windows of one process (module docstring)."""

    enabled: bool
    cap: float | None
    metrics: Any
    clock: Callable[[], float]
    sessions: Mapping[str, aiohttp.ClientSession]
    """Provider -> the pooled upstream `ClientSession`."""
    store: Any = None
    pacing: Callable[[str], Pacing] | None = None
    """Tenant -> its `Pacing` (human gaps)."""
    pricing: PricingTable = field(default_factory=default_pricing)
    """Prices of the pings (`Services.pricing`)."""
    windows: dict[tuple[str, str], Window] = field(default_factory=dict)
    spent: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Tenant -> `(clock hour, USD spent by pings in it)`."""
    breaker: dict[str, float] = field(default_factory=dict)
    """Tenant -> clock second until which no ping is sent."""
    sent: list[tuple[str, float, Usage]] = field(default_factory=list)
    """`(session, clock second, usage)` of the last pings sent (bounded): tests, replay."""
    _wake: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None
    """The live loop (`run`), when the app started one."""

    def stop_loop(self) -> None:
        """Stop the live loop: the caller drives `fire_due` on its own clock from now on."""
        if self.task is not None:
            self.task.cancel()
            self.task = None
        self._wake = None

    def arm(self, exchange: Exchange, services: Any, base_url: str) -> bool:
        """Open (or replace) the session's window after this response (module docstring)."""
        usage = exchange.usage
        plan = exchange.plan
        if not self.enabled or services.settings.mode != "optimise" or exchange.is_signed:
            return False
        if usage is None or usage.turn not in (HUMAN, TOOL) or not 200 <= exchange.status < 300:
            return False
        if exchange.tenant is None or exchange.session_id is None or exchange.outgoing is None:
            return False
        if any(k.lower() == "x-claude-code-agent-id" for k in exchange.headers):
            return False
        markers = getattr(plan, "markers", ())
        if not markers or markers[-1].ttl != "5m":
            return False
        arrivals = exchange.arrivals
        if not arrivals:
            return False
        try:
            sent = orjson.loads(exchange.outgoing)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(sent, dict):
            return False
        cut = exchange.adapter.prefix_request(sent, markers[-1].index)
        body = dict(cut if cut is not None else sent)
        prefix = usage.cache_read + usage.cache_write if cut is not None else usage.prompt_total
        share = 1.0
        if any(m.ttl == "1h" for m in markers) and prefix:
            share = min(1.0, usage.cache_write_5m / prefix)  # a 1h entry keeps the rest
        pacing = self.pacing(exchange.tenant) if self.pacing else Pacing()
        gaps, returning = silence_model(pacing, usage.turn)
        if not ping_pays(gaps, FIVE_MINUTES - MARGIN, share, returning):
            return False
        body["max_tokens"] = 1
        body.pop("stream", None)
        body.pop("stream_options", None)
        headers = dict(request_headers(exchange.headers))
        for key, value in exchange.header_overrides.items():
            headers.pop(key, None)
            if value is not None:
                headers[key] = value
        arrival = float(arrivals[-1])
        window_key = (exchange.tenant, exchange.session_id)
        if window_key not in self.windows and len(self.windows) >= MAX_WINDOWS:
            return False
        self.windows[window_key] = Window(
            exchange.tenant,
            exchange.session_id,
            exchange.provider,
            str(body.get("model", "")),
            base_url + (exchange.upstream_path or exchange.path),
            headers,
            orjson.dumps(body),
            arrival,
            arrival + FIVE_MINUTES - MARGIN,
            prefix,
            exchange.adapter,
            share,
            usage.turn,
        )
        if self._wake is not None:
            self._wake.set()
        return True

    def cancel(self, tenant: str, session: str, now: float) -> bool:
        """Drop the session's window (its next real request started); `True` when pings kept
        its entry alive past the first expiry."""
        window = self.windows.pop((tenant, session), None)
        return window is not None and window.pings > 0 and now >= window.arrival + FIVE_MINUTES

    def next_due(self) -> float | None:
        return min((w.due for w in self.windows.values()), default=None)

    async def fire_due(self, now: float) -> int:
        """Send every ping due at `now` (module docstring); returns how many were sent."""
        sent = 0
        for key, window in sorted(self.windows.items(), key=lambda kv: kv[1].due):
            if window.due > now or self.windows.get(key) is not window:
                continue
            if await self._ping(window, now):
                sent += 1
        return sent

    def _drop(self, window: Window) -> None:
        if self.windows.get((window.tenant, window.session)) is window:
            del self.windows[(window.tenant, window.session)]
        window.headers.clear()  # the credential goes with the window

    def _expected_cost(self, window: Window) -> float:
        prices = self.pricing.prices(window.provider, window.model)
        if prices is None:
            return 0.0
        return prices.cost(Usage(cache_read=window.prompt_tokens, output=1))

    async def _ping(self, window: Window, now: float) -> bool:
        tenant = window.tenant
        pacing = self.pacing(tenant) if self.pacing is not None else Pacing()
        hour = int(now // ONE_HOUR)
        spent_hour, spent = self.spent.get(tenant, (hour, 0.0))
        if spent_hour != hour:
            spent = 0.0
        cost = self._expected_cost(window)
        gaps, returning = silence_model(pacing, window.turn)
        if (
            now >= window.arrival + ONE_HOUR
            or self.breaker.get(tenant, 0.0) > now
            or (self.cap is not None and spent + cost > self.cap)
            or not ping_pays(gaps, now - window.arrival, window.share, returning)
            or await self._served_elsewhere(window)
        ):
            self._drop(window)
            return False
        pm = self.metrics.by_provider[window.provider]
        try:
            async with self.sessions[window.provider].post(
                window.url, data=window.body, headers=window.headers, timeout=aiohttp.ClientTimeout(total=PING_TIMEOUT)
            ) as response:
                data = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            status, data = 0, b""
            _log.warning("keep-warm ping failed (%s): breaker open for the tenant", type(exc).__name__)
        if not 200 <= status < 300:
            pm.keepwarm_pings["error"].inc()
            self.breaker[tenant] = now + BREAKER_SECONDS
            self._drop(window)
            return False
        reader = window.adapter.usage_reader()
        try:
            reader.feed_json(orjson.loads(data))
        except orjson.JSONDecodeError:
            pass
        usage = reader.result()
        prices = self.pricing.prices(window.provider, window.model)
        paid = prices.cost(usage) if prices is not None else 0.0
        self.spent[tenant] = (hour, spent + paid)
        pm.keepwarm_pings["ok"].inc()
        pm.keepwarm_cost.inc(paid)
        window.pings += 1
        window.warm_until = now + FIVE_MINUTES
        window.due = now + FIVE_MINUTES - MARGIN
        self.sent.append((window.session, now, usage))
        del self.sent[:-256]
        return True

    async def _served_elsewhere(self, window: Window) -> bool:
        """A newer request of the session recorded in the store (another replica served it)."""
        if self.store is None:
            return False
        record = await self.store.load(window.tenant, window.session)
        return record is not None and bool(record.arrivals) and record.arrivals[-1] > window.arrival + 1e-6

    async def run(self) -> None:
        """The live loop: sleep until the next due ping (woken when a window opens), fire it."""
        self._wake = asyncio.Event()
        while True:
            due = self.next_due()
            now = self.clock()
            if due is not None and due <= now:
                await self.fire_due(now)
                continue
            self._wake.clear()
            timeout = None if due is None else due - now
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
