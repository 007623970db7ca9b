"""The optimum: clairvoyant bounds on what any proxy can get for a trace, and causal ones beside.

The simulator is the judge, so the oracle renders requests and counts tokens with the
simulator's own code (`proxy.sim.anthropic.parse_request`, `proxy.sim.openai.render_*`, the
`Router`, the per-model table in `rules/simulator.yaml`) and never with the proxy's pipeline.
Its assumptions come from outside any caching policy: it knows every arrival of the trace.

For every request it computes bounds on two forms (`stable.py`): the client's body without
markers (**raw**) and the **stable** form, each replayed in its own empty cache with the
trace's gaps; the request's bound is the better of the two. `total` is the raw form's prompt
tokens (what the client's request costs uncached).

**Clairvoyant read bound** (`Bound.read`, what attainment is measured against). Anthropic: every
block is a breakpoint (the 4-marker limit and the 20-position lookback relaxed, which can only
add reads), each with a 1-hour TTL where the block's next read is 5-60 minutes away and 5
minutes where it is sooner (the same reads as 1 hour everywhere: a read refreshes the entry).
So a block's tokens are read whenever the same block (same model, same cumulative prefix, same
params fingerprint) was sent less than an hour before and its cumulative prefix reaches the
model's `min_cache_tokens`. `markers_needed` counts the markers such a plan really uses (the
positions later reads use, one marker serving a read up to 20 lookback positions before it);
above 4 the bound may not be attainable (`limit_binding`). OpenAI before GPT-5.6 (automatic
caching): the simulator's own accounting (128-token steps, routing by the first tokens and
`prompt_cache_key`, overflow above 15 requests/minute, idle retention), the best of three
routing keys per request: the client's `prompt_cache_key` (or none), one key per session, one
key for the whole trace. GPT-5.6+: a breakpoint on every content part of user / system /
developer / tool messages and every user / tool message end, no 4-write limit, every live
candidate refreshed (TTL from `prompt_cache_options.ttl`, default 30 min), the same three keys.

**Clairvoyant minimum cost** (`Bound.min_cost`, USD, input side). Anthropic: the cheapest plan
under the same relaxation, solved exactly block by block: a block accessed at times
`a_1 < a_2 < ...` is at each access read (`cache_read` price, only while an entry is live: a 5m
one written less than 5 minutes before, or a 1h one, or any entry read less than an hour
before, since a read with a 1h marker refreshes it to an hour at the read price, as the
simulator bills it), written with 5m (`cache_write_5m`, live 5 minutes), written with 1h
(`cache_write_1h`, live an hour) or sent uncached (`input`); a dynamic programme over the three
states (no entry, 5m entry, 1h entry) gives each block's cheapest sequence. A real plan's
charges are one such sequence per block (a token is read only below a live entry that was
written or read when the block was last sent), so the sum is a lower bound on any plan's cost;
the 1h-before-5m rule is relaxed too. It never writes what is not read. OpenAI: reads of the
read bound at the read price, every other token at the input price (writes free: a lower bound).
`plan` holds the minimum plan's tokens by kind (read, 5m written, 1h written, uncached).

**Causal read bound** (`Bound.causal_read`, printed beside, never used for attainment): the
previous yardstick, what a policy could know when each request starts: Anthropic TTLs of 1
hour once a gap longer than 5 minutes has been observed (in the trace or the request's
session) or when the client asks for 1h, else 5 minutes (`causal_ttls`); OpenAI with the
client's `prompt_cache_key`.

Requests run one after another: each response has begun before the next request starts.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import xxhash

from proxy.pricing import PricingTable, default_pricing
from proxy.sim import anthropic as sim_anthropic
from proxy.sim import openai as sim_openai
from proxy.sim.cache import CacheStore
from proxy.sim.config import SimConfig
from proxy.sim.tokens import TokenCounter
from proxy.workloads.stable import session_of, stable_forms
from proxy.workloads.trace import Trace, TraceRequest

ONE_HOUR: Final = 3600.0
FIVE_MINUTES: Final = 300.0
LOOKBACK: Final = 20
MAX_MARKERS: Final = 4
TENANT: Final = "oracle"
PER_TOKENS: Final = 1_000_000


@dataclass(slots=True)
class Plan:
    """Input tokens of one request by how a plan charges them."""

    read: int = 0
    write_5m: int = 0
    write_1h: int = 0
    none: int = 0


@dataclass(slots=True)
class Bound:
    """One request's bounds (tokens, USD)."""

    total: int
    """Prompt tokens of the client's request (raw form)."""
    read: int
    """Most tokens a clairvoyant plan reads from cache for this request."""
    raw_read: int = 0
    stable_read: int = 0
    markers_needed: int = 0
    causal_read: int = 0
    """Most tokens a plan with causal TTLs (and the client's `prompt_cache_key`) reads."""
    min_cost: float = 0.0
    """Input-side USD of the cheapest clairvoyant plan for this request."""
    plan: Plan = field(default_factory=Plan)
    """Tokens of the cheapest plan by kind."""


@dataclass(slots=True)
class Optimum:
    """The oracle's answer for one trace."""

    name: str
    requests: list[Bound] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(b.total for b in self.requests)

    @property
    def read(self) -> int:
        return sum(b.read for b in self.requests)

    @property
    def causal_read(self) -> int:
        return sum(b.causal_read for b in self.requests)

    @property
    def min_cost(self) -> float:
        return sum(b.min_cost for b in self.requests)

    @property
    def share(self) -> float:
        """Clairvoyant read tokens / all input tokens."""
        return self.read / self.total if self.total else 0.0

    @property
    def limit_binding(self) -> int:
        """Requests whose ideal plan needed more than 4 markers."""
        return sum(1 for b in self.requests if b.markers_needed > MAX_MARKERS)


def _betas(request: TraceRequest) -> frozenset[str]:
    value = next((v for k, v in request.headers.items() if k.lower() == "anthropic-beta"), "")
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def _times(trace: Trace) -> list[float]:
    now = 0.0
    out = []
    for r in trace.requests:
        now += r.gap
        out.append(now)
    return out


def _asks_one_hour(value: Any) -> bool:
    """True when a `cache_control` with `ttl: 1h` sits anywhere in `value`."""
    if isinstance(value, dict):
        marker = value.get("cache_control")
        if isinstance(marker, dict) and marker.get("ttl") == "1h":
            return True
        return any(_asks_one_hour(v) for v in value.values() if isinstance(v, dict | list))
    if isinstance(value, list):
        return any(_asks_one_hour(v) for v in value if isinstance(v, dict | list))
    return False


def causal_ttls(trace: Trace) -> list[float]:
    """Seconds each request's entries live under the causal bound (module docstring)."""
    times = _times(trace)
    last_in_session: dict[str, float] = {}
    long_in_session: set[str] = set()
    long_in_trace = False
    out = []
    for i, (request, now) in enumerate(zip(trace.requests, times, strict=True)):
        session = session_of(request)
        if i and now - times[i - 1] > FIVE_MINUTES:
            long_in_trace = True
        if session in last_in_session and now - last_in_session[session] > FIVE_MINUTES:
            long_in_session.add(session)
        last_in_session[session] = now
        long = long_in_trace or session in long_in_session or _asks_one_hour(request.body)
        out.append(ONE_HOUR if long else FIVE_MINUTES)
    return out


# --- Anthropic ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Live:
    expires: float
    ttl: float
    """Seconds the entry lives after its write or latest refresh."""
    events: list[tuple[int, int, float, float]]
    """`(request index, block index, trace second, ttl after it)` of the write and each
    refresh, oldest first."""


class _AnthropicIdeal:
    """Every block a breakpoint; tracks entries and the markers the reads needed."""

    def __init__(self, trace_length: int) -> None:
        self.live: dict[tuple[str, bytes], _Live] = {}
        self.needed: list[set[int]] = [set() for _ in range(trace_length)]
        """Per request: block indices whose marker a read (now or later) relied on."""
        self.hits: list[int] = [-1] * trace_length
        """Per request: block index of the read, -1 for none."""
        self.positions: list[list[int]] = [[] for _ in range(trace_length)]

    def request(self, index: int, prompt: sim_anthropic.Prompt, minimum: int, now: float, ttl: float) -> int:
        """Read tokens of one rendered request with every marker of TTL `ttl` (seconds);
        records entries and marker needs."""
        model = prompt.model
        blocks = prompt.blocks
        self.positions[index] = [b.position for b in blocks]
        live = [
            (i, entry)
            for i, block in enumerate(blocks)
            if (entry := self.live.get((model, block.chain))) is not None and now < entry.expires
        ]
        hit = live[-1][0] if live else -1
        self.hits[index] = hit
        if live:
            self._mark_keepers(live[-1][1], now)
            self.needed[index].add(hit)
        for i, entry in live:
            entry.ttl = max(entry.ttl, ttl)
            entry.expires = now + entry.ttl
            entry.events.append((index, i, now, entry.ttl))
        for i in range(hit + 1, len(blocks)):
            if blocks[i].cumulative >= minimum:
                self.live[(model, blocks[i].chain)] = _Live(now + ttl, ttl, [(index, i, now, ttl)])
        return blocks[hit].cumulative if hit >= 0 else 0

    def _mark_keepers(self, entry: _Live, now: float) -> None:
        """Mark the fewest events (the write, then refreshes) that keep the entry alive until
        `now`: from `now`, repeatedly the earliest event whose lifetime reaches it."""
        events = entry.events
        at = now
        k = len(events)
        while k > 0:
            j = next(j for j in range(k) if at - events[j][2] < events[j][3])
            request, block, at, _ = events[j]
            self.needed[request].add(block)
            if j == 0 or self.hits[request] == block:
                break
            k = j

    def markers(self, index: int) -> int:
        """Markers request `index` needed: one per needed block, except that the read shares
        the marker of a later needed block within the lookback window."""
        needed = self.needed[index]
        hit = self.hits[index]
        positions = self.positions[index]
        shared = hit in needed and any(j > hit and positions[j] - positions[hit] < LOOKBACK for j in needed)
        return len(needed) - (1 if shared else 0)


@dataclass(frozen=True, slots=True)
class _Price:
    """USD per token of one model's input kinds."""

    input: float
    read: float
    write_5m: float
    write_1h: float


_DEAD, _LIVE_5M, _LIVE_1H = 0, 1, 2
_INF: Final = float("inf")


class _CheapestPlan:
    """The clairvoyant minimum cost, block by block (module docstring): collect every access,
    then `solve` runs the three-state programme per block and charges each request its share."""

    def __init__(self, trace_length: int) -> None:
        self.accesses: dict[tuple[str, bytes], list[tuple[int, float]]] = {}
        """Per block `(model, chain)`: `(request index, trace second)` of each access."""
        self.blocks: dict[tuple[str, bytes], tuple[int, _Price]] = {}
        """Per cacheable block: its own tokens and its model's prices."""
        self.plans = [Plan() for _ in range(trace_length)]
        self.costs = [0.0] * trace_length

    def request(
        self, index: int, prompt: sim_anthropic.Prompt, minimum: int, now: float, price: _Price
    ) -> None:
        """Record one rendered request. A request below the model's minimum is charged uncached
        now; otherwise every block is an access (a block below the minimum is read or written as
        part of a longer prefix, so treating it like any other block only relaxes the plan)."""
        plan = self.plans[index]
        if prompt.total_tokens < minimum or not prompt.blocks or prompt.blocks[-1].cumulative < minimum:
            plan.none += prompt.total_tokens
            self.costs[index] += prompt.total_tokens * price.input
            return
        before = 0
        for block in prompt.blocks:
            tokens = block.cumulative - before
            before = block.cumulative
            key = (prompt.model, block.chain)
            self.accesses.setdefault(key, []).append((index, now))
            self.blocks.setdefault(key, (tokens, price))
        plan.none += prompt.total_tokens - before
        self.costs[index] += (prompt.total_tokens - before) * price.input

    def solve(self) -> None:
        """Charge every access of every block by its block's cheapest sequence."""
        for key, accesses in self.accesses.items():
            tokens, price = self.blocks[key]
            for (index, _), kind in zip(accesses, cheapest_sequence([t for _, t in accesses], price), strict=True):
                plan = self.plans[index]
                setattr(plan, kind, getattr(plan, kind) + tokens)
                self.costs[index] += tokens * getattr(price, "input" if kind == "none" else kind)


def cheapest_sequence(times: list[float], price: _Price) -> list[str]:
    """The cheapest charge of each access of one block sent at `times` (seconds, ascending):
    `read`, `write_5m`, `write_1h` or `none` per access (module docstring, minimum cost)."""
    cost = [price.input, price.write_5m, price.write_1h]
    back: list[list[tuple[int, str]]] = [[(-1, "none"), (-1, "write_5m"), (-1, "write_1h")]]
    for k in range(1, len(times)):
        gap = times[k] - times[k - 1]
        best = min(range(3), key=lambda s: cost[s])
        live = [s for s in (_LIVE_5M, _LIVE_1H) if gap < (FIVE_MINUTES if s == _LIVE_5M else ONE_HOUR)]
        new = [cost[best] + price.input, cost[best] + price.write_5m, cost[best] + price.write_1h]
        steps = [(best, "none"), (best, "write_5m"), (best, "write_1h")]
        if live:
            kept = min(live, key=lambda s: cost[s])
            if cost[kept] + price.read <= new[_LIVE_1H]:
                new[_LIVE_1H] = cost[kept] + price.read
                steps[_LIVE_1H] = (kept, "read")
        cost = new
        back.append(steps)
    state = min(range(3), key=lambda s: cost[s])
    kinds: list[str] = []
    for k in range(len(times) - 1, -1, -1):
        state, kind = back[k][state]
        kinds.append(kind)
    kinds.reverse()
    return kinds


# --- OpenAI -------------------------------------------------------------------------------


def _with_breakpoints(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A copy of a marker-free body with a breakpoint on every eligible content part."""
    key = "messages" if path == "/v1/chat/completions" else "input"
    items = body.get(key)
    if not isinstance(items, list):
        return body
    part_type = "text" if path == "/v1/chat/completions" else "input_text"
    out = []
    for item in items:
        if isinstance(item, dict) and item.get("role") in ("user", "system", "developer", "tool"):
            content = item.get("content")
            if isinstance(content, str):
                content = [{"type": part_type, "text": content}]
            if isinstance(content, list):
                content = [
                    {**p, "prompt_cache_breakpoint": {"mode": "explicit"}} if isinstance(p, dict) else p
                    for p in content
                ]
                item = {**item, "content": content}
        out.append(item)
    return {**body, key: out}


def _digests(tokens: array[int], offsets: Iterable[int]) -> dict[int, bytes]:
    hasher = xxhash.xxh3_128()
    done = 0
    out = {}
    for o in sorted(offsets):
        hasher.update(tokens[done:o].tobytes())
        done = o
        out[o] = hasher.digest()
    return out


class _OpenAIIdeal:
    def __init__(self, config: SimConfig, counter: TokenCounter) -> None:
        self.config = config
        self.counter = counter
        self.store = CacheStore()
        self.router = sim_openai.Router()
        self.live: dict[tuple[str, bytes], float] = {}

    def request(
        self, request: TraceRequest, body: dict[str, Any], now: float, key: str | None
    ) -> tuple[int, int]:
        """`(prompt tokens, read tokens)` of one form routed with `key`."""
        model = str(body.get("model", ""))
        settings = self.config.openai_model(model)
        render = (
            sim_openai.render_chat if request.path == "/v1/chat/completions" else sim_openai.render_responses
        )
        try:
            rendered = render(body, self.counter)
        except Exception:  # noqa: BLE001 - a body the API refuses reads nothing
            return 0, 0
        machine = self.router.machine(TENANT, model, key, rendered.tokens, now, settings)
        if not settings.breakpoints:
            plan = sim_openai.plan_cache(rendered, body, model, settings, TENANT, machine, now, self.store)
            self.store.commit(plan.writes)
            return plan.prompt_tokens, plan.cached_tokens
        marked = render(_with_breakpoints(request.path, body), self.counter)
        options = body.get("prompt_cache_options")
        ttl_name = options.get("ttl", "30m") if isinstance(options, dict) else "30m"
        ttl = settings.breakpoint_ttls.get(ttl_name, 1800.0)
        candidates = {o for o in (*marked.explicit, *marked.turn_ends) if o >= settings.min_cache_tokens}
        digests = _digests(marked.tokens, candidates)
        ns = f"{model}/{machine}"
        cached = 0
        for offset, digest in digests.items():
            expires = self.live.get((ns, digest))
            if expires is not None and now < expires:
                cached = max(cached, offset)
                self.live[(ns, digest)] = now + ttl
        for offset, digest in digests.items():
            if offset > cached:
                self.live[(ns, digest)] = now + ttl
        return len(rendered.tokens), cached


def _client_key(body: dict[str, Any]) -> str | None:
    key = body.get("prompt_cache_key")
    return key if isinstance(key, str) else None


_KEYS: Final = ("client", "session", "trace")
"""Routing keys the clairvoyant OpenAI bound tries (module docstring)."""


def _routing_key(kind: str, request: TraceRequest, body: dict[str, Any]) -> str | None:
    if kind == "client":
        return _client_key(body)
    if kind == "session":
        return f"oracle-{xxhash.xxh3_64_hexdigest(session_of(request).encode())}"
    return "oracle-trace"


# --- entry point --------------------------------------------------------------------------


def _price(pricing: PricingTable, provider: str, model: str) -> _Price:
    prices = pricing.prices(provider, model)
    if prices is None:
        return _Price(0.0, 0.0, 0.0, 0.0)
    return _Price(
        prices.input / PER_TOKENS,
        prices.cache_read / PER_TOKENS,
        prices.cache_write_5m / PER_TOKENS,
        prices.cache_write_1h / PER_TOKENS,
    )


def _parse(
    request: TraceRequest, body: dict[str, Any], config: SimConfig, counter: TokenCounter
) -> tuple[sim_anthropic.Prompt | None, int]:
    settings = config.anthropic_model(str(body.get("model", "")))
    try:
        prompt = sim_anthropic.parse_request(
            body, _betas(request), counter, settings, require_max_tokens=False
        )
    except Exception:  # noqa: BLE001 - a body the API refuses reads nothing
        return None, settings.min_cache_tokens
    return prompt, settings.min_cache_tokens


def optimum(
    trace: Trace,
    config: SimConfig | None = None,
    counter: TokenCounter | None = None,
    pricing: PricingTable | None = None,
) -> Optimum:
    """The bounds of every request of `trace` (module docstring). Blocking, CPU only."""
    config = config if config is not None else SimConfig.load()
    counter = counter if counter is not None else TokenCounter()
    pricing = pricing if pricing is not None else default_pricing()
    forms = stable_forms(trace)
    times = _times(trace)
    ttls = causal_ttls(trace)
    n = len(trace.requests)
    clair = {"raw": _AnthropicIdeal(n), "stable": _AnthropicIdeal(n)}
    causal = {"raw": _AnthropicIdeal(n), "stable": _AnthropicIdeal(n)}
    cheapest = {"raw": _CheapestPlan(n), "stable": _CheapestPlan(n)}
    openai = {(f, k): _OpenAIIdeal(config, counter) for f in ("raw", "stable") for k in _KEYS}
    result = Optimum(trace.name)
    totals: list[dict[str, int]] = []
    for index, (request, form, now, ttl) in enumerate(zip(trace.requests, forms, times, ttls, strict=True)):
        bodies = {"raw": form.raw, "stable": form.stable}
        model = str(request.body.get("model", ""))
        price = _price(pricing, request.provider, model)
        reads: dict[str, int] = {}
        causal_reads: dict[str, int] = {}
        total: dict[str, int] = {}
        if request.provider == "anthropic":
            for name, body in bodies.items():
                prompt, minimum = _parse(request, body, config, counter)
                if prompt is None:
                    reads[name] = causal_reads[name] = total[name] = 0
                    continue
                total[name] = prompt.total_tokens
                reads[name] = clair[name].request(index, prompt, minimum, now, ONE_HOUR)
                causal_reads[name] = causal[name].request(index, prompt, minimum, now, ttl)
                cheapest[name].request(index, prompt, minimum, now, price)
        else:
            for name, body in bodies.items():
                got = {}
                for kind in _KEYS:
                    key = _routing_key(kind, request, body)
                    got[kind] = openai[(name, kind)].request(request, body, now, key)
                total[name] = got["client"][0]
                reads[name] = max(r for _, r in got.values())
                causal_reads[name] = got["client"][1]
        totals.append(total)
        bound = Bound(
            total.get("raw", 0),
            max(reads.values()),
            reads["raw"],
            reads["stable"],
            causal_read=max(causal_reads.values()),
        )
        result.requests.append(bound)
    for plan in cheapest.values():
        plan.solve()
    for index, (request, bound) in enumerate(zip(trace.requests, result.requests, strict=True)):
        ideal = clair["stable"] if bound.stable_read >= bound.raw_read else clair["raw"]
        bound.markers_needed = ideal.markers(index)
        if request.provider == "anthropic":
            name = min(("raw", "stable"), key=lambda f: cheapest[f].costs[index])
            bound.min_cost = cheapest[name].costs[index]
            bound.plan = cheapest[name].plans[index]
        else:
            price = _price(pricing, request.provider, str(request.body.get("model", "")))
            read = bound.read
            bound.plan = Plan(read=read, none=max(0, bound.total - read))
            bound.min_cost = read * price.read + bound.plan.none * price.input
    return result
