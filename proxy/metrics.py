"""Every Prometheus metric promptcache exports, declared in one place.

Names follow prometheus.io/docs/practices/naming and the project style: prefix `promptcache_`,
base units (`_seconds`, `_bytes`; money in `_usd`), `_total` on counters. Labels are bounded
sets known in advance (provider, outcome, cache, stage, section, cause, action, backend,
operation, family, reason) and are pre-resolved at start so every series exists with 0 and the
request path does no label lookups. `family` is a family name from `rules/pricing.yaml` or
`other`, never a raw model string; `reason` is mapped onto `UPSTREAM_MISS_REASONS`. No label ever
carries a session id, key, prompt text or raw model string.

Series: no `_created` samples (`disable_created_metrics()`, process-wide: promptcache exports
creation times nowhere); label sets known in advance are pre-resolved, while `family` series
appear on the first request of that family (`MeasureMetrics.family_cost`), so `/metrics` does not
carry a zero line for every model family in the price table.

Build one `Metrics(registry)` per app; tests pass a fresh `CollectorRegistry`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from prometheus_client import CollectorRegistry, Gauge, Info, disable_created_metrics, values
from prometheus_client import Counter as _LibraryCounter
from prometheus_client import Histogram as _LibraryHistogram

from proxy import __version__, metric_values
from proxy.malformed import KINDS as MALFORMED_KINDS
from proxy.pricing import OTHER as OTHER_FAMILY
from proxy.pricing import default_pricing
from proxy.store.base import FAULT_KINDS

PROVIDERS: Final = ("anthropic", "openai")
OUTCOMES: Final = ("ok", "client_error", "upstream_error", "proxy_error")
CACHE_KINDS: Final = ("read", "write", "none")
STAGES: Final = (
    "parse",
    "session",
    "canonicalise",
    "reorder",
    "pin",
    "replay",
    "diagnostics",
    "breakpoints",
    "platform",
    "serialise",
    "observe",
)
CLOSE_REASONS: Final = (
    "idle",
    "header_timeout",
    "body_timeout",
    "header_too_large",
    "too_many_headers",
    "too_many_connections",
    "too_many_client_connections",
    "bad_request",
)
"""Why promptcache closed a client connection (`promptcache_connections_closed_total{reason}`)."""
SECTIONS: Final = ("tools", "system", "messages", "none")
CAUSES: Final = (
    "none",
    "first_request",
    "model_changed",
    "tools_changed",
    "system_changed",
    "system_volatile_text",
    "messages_changed",
    "params_changed",
    "history_rewritten",
    "expired",
)
DIVERGENCE_LABELS: Final = (
    ("none", "none"),
    ("none", "first_request"),
    ("none", "model_changed"),
    ("none", "params_changed"),
    ("none", "expired"),
    ("tools", "tools_changed"),
    ("tools", "expired"),
    ("system", "system_changed"),
    ("system", "system_volatile_text"),
    ("system", "expired"),
    ("messages", "messages_changed"),
    ("messages", "history_rewritten"),
    ("messages", "expired"),
)
"""Every `(section, cause)` pair `proxy.measure` can produce (pre-resolved at start)."""
UPSTREAM_MISS_REASONS: Final = (
    "none",
    "pending",
    "model_changed",
    "system_changed",
    "tools_changed",
    "messages_changed",
    "previous_message_not_found",
    "unavailable",
    "input_changed",
    "context_compacted",
    "prompt_cache_key_changed",
    "text_format_changed",
    "reasoning_effort_changed",
    "verbosity_changed",
    "service_tier_changed",
    "comparison_response_not_found",
    "other",
)
"""Anthropic cache-diagnostics reasons and OpenAI `prompt_cache_diagnostics` reasons / types,
plus `none` (no divergence, `cache_hit`), `pending` (comparison not finished) and `other` (a
type this list does not know yet)."""
AGREEMENT: Final = ("agree", "disagree", "unknown")
"""Does the upstream's own diagnosis match promptcache's cause (`proxy.measure.agreement`)."""
BREAKPOINT_ACTIONS: Final = ("injected", "moved", "dropped", "kept")
STORE_BACKENDS: Final = ("memory", "sqlite", "redis")
BUDGET_STAGES: Final = ("session", "reorder", "pin", "history")
STORE_OPERATIONS: Final = ("get", "put")
STORE_CAPS: Final = ("tenant", "total")
"""`cap` label of `promptcache_session_store_evictions_total`."""



class LoopValue:
    """A metric value only the event loop's thread changes: a plain float, no lock.

    prometheus-client's single-process value (`values.MutexValue`) takes a lock on every
    increment (about 0.3 us of a counter's 0.4 and 0.55 of a histogram's 0.75 here; a 1 KB
    request makes about 30). The request path runs on one thread, so a metric that nothing else
    changes needs none: `Counter` and `Histogram` below use this value in a single process
    (`_IS_LOOP_ONLY`); a metric that another thread changes too (the store's: its writer thread
    counts evictions and faults) is a `ThreadSafeCounter` / `ThreadSafeHistogram` and keeps
    the library's value. Reading it from another thread (a scrape) reads one float. In
    multiprocess mode (`--workers`) the library's (batched) value is kept."""

    __slots__ = ("_value", "_exemplar")
    _multiprocess = False

    def __init__(self, value: float = 0.0) -> None:
        self._value = value
        self._exemplar: Any = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: Any) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> Any:
        return self._exemplar


def _loop_value(value: Any) -> LoopValue | None:
    """A `LoopValue` holding `value`'s amount when `value` is the library's single-process
    value, else `None` (multiprocess mode: the library's value stays)."""
    if type(value) is not values.MutexValue:
        return None
    return LoopValue(value.get())


class Counter(_LibraryCounter):
    """prometheus-client's `Counter` with a shorter `inc` on a label child (or an unlabelled
    metric): in a single process its value is a `LoopValue` (no lock; only the event loop's
    thread changes it), added to directly, and adding 0 is skipped (the value would not
    change). The samples, the registry and multiprocess mode are the library's; an exemplar or
    a negative amount takes the library's own path (and its error)."""

    _IS_LOOP_ONLY: ClassVar[bool] = True
    """False for a metric that a thread other than the event loop's changes (`ThreadSafeCounter`)."""
    _add: Callable[[float], None] | None = None
    _fast: LoopValue | None = None

    def _metric_init(self) -> None:
        super()._metric_init()
        if self._IS_LOOP_ONLY:
            fast = _loop_value(self._value)
            if fast is not None:
                self._value = self._fast = fast
        self._add = self._value.inc

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        fast = self._fast
        if fast is not None and amount > 0 and not exemplar:
            fast._value += amount
            return
        add = self._add
        if add is None or exemplar or amount < 0:
            super().inc(amount, exemplar)
        elif amount:
            add(amount)


class ThreadSafeCounter(Counter):
    """`Counter` for a metric that another thread changes too: the library's locked value."""

    _IS_LOOP_ONLY: ClassVar[bool] = False


class Histogram(_LibraryHistogram):
    """prometheus-client's `Histogram` with a shorter `observe` on a label child (or an
    unlabelled metric): the sum and the one bucket the amount falls in (the first upper bound
    `>=` the amount, found by bisection over the sorted bounds, `+Inf` last) are added to
    directly, as the library's loop over every bound would; in a single process they are
    `LoopValue`s (as `Counter`'s). The samples, the registry and multiprocess mode are the
    library's; an exemplar or a NaN amount takes the library's own path."""

    _IS_LOOP_ONLY: ClassVar[bool] = True
    """False for a metric that a thread other than the event loop's changes (`ThreadSafeHistogram`)."""
    _bounds: tuple[float, ...] = ()
    _add_sum: Callable[[float], None] | None = None
    _add_bucket: tuple[Callable[[float], None], ...] = ()
    _fast_sum: LoopValue | None = None
    _fast_buckets: tuple[LoopValue, ...] = ()

    def _metric_init(self) -> None:
        super()._metric_init()
        self._bounds = tuple(self._upper_bounds)
        if self._IS_LOOP_ONLY:
            fast_sum = _loop_value(self._sum)
            fast_buckets = [_loop_value(bucket) for bucket in self._buckets]
            if fast_sum is not None and all(b is not None for b in fast_buckets):
                self._sum = self._fast_sum = fast_sum
                self._buckets = [b for b in fast_buckets if b is not None]
                self._fast_buckets = tuple(self._buckets)
        self._add_sum = self._sum.inc
        self._add_bucket = tuple(bucket.inc for bucket in self._buckets)

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        fast_sum = self._fast_sum
        if fast_sum is not None and not exemplar and amount == amount:
            fast_sum._value += amount
            self._fast_buckets[bisect_left(self._bounds, amount)]._value += 1
            return
        add_sum = self._add_sum
        if add_sum is None or exemplar or amount != amount:
            super().observe(amount, exemplar)
            return
        add_sum(amount)
        self._add_bucket[bisect_left(self._bounds, amount)](1)


class ThreadSafeHistogram(Histogram):
    """`Histogram` for a metric that another thread changes too: the library's locked values."""

    _IS_LOOP_ONLY: ClassVar[bool] = False


_LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_FAST_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
_RATIO_BUCKETS: Final = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
_TOKEN_BUCKETS: Final = (0, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576)


@dataclass(slots=True)
class ProviderMetrics:
    """Label children of one provider, resolved once at start (measured on this project's
    benchmark machine: `.labels()` per request cost about 11% of pass-through throughput)."""

    outcome: dict[str, Counter]
    in_flight: Gauge
    duration: Histogram
    first_byte: Histogram
    overhead: Histogram
    input_tokens: dict[str, Counter]
    output_tokens: Counter
    body_too_large: Counter
    replayed_messages: Counter
    breakpoints: dict[str, Counter]
    """By action (`BREAKPOINT_ACTIONS`)."""
    ttl_downgrades: Counter
    keepwarm_pings: dict[str, Counter]
    """Keep-warm pings by outcome (`ok`, `error`)."""
    keepwarm_cost: Counter
    keepwarm_saved: Counter
    signed: Counter
    """Signed requests (SigV4) forwarded byte-identical and measured only."""
    upstream_moves: Counter
    """Sessions moved to another base URL of the upstream after a failure (a cold write)."""


@dataclass(slots=True)
class MeasureMetrics:
    """Label children `proxy.measure` updates for one provider, resolved once at start."""

    provider: str

    prompt_bytes: Counter
    matched_bytes: Counter
    divergence_ratio: Histogram
    divergence_tokens: Histogram
    predicted_read_tokens: Counter
    divergences: dict[tuple[str, str], Counter]
    """By `(section, cause)`, every pair of `DIVERGENCE_LABELS`."""
    families: frozenset[str]
    """Every `family` label value of this provider (`other` included)."""
    cost_metric: Counter
    uncached_cost_metric: Counter
    cost: dict[str, tuple[Counter, Counter]]
    """`family -> (cost, uncached cost)` children (USD), filled on first use."""

    def family_cost(self, family: str) -> tuple[Counter, Counter]:
        """`(cost, uncached cost)` children of `family` (`other` when not a known family),
        created on first use."""
        if family not in self.families:
            family = OTHER_FAMILY
        found = self.cost.get(family)
        if found is None:
            found = (
                self.cost_metric.labels(self.provider, family),
                self.uncached_cost_metric.labels(self.provider, family),
            )
            self.cost[family] = found
        return found


@dataclass(slots=True)
class TeamMetrics:
    """Label children of one team."""

    requests: Counter
    input_tokens: dict[str, Counter]
    """By `cache` (`CACHE_KINDS`)."""
    cost: Counter
    uncached_cost: Counter


class Metrics:
    """All metrics of one app, registered in `registry` (a fresh one per app and per test)."""

    def team_metrics(self, team: str) -> TeamMetrics:
        """Children of `team` (a value `proxy.teams.TeamResolver` produced: bounded), created
        on first use; `prepare_teams` creates them at start."""
        found = self.teams.get(team)
        if found is None:
            found = TeamMetrics(
                requests=self.team_requests.labels(team),
                input_tokens={c: self.team_input_tokens.labels(team, c) for c in CACHE_KINDS},
                cost=self.team_cost.labels(team),
                uncached_cost=self.team_uncached_cost.labels(team),
            )
            self.teams[team] = found
        return found

    def prepare_teams(self, teams: Sequence[str]) -> None:
        """Create every team's series at start (each exists with 0)."""
        for team in teams:
            self.team_metrics(team)

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        families: Mapping[str, Sequence[str]] | None = None,
        worker: int = 0,
    ) -> None:
        """`families`: provider -> every `family` label value (`other` included); defaults to
        the packaged `rules/pricing.yaml`. `worker`: this process's index under `--workers`
        (the `worker` label of `promptcache_worker_requests_total`).

        Under `--workers` (`PROMETHEUS_MULTIPROC_DIR` set) samples live in that directory and
        `/metrics` sums the workers' (`multiprocess_mode` below says how each gauge combines)."""
        disable_created_metrics()
        self.registry = registry if registry is not None else CollectorRegistry()
        if families is None:
            table = default_pricing()
            families = {p: table.family_names(p) for p in PROVIDERS}
        metric_values.install()  # under --workers: shared-file writes once per loop turn
        r = self.registry
        self.requests = Counter(
            "promptcache_requests_total",
            "Requests finished, by provider and outcome (proxy.forward).",
            ["provider", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge(
            "promptcache_requests_in_flight",
            "Requests being served (proxy.forward).",
            ["provider"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.worker_requests = Counter(
            "promptcache_worker_requests_total",
            "Client requests to an upstream path, by the worker process that served them "
            "(`--workers`; worker 0 alone) (proxy.handlers).",
            ["worker"],
            registry=r,
        ).labels(str(worker))
        self.duration = Histogram(
            "promptcache_request_duration_seconds",
            "Whole request time, received to last byte sent (proxy.forward).",
            ["provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.first_byte = Histogram(
            "promptcache_upstream_first_byte_seconds",
            "Upstream request sent to response headers received (proxy.forward).",
            ["provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "promptcache_proxy_overhead_seconds",
            "Request received to upstream request sent: the pipeline's cost (proxy.forward).",
            ["provider"],
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.input_tokens = Counter(
            "promptcache_input_tokens_total",
            "Prompt tokens reported by the upstream, by cache read/write/none (proxy.forward).",
            ["provider", "cache"],
            registry=r,
        )
        self.output_tokens = Counter(
            "promptcache_output_tokens_total",
            "Output tokens reported by the upstream (proxy.forward).",
            ["provider"],
            registry=r,
        )
        self.too_large = Counter(
            "promptcache_request_body_too_large_total",
            "Requests refused with 413 for exceeding max_body_bytes (proxy.handlers).",
            ["provider"],
            registry=r,
        )
        self.stage_duration = Histogram(
            "promptcache_stage_duration_seconds",
            "Time spent in each pipeline stage (proxy.pipeline).",
            ["stage"],
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.stage_errors = Counter(
            "promptcache_stage_errors_total",
            "Stage exceptions; each one forwarded the client's original bytes (proxy.pipeline).",
            ["stage"],
            registry=r,
        )
        self.breakpoints = Counter(
            "promptcache_breakpoints_total",
            "cache_control breakpoints per request, by action (proxy.pipeline.breakpoints).",
            ["provider", "action"],
            registry=r,
        )
        self.ttl_downgrades = Counter(
            "promptcache_ttl_downgrades_total",
            "Responses that wrote 5-minute cache entries although every marker sent asked for 1h "
            "(usage cache_creation.ephemeral_5m_input_tokens; a gateway downstream stripped ttl?) "
            "(proxy.pipeline.observe).",
            ["provider"],
            registry=r,
        )
        self.keepwarm_pings = Counter(
            "promptcache_keepwarm_pings_total",
            "Keep-warm pings sent upstream, by outcome (ok, error: the window closed) (proxy.keepwarm).",
            ["provider", "outcome"],
            registry=r,
        )
        self.keepwarm_cost = Counter(
            "promptcache_keepwarm_cost_usd_total",
            "USD the keep-warm pings cost, from their usage at list prices (proxy.keepwarm).",
            ["provider"],
            registry=r,
        )
        self.keepwarm_saved = Counter(
            "promptcache_keepwarm_saved_read_tokens_total",
            "Tokens read by requests whose entry only keep-warm pings kept alive (proxy.keepwarm).",
            ["provider"],
            registry=r,
        )
        self.signed_requests = Counter(
            "promptcache_signed_requests_total",
            "Requests signed over their body (SigV4), forwarded byte-identical and measured only (proxy.handlers).",
            ["provider"],
            registry=r,
        )
        self.upstream_moves = Counter(
            "promptcache_upstream_moves_total",
            "Sessions moved to another base URL of their upstream after a connect error, 5xx or 429; "
            "each move costs a cold cache write (proxy.affinity).",
            ["provider"],
            registry=r,
        )
        self.replayed_messages = Counter(
            "promptcache_replayed_messages_total",
            "Earlier messages sent as the exact bytes sent before (proxy.pipeline.replay).",
            ["provider"],
            registry=r,
        )
        self.prompt_bytes = Counter(
            "promptcache_prompt_bytes_total",
            "Canonical prompt bytes of measured requests (proxy.measure).",
            ["provider"],
            registry=r,
        )
        self.prefix_matched_bytes = Counter(
            "promptcache_prefix_matched_bytes_total",
            "Prompt bytes before the first divergence from the session's previous request (proxy.measure).",
            ["provider"],
            registry=r,
        )
        self.divergences = Counter(
            "promptcache_prefix_divergences_total",
            "Requests by the section and cause of their first prefix divergence (proxy.measure).",
            ["provider", "section", "cause"],
            registry=r,
        )
        self.divergence_ratio = Histogram(
            "promptcache_prefix_divergence_position_ratio",
            "Position of the first divergence as a share of the prompt, 1 = pure append (proxy.measure).",
            ["provider"],
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.divergence_tokens = Histogram(
            "promptcache_prefix_divergence_position_tokens",
            "Estimated tokens before the first divergence (proxy.measure).",
            ["provider"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.predicted_read_tokens = Counter(
            "promptcache_predicted_cache_read_tokens_total",
            "Estimated prompt tokens the previous request's breakpoints should let this one read "
            '(compare with promptcache_input_tokens_total{cache="read"}) (proxy.measure).',
            ["provider"],
            registry=r,
        )
        self.cost = Counter(
            "promptcache_cost_usd_total",
            "List-price cost of the upstream usage in USD, by model family (proxy.measure).",
            ["provider", "family"],
            registry=r,
        )
        self.uncached_cost = Counter(
            "promptcache_uncached_cost_usd_total",
            "Counterfactual cost in USD had no prompt token been cached; minus "
            "promptcache_cost_usd_total = savings (proxy.measure).",
            ["provider", "family"],
            registry=r,
        )
        self.upstream_miss_reasons = Counter(
            "promptcache_upstream_cache_miss_reasons_total",
            "Responses with upstream cache diagnostics, by the upstream's reason and promptcache's "
            "own cause (proxy.measure).",
            ["reason", "cause"],
            registry=r,
        )
        self.diagnostics_agreement = Counter(
            "promptcache_diagnostics_agreement_total",
            "Responses with upstream cache diagnostics, by whether the upstream's reason agrees with "
            "promptcache's own divergence cause (unknown: first request, pending, not found, "
            "unavailable) (proxy.measure).",
            ["provider", "result"],
            registry=r,
        )
        for provider in PROVIDERS:
            for result in AGREEMENT:
                self.diagnostics_agreement.labels(provider, result)
        self.store_duration = ThreadSafeHistogram(
            "promptcache_session_store_operation_duration_seconds",
            "Session store operation time (proxy.store).",
            ["backend", "operation"],
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.store_errors = ThreadSafeCounter(
            "promptcache_session_store_errors_total",
            "Session store failures; the request went on without replay (proxy.store).",
            ["backend", "operation"],
            registry=r,
        )
        self.team_requests = Counter(
            "promptcache_team_requests_total",
            "Pipeline requests with upstream usage, by team (bounded: allowlist + other) (proxy.pipeline.observe).",
            ["team"],
            registry=r,
        )
        self.team_input_tokens = Counter(
            "promptcache_team_input_tokens_total",
            "Prompt tokens by team and cache read/write/none; read / sum = the team's hit ratio "
            "(proxy.pipeline.observe).",
            ["team", "cache"],
            registry=r,
        )
        self.team_cost = Counter(
            "promptcache_team_cost_usd_total",
            "List-price cost of the upstream usage in USD, by team (proxy.measure).",
            ["team"],
            registry=r,
        )
        self.team_uncached_cost = Counter(
            "promptcache_team_uncached_cost_usd_total",
            "Cost in USD had no prompt token been cached, by team; minus promptcache_team_cost_usd_total "
            "= the team's savings (proxy.measure).",
            ["team"],
            registry=r,
        )
        self.teams: dict[str, TeamMetrics] = {}
        """Label children by team, filled by `team_metrics` (values bounded by `proxy.teams`)."""
        self.upstream_info = Gauge(
            "promptcache_upstream_info",
            "1 per provider for the upstream in use: mode real, sim (the built-in simulator) or "
            "custom, and its host (proxy.app).",
            ["provider", "mode", "host"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.store_pending_writes = Gauge(
            "promptcache_session_store_pending_writes",
            "Session records saved in the background and not yet written (proxy.store).",
            ["backend"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.store_dropped_writes = ThreadSafeCounter(
            "promptcache_session_store_writes_dropped_total",
            "Session records not saved because too many writes were pending; the next turn of "
            "that session goes without replay (proxy.store).",
            ["backend"],
            registry=r,
        )
        self.store_local_reads = ThreadSafeCounter(
            "promptcache_session_store_local_reads_total",
            "Session store loads answered without a store read: a record this process wrote last, "
            "or a key the store cannot hold (its key filter); only when no other process writes "
            "the store (a single-process `serve` on SQLite) (proxy.store).",
            ["backend"],
            registry=r,
        )
        self.pipeline_budget_exceeded = Counter(
            "promptcache_pipeline_budget_exceeded_total",
            "Requests over the pipeline budget (pipeline_budget_bytes, pipeline_budget_blocks, "
            "pipeline_budget_nodes, pipeline_budget_values): forwarded as sent, not optimised, measured "
            "or stored; by kind bytes, blocks, nodes or values "
            "(proxy.pipeline.budget).",
            ["kind"],
            registry=r,
        )
        for kind in ("bytes", "blocks"):
            self.pipeline_budget_exceeded.labels(kind)
        self.pipeline_admission_waits = Counter(
            "promptcache_pipeline_admission_waits_total",
            "Requests that waited for the request stages because the bodies inside them held "
            "pipeline_inflight_bytes (none is refused) (proxy.admission).",
            registry=r,
        )
        self.store_evictions = ThreadSafeCounter(
            "promptcache_session_store_evictions_total",
            "Session records the store evicted, least recently written first, to stay within a byte "
            "cap: cap=tenant (store_max_bytes_per_tenant) or total (store_max_bytes); that "
            "session's next turn goes without replay (proxy.store).",
            ["backend", "cap"],
            registry=r,
        )
        self.store_skipped = ThreadSafeCounter(
            "promptcache_session_store_records_skipped_total",
            "Session records not stored because one alone is larger than store_max_bytes_per_tenant "
            "(proxy.store).",
            ["backend"],
            registry=r,
        )
        self.store_faults = ThreadSafeCounter(
            "promptcache_session_store_faults_total",
            "Session store failures by cause (file_gone, disk_full, read_only, cannot_open, corrupt, "
            "locked, unavailable, unresponsive, timeout, other); a request never failed on one "
            "(proxy.store).",
            ["backend", "kind"],
            registry=r,
        )
        self.store_healthy = Gauge(
            "promptcache_session_store_healthy",
            "1 while the session store takes writes, 0 while it is unhealthy (disk full, read-only, "
            "unreachable): /readyz answers 503 naming the cause (proxy.store).",
            ["backend"],
            registry=r,
        )
        self.record_errors = Counter(
            "promptcache_record_errors_total",
            "Requests the trace recorder (`record`) could not write; the request went on (proxy.trace_recorder).",
            registry=r,
        )
        self.rules_budget_exceeded = Counter(
            "promptcache_rules_budget_exceeded_total",
            "Requests whose text exceeded the rules' scan budget, by stage: session (replay "
            "masking, `classify_budget_chars`: the rest was not masked), reorder and pin "
            "(`reorder_budget_chars`: the system prompt was left as sent), history (the session "
            "map's tiers) (proxy.pipeline).",
            ["stage"],
            registry=r,
        )
        for stage in BUDGET_STAGES:
            self.rules_budget_exceeded.labels(stage)
        self.malformed_parts = Counter(
            "promptcache_malformed_parts_total",
            "Parts of request bodies skipped by a stage because a structural field has the wrong "
            "type (block_type, role, tool_name, call_name); the rest of the request was still "
            "optimised (proxy.malformed).",
            ["stage", "kind"],
            registry=r,
        )
        for stage in STAGES:
            for kind in MALFORMED_KINDS:
                self.malformed_parts.labels(stage, kind)
        self.connections_closed = Counter(
            "promptcache_connections_closed_total",
            "Client connections promptcache closed because a limit was exceeded: idle, "
            "header_timeout, body_timeout, header_too_large, too_many_connections, too_many_client_connections "
            "(proxy.connections).",
            ["reason"],
            registry=r,
        )
        self.connections_closed_by_reason: dict[str, Counter] = {
            reason: self.connections_closed.labels(reason) for reason in CLOSE_REASONS
        }
        self.build = Info("promptcache_build", "Version of the running promptcache.", registry=r)
        self.build.info({"version": __version__})

        self.stage_timers: dict[str, Histogram] = {s: self.stage_duration.labels(s) for s in STAGES}
        """`stage_duration` children by stage, resolved once (no `.labels()` per request)."""
        self.stage_error_counters: dict[str, Counter] = {s: self.stage_errors.labels(s) for s in STAGES}
        """`stage_errors` children by stage."""
        for backend in STORE_BACKENDS:
            for operation in STORE_OPERATIONS:
                self.store_duration.labels(backend, operation)
                self.store_errors.labels(backend, operation)
            self.store_pending_writes.labels(backend)
            self.store_dropped_writes.labels(backend)
            self.store_local_reads.labels(backend)
            self.store_skipped.labels(backend)
            for cap in STORE_CAPS:
                self.store_evictions.labels(backend, cap)
            for kind in FAULT_KINDS:
                self.store_faults.labels(backend, kind)
        self.by_provider: dict[str, ProviderMetrics] = {}
        self.measure: dict[str, MeasureMetrics] = {}
        for provider in PROVIDERS:
            names = families.get(provider, (OTHER_FAMILY,))
            self.measure[provider] = MeasureMetrics(
                provider=provider,
                prompt_bytes=self.prompt_bytes.labels(provider),
                matched_bytes=self.prefix_matched_bytes.labels(provider),
                divergence_ratio=self.divergence_ratio.labels(provider),
                divergence_tokens=self.divergence_tokens.labels(provider),
                predicted_read_tokens=self.predicted_read_tokens.labels(provider),
                divergences={pair: self.divergences.labels(provider, *pair) for pair in DIVERGENCE_LABELS},
                families=frozenset(names) | {OTHER_FAMILY},
                cost_metric=self.cost,
                uncached_cost_metric=self.uncached_cost,
                cost={},
            )
            self.prompt_bytes.labels(provider)
            self.prefix_matched_bytes.labels(provider)
            self.divergence_ratio.labels(provider)
            self.divergence_tokens.labels(provider)
            self.by_provider[provider] = ProviderMetrics(
                outcome={o: self.requests.labels(provider, o) for o in OUTCOMES},
                in_flight=self.in_flight.labels(provider),
                duration=self.duration.labels(provider),
                first_byte=self.first_byte.labels(provider),
                overhead=self.overhead.labels(provider),
                input_tokens={c: self.input_tokens.labels(provider, c) for c in CACHE_KINDS},
                output_tokens=self.output_tokens.labels(provider),
                body_too_large=self.too_large.labels(provider),
                replayed_messages=self.replayed_messages.labels(provider),
                breakpoints={a: self.breakpoints.labels(provider, a) for a in BREAKPOINT_ACTIONS},
                ttl_downgrades=self.ttl_downgrades.labels(provider),
                keepwarm_pings={o: self.keepwarm_pings.labels(provider, o) for o in ("ok", "error")},
                keepwarm_cost=self.keepwarm_cost.labels(provider),
                keepwarm_saved=self.keepwarm_saved.labels(provider),
                signed=self.signed_requests.labels(provider),
                upstream_moves=self.upstream_moves.labels(provider),
            )
