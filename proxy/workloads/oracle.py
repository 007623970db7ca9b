"""The optimum: an upper bound on the cache-read tokens any proxy can get for a trace.

The simulator is the judge, so the oracle renders requests and counts tokens with the
simulator's own code (`proxy.sim.anthropic.parse_request`, `proxy.sim.openai.render_*`, the
`Router`, the per-model table in `rules/simulator.yaml`) and never with the proxy's pipeline.

For every request it computes a read bound on two forms (`stable.py`): the client's body
without markers (**raw**) and the **stable** form, each replayed in its own empty cache with
the trace's gaps; the request's bound is the larger of the two. `total` is the raw form's prompt
tokens (what the client's request costs uncached).

Assumptions, per provider:
- **Anthropic**, an ideal marker plan: every block is a breakpoint (no 4-marker limit, no
  20-position lookback needed) with the longest TTL a causal policy may choose (below). So
  every live entry on the request's prefix is read or refreshed (lifetime counted again from
  the request's start, a 1-hour refresh lengthening a 5-minute entry, as the simulator does for
  a 1h marker on the entry's block), the read is the longest live one, and every block past it
  whose cumulative prefix reaches the model's `min_cache_tokens` is written. Entries are per
  model, and the params fingerprints of the simulator's chain digests apply. No plan with fewer
  markers or shorter TTLs can keep more entries alive, so this is an upper bound. The oracle
  also reports how many markers the plan actually needed (`markers_needed`): the positions
  later reads use (read, write or refresh), one marker serving a read up to 20 lookback
  positions before it; above 4 the bound may not be attainable (`limit_binding` counts such
  requests).
- **OpenAI before GPT-5.6** (automatic caching): nothing to choose, so the bound is the
  simulator's own accounting (128-token steps above the minimum, routing by the first tokens
  and `prompt_cache_key`, overflow above 15 requests/minute, idle retention) applied to the form,
  with the client's `prompt_cache_key` and `prompt_cache_retention`.
- **OpenAI GPT-5.6+** (breakpoints): a breakpoint on every content part of user / system /
  developer / tool messages plus the end of every user / tool message, no 4-write limit, every
  live candidate on the prefix refreshed (TTL from `prompt_cache_options.ttl`, default 30 min).
- Requests run one after another: each response has begun before the next request starts.

Causal TTLs (Anthropic): the TTL of request `i`'s writes and refreshes (`causal_ttls`) is what a
policy could know when request `i` starts: 1 hour once a gap longer than 5 minutes has been
observed up to and including request `i` (between consecutive requests of the trace, or of the
request's session), or when the client's own request asks for a 1-hour marker; otherwise 5
minutes. A 1-hour write costs 2x against 1.25x (PROVIDERS.md 1.9): a proxy pays it only on
evidence that entries must outlive 5 minutes, and no proxy can see the first long gap before it
happens. An oracle with 1-hour entries from the first request would count, after a first gap
longer than 5 minutes, a read no causal policy gets. Nothing else is weakened: still every block
a breakpoint, every live entry refreshed, and the longest TTL any such policy could pick.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import xxhash

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


@dataclass(slots=True)
class Bound:
    """One request's bound (tokens)."""

    total: int
    """Prompt tokens of the client's request (raw form)."""
    read: int
    """Most tokens any plan reads from cache for this request."""
    raw_read: int = 0
    stable_read: int = 0
    markers_needed: int = 0


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
    def share(self) -> float:
        """Optimal read tokens / all input tokens."""
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
    """Seconds each request's entries live (module docstring, "Causal TTLs")."""
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
    """Every block a 1-hour breakpoint; tracks entries and the markers the reads needed."""

    def __init__(self, config: SimConfig, counter: TokenCounter) -> None:
        self.config = config
        self.counter = counter
        self.live: dict[tuple[str, bytes], _Live] = {}
        self.needed: list[set[int]] = []
        """Per request: block indices whose marker a read (now or later) relied on."""
        self.hits: list[int] = []
        """Per request: block index of the read, -1 for none."""
        self.positions: list[list[int]] = []

    def skip(self) -> None:
        """Record a request this provider does not see."""
        self.needed.append(set())
        self.hits.append(-1)
        self.positions.append([])

    def request(
        self, index: int, request: TraceRequest, body: dict[str, Any], now: float, ttl: float = ONE_HOUR
    ) -> tuple[int, int]:
        """`(total tokens, read tokens)` of one form, with every marker of TTL `ttl` (seconds);
        records entries and marker needs."""
        model = str(body.get("model", ""))
        settings = self.config.anthropic_model(model)
        self.skip()
        try:
            prompt = sim_anthropic.parse_request(
                body, _betas(request), self.counter, settings, require_max_tokens=False
            )
        except Exception:  # noqa: BLE001 - a body the API refuses reads nothing
            return 0, 0
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
            if blocks[i].cumulative >= settings.min_cache_tokens:
                self.live[(model, blocks[i].chain)] = _Live(now + ttl, ttl, [(index, i, now, ttl)])
        return prompt.total_tokens, blocks[hit].cumulative if hit >= 0 else 0

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

    def request(self, request: TraceRequest, body: dict[str, Any], now: float) -> tuple[int, int]:
        model = str(body.get("model", ""))
        settings = self.config.openai_model(model)
        render = (
            sim_openai.render_chat if request.path == "/v1/chat/completions" else sim_openai.render_responses
        )
        try:
            rendered = render(body, self.counter)
        except Exception:  # noqa: BLE001 - a body the API refuses reads nothing
            return 0, 0
        key = body.get("prompt_cache_key")
        machine = self.router.machine(
            TENANT, model, key if isinstance(key, str) else None, rendered.tokens, now, settings
        )
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


# --- entry point --------------------------------------------------------------------------


def optimum(trace: Trace, config: SimConfig | None = None, counter: TokenCounter | None = None) -> Optimum:
    """The read bound of every request of `trace` (module docstring). Blocking, CPU only."""
    config = config if config is not None else SimConfig.load()
    counter = counter if counter is not None else TokenCounter()
    forms = stable_forms(trace)
    times = _times(trace)
    ttls = causal_ttls(trace)
    raw_a, stable_a = _AnthropicIdeal(config, counter), _AnthropicIdeal(config, counter)
    raw_o, stable_o = _OpenAIIdeal(config, counter), _OpenAIIdeal(config, counter)
    result = Optimum(trace.name)
    for index, (request, form, now, ttl) in enumerate(zip(trace.requests, forms, times, ttls, strict=True)):
        if request.provider == "anthropic":
            total, raw_read = raw_a.request(index, request, form.raw, now, ttl)
            _, stable_read = stable_a.request(index, request, form.stable, now, ttl)
            bound = Bound(total, max(raw_read, stable_read), raw_read, stable_read)
        else:
            raw_a.skip()
            stable_a.skip()
            total, raw_read = raw_o.request(request, form.raw, now)
            _, stable_read = stable_o.request(request, form.stable, now)
            bound = Bound(total, max(raw_read, stable_read), raw_read, stable_read)
        result.requests.append(bound)
    for index, bound in enumerate(result.requests):
        ideal = stable_a if bound.stable_read >= bound.raw_read else raw_a
        bound.markers_needed = ideal.markers(index)
    return result
