"""Replay results: per-strategy tallies per trace and in total, and their text / markdown / JSON.

Units: tokens for every count, USD for every cost. Costs are **input side only** (uncached
input, cache writes by TTL, cache reads, priced per model by `rules/pricing.yaml` through
`proxy.pricing`); output tokens are the same under every strategy and are left out so savings
compare caching alone. `uncached_cost` prices every input token at the plain input price (no
caching at all); savings are `uncached_cost - cost` (negative when writes cost more than
reads saved). Hit ratio = read / all input tokens; `hit2+` the same over requests 2..N of each
trace (the first request can never read). Attainment = a strategy's read tokens / the oracle's
clairvoyant read bound (`oracle.py`); `cost/min` = a strategy's cost / the oracle's clairvoyant
minimum cost. The causal bound (`oracle.py`) is printed beside the optimum, never used for
attainment.

A trace with a 2xx response that carried no usage (aider on Chat Completions streams without
`stream_options.include_usage`) has unknown reads: it is named (`without usage`), its rows say
so, and it is left out of totals, the optimum and attainment instead of counting as 0 reads.

An errored request (non-2xx) is counted in `errors` and charged as uncached input of the
client's prompt (the oracle's token count): the client would have to send it again without
whatever broke it.

Divergence causes (`Tally.causes`, `RequestOutcome.cause`): requests per cause of
`proxy.metrics.CAUSES`, measured as `proxy/workloads/causes.py` describes (2xx requests
only). The text output prints them, non-zero ones in `CAUSES` order, on one `causes:` line per
trace and strategy and per strategy in total; the JSON output carries them as `causes` objects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from proxy.metrics import CAUSES
from proxy.workloads.strategies import STRATEGIES


@dataclass(slots=True)
class Tally:
    """Token and cost totals of one strategy over some requests."""

    requests: int = 0
    errors: int = 0
    read: int = 0
    write_5m: int = 0
    write_1h: int = 0
    none: int = 0
    """Input tokens neither read nor written."""
    cost: float = 0.0
    uncached_cost: float = 0.0
    causes: dict[str, int] = field(default_factory=dict)
    """Requests per divergence cause (`proxy.metrics.CAUSES`)."""
    no_usage: int = 0
    """2xx responses that carried no usage (a Chat stream without `stream_options.include_usage`):
    their tokens are unknown, so they count as none of read / written / neither."""

    def add(self, other: Tally) -> None:
        for name in ("requests", "errors", "read", "write_5m", "write_1h", "none", "no_usage"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cost += other.cost
        self.uncached_cost += other.uncached_cost
        for cause, n in other.causes.items():
            self.causes[cause] = self.causes.get(cause, 0) + n

    @property
    def write(self) -> int:
        return self.write_5m + self.write_1h

    @property
    def input(self) -> int:
        return self.read + self.write + self.none

    @property
    def hit_ratio(self) -> float:
        return self.read / self.input if self.input else 0.0

    @property
    def savings(self) -> float:
        """USD saved against no caching at all."""
        return self.uncached_cost - self.cost

    @property
    def savings_ratio(self) -> float:
        return self.savings / self.uncached_cost if self.uncached_cost else 0.0


@dataclass(slots=True)
class KeepWarmTally:
    """Keep-warm pings of one strategy over one trace (tokens, USD)."""

    pings: int = 0
    read: int = 0
    """Prompt tokens the pings read (each refreshes the entry it reads)."""
    cost: float = 0.0
    """Input-side USD of the pings (included in the strategy's `Tally.cost`)."""


@dataclass(slots=True)
class RequestOutcome:
    """One request under one strategy."""

    status: int
    read: int
    write_5m: int
    write_1h: int
    none: int
    cost: float
    uncached_cost: float
    error: str = ""
    cause: str | None = None
    """Divergence cause of the request (`None` for a failed request, or when the proxy measured
    none for it)."""
    has_usage: bool = True
    """False for a 2xx response without usage (`Tally.no_usage`)."""


@dataclass(slots=True)
class TraceResult:
    name: str
    requests: int
    optimum_read: int
    optimum_total: int
    """Client prompt tokens over the trace (the oracle's raw-form count)."""
    limit_binding: int = 0
    """Requests whose ideal plan needed more than 4 markers (optimum may be unattainable)."""
    tallies: dict[str, Tally] = field(default_factory=dict)
    outcomes: dict[str, list[RequestOutcome]] = field(default_factory=dict)
    stage_errors: int = 0
    """Pipeline stage failures (fail-open passthroughs) counted by the promptcache proxy."""
    optimum_reads: list[int] = field(default_factory=list)
    """The oracle's read bound of each request (tokens)."""
    client_totals: list[int] = field(default_factory=list)
    """Prompt tokens of each request as the client sent it (the oracle's raw-form count)."""
    causal_read: int = 0
    """The causal bound's read tokens (printed beside the optimum, never used for attainment)."""
    min_cost: float = 0.0
    """The clairvoyant minimum input cost of the trace (USD)."""
    keep_warm: dict[str, KeepWarmTally] = field(default_factory=dict)
    """Keep-warm pings per strategy (only when replayed with `--keep-warm`)."""

    @property
    def optimum_share(self) -> float:
        return self.optimum_read / self.optimum_total if self.optimum_total else 0.0

    @property
    def causal_share(self) -> float:
        return self.causal_read / self.optimum_total if self.optimum_total else 0.0

    @property
    def optimum_share_after_first(self) -> float:
        """The clairvoyant read share over requests 2..N."""
        total = sum(self.client_totals[1:])
        return sum(self.optimum_reads[1:]) / total if total else 0.0

    def share_after_first(self, strategy: str) -> float:
        """A strategy's read share over requests 2..N (read / all input of those requests)."""
        outcomes = self.outcomes.get(strategy, [])[1:]
        total = sum(o.read + o.write_5m + o.write_1h + o.none for o in outcomes)
        return sum(o.read for o in outcomes) / total if total else 0.0

    def cost_ratio(self, strategy: str) -> float:
        """A strategy's input cost / the clairvoyant minimum (0 when the minimum is 0)."""
        return self.tallies[strategy].cost / self.min_cost if self.min_cost else 0.0

    def attainment(self, strategy: str) -> float:
        """Read tokens / optimum read tokens (1.0 when the optimum is 0)."""
        read = self.tallies[strategy].read
        return read / self.optimum_read if self.optimum_read else 1.0

    @property
    def has_usage(self) -> bool:
        """False when some 2xx response of the trace carried no usage, under any strategy: its
        reads are unknown, so the trace is named and left out of totals and attainment."""
        return not any(t.no_usage for t in self.tallies.values())


@dataclass(slots=True)
class Report:
    traces: list[TraceResult] = field(default_factory=list)

    @property
    def strategies(self) -> list[str]:
        seen = {s for t in self.traces for s in t.tallies}
        return [s for s in STRATEGIES if s in seen]

    @property
    def counted(self) -> list[TraceResult]:
        """The traces in totals and attainment: those whose responses all carried usage."""
        return [t for t in self.traces if t.has_usage]

    @property
    def without_usage(self) -> list[str]:
        """Names of the traces left out of totals (`TraceResult.has_usage`)."""
        return [t.name for t in self.traces if not t.has_usage]

    def total(self, strategy: str) -> Tally:
        out = Tally()
        for trace in self.counted:
            if strategy in trace.tallies:
                out.add(trace.tallies[strategy])
        return out

    @property
    def optimum_read(self) -> int:
        return sum(t.optimum_read for t in self.counted)

    @property
    def optimum_total(self) -> int:
        return sum(t.optimum_total for t in self.counted)

    def attainment(self, strategy: str) -> float:
        return self.total(strategy).read / self.optimum_read if self.optimum_read else 1.0

    @property
    def causal_read(self) -> int:
        return sum(t.causal_read for t in self.counted)

    @property
    def min_cost(self) -> float:
        return sum(t.min_cost for t in self.counted)

    def cost_ratio(self, strategy: str) -> float:
        return self.total(strategy).cost / self.min_cost if self.min_cost else 0.0

    def share_after_first(self, strategy: str) -> float:
        """Read share over requests 2..N of every trace."""
        read = total = 0
        for trace in self.counted:
            for o in trace.outcomes.get(strategy, [])[1:]:
                read += o.read
                total += o.read + o.write_5m + o.write_1h + o.none
        return read / total if total else 0.0

    @property
    def optimum_share_after_first(self) -> float:
        read = sum(sum(t.optimum_reads[1:]) for t in self.counted)
        total = sum(sum(t.client_totals[1:]) for t in self.counted)
        return read / total if total else 0.0


# --- output -------------------------------------------------------------------------------

_HEAD = (
    f"{'trace':<26} {'strategy':<11} {'reqs':>4} {'err':>3} {'read':>9} {'write':>9} {'none':>9} "
    f"{'hit':>6} {'hit2+':>6} {'cost $':>9} {'saved':>7} {'attain':>6} {'cost/min':>8}"
)


def _row(name: str, strategy: str, tally: Tally, share: float, attainment: float, cost_ratio: float) -> str:
    return (
        f"{name:<26} {strategy:<11} {tally.requests:>4} {tally.errors:>3} {tally.read:>9} {tally.write:>9} "
        f"{tally.none:>9} {tally.hit_ratio:>6.1%} {share:>6.1%} {tally.cost:>9.4f} {tally.savings_ratio:>7.1%} "
        f"{attainment:>6.3f} {cost_ratio:>8.3f}"
    )


def _bound_rows(name: str, requests: str, read: int, share: float, share2: float, cost: float | None) -> str:
    money = f"{cost:>9.4f}" if cost is not None else f"{'':>9}"
    return (
        f"{name:<26} {'optimum':<11} {requests:>4} {'':>3} {read:>9} {'':>9} {'':>9} {share:>6.1%} "
        f"{share2:>6.1%} {money}"
    )


def ordered_causes(causes: dict[str, int]) -> dict[str, int]:
    """Non-zero counts in `CAUSES` order, then any other label alphabetically."""
    known = [c for c in CAUSES if causes.get(c)]
    other = sorted(c for c in causes if c not in CAUSES and causes[c])
    return {c: causes[c] for c in (*known, *other)}


def _causes_row(name: str, strategy: str, tally: Tally) -> str:
    found = ordered_causes(tally.causes)
    text = ", ".join(f"{cause} {n}" for cause, n in found.items()) if found else "-"
    return f"{name:<26} {strategy:<11} causes: {text}"


def format_requests(trace: TraceResult) -> list[str]:
    """One line per request: read / written / neither tokens per strategy, and the optimum."""
    strategies = list(trace.outcomes)
    head = (
        f"{trace.name}: request" + "".join(f"  {s + ' r/w/n':>24}" for s in strategies) + f"  {'optimum':>9}"
    )
    lines = [head]
    for i, bound in enumerate(trace.optimum_reads):
        cells = []
        for s in strategies:
            o = trace.outcomes[s][i]
            cell = "error" if o.status >= 300 else f"{o.read}/{o.write_5m + o.write_1h}/{o.none}"
            cells.append(f"  {cell:>24}")
        lines.append(f"{'':<{len(trace.name)}}  {i:>7}" + "".join(cells) + f"  {bound:>9}")
    return lines


def _keep_warm_row(name: str, strategy: str, tally: KeepWarmTally) -> str:
    return (
        f"{name:<26} {strategy:<11} keep-warm: {tally.pings} pings, {tally.read} tokens read, "
        f"${tally.cost:.4f}"
    )


def format_text(report: Report, per_request: bool = False) -> str:
    """Per trace and strategy, then totals; per trace and in total one `optimum` line (the
    clairvoyant read bound and minimum cost), one `causal` line (the causal read bound) and one
    `causes:` line per strategy (and, when asked, one line per request before each trace's rows)."""
    lines = [_HEAD, "-" * len(_HEAD)]
    for trace in report.traces:
        if per_request:
            lines.extend(format_requests(trace))
        if not trace.has_usage:
            for strategy in report.strategies:
                if strategy in trace.tallies:
                    tally = trace.tallies[strategy]
                    lines.append(
                        f"{trace.name:<26} {strategy:<11} {tally.requests:>4} {tally.errors:>3} "
                        f"no usage in {tally.no_usage} responses: left out of the totals"
                    )
            continue
        for strategy in report.strategies:
            if strategy in trace.tallies:
                lines.append(
                    _row(
                        trace.name,
                        strategy,
                        trace.tallies[strategy],
                        trace.share_after_first(strategy),
                        trace.attainment(strategy),
                        trace.cost_ratio(strategy),
                    )
                )
        note = f"  ({trace.limit_binding} requests need > 4 markers)" if trace.limit_binding else ""
        errors = f"; {trace.stage_errors} pipeline stage errors" if trace.stage_errors else ""
        lines.append(
            _bound_rows(
                trace.name,
                str(trace.requests),
                trace.optimum_read,
                trace.optimum_share,
                trace.optimum_share_after_first,
                trace.min_cost,
            )
            + note
            + errors
        )
        lines.append(
            f"{trace.name:<26} {'causal':<11} {'':>4} {'':>3} {trace.causal_read:>9} {'':>9} {'':>9} "
            f"{trace.causal_share:>6.1%}"
        )
        for strategy in report.strategies:
            if strategy in trace.tallies:
                lines.append(_causes_row(trace.name, strategy, trace.tallies[strategy]))
            if strategy in trace.keep_warm:
                lines.append(_keep_warm_row(trace.name, strategy, trace.keep_warm[strategy]))
    lines.append("-" * len(_HEAD))
    for strategy in report.strategies:
        lines.append(
            _row(
                "TOTAL",
                strategy,
                report.total(strategy),
                report.share_after_first(strategy),
                report.attainment(strategy),
                report.cost_ratio(strategy),
            )
        )
    share = report.optimum_read / report.optimum_total if report.optimum_total else 0.0
    causal = report.causal_read / report.optimum_total if report.optimum_total else 0.0
    lines.append(
        _bound_rows("TOTAL", "", report.optimum_read, share, report.optimum_share_after_first, report.min_cost)
    )
    lines.append(f"{'TOTAL':<26} {'causal':<11} {'':>4} {'':>3} {report.causal_read:>9} {'':>9} {'':>9} {causal:>6.1%}")
    for strategy in report.strategies:
        lines.append(_causes_row("TOTAL", strategy, report.total(strategy)))
    if report.without_usage:
        lines.append(f"left out of the totals (responses without usage): {', '.join(report.without_usage)}")
    return "\n".join(lines)


def to_json(report: Report, per_request: bool = False) -> dict[str, Any]:
    """A JSON-ready dict: per trace, per strategy tallies (and outcomes when asked), totals."""

    def tally(t: Tally) -> dict[str, Any]:
        return {
            **asdict(t),
            "causes": ordered_causes(t.causes),
            "write": t.write,
            "input": t.input,
            "hit_ratio": t.hit_ratio,
            "savings": t.savings,
            "savings_ratio": t.savings_ratio,
        }

    traces = []
    for trace in report.traces:
        item: dict[str, Any] = {
            "trace": trace.name,
            "requests": trace.requests,
            "optimum": {
                "read": trace.optimum_read,
                "input": trace.optimum_total,
                "share": trace.optimum_share,
                "share_after_first": trace.optimum_share_after_first,
                "min_cost": trace.min_cost,
                "limit_binding": trace.limit_binding,
            },
            "causal": {"read": trace.causal_read, "share": trace.causal_share},
            "stage_errors": trace.stage_errors,
            "has_usage": trace.has_usage,
            "strategies": {
                s: {
                    **tally(t),
                    "attainment": trace.attainment(s),
                    "share_after_first": trace.share_after_first(s),
                    "cost_ratio": trace.cost_ratio(s),
                }
                for s, t in trace.tallies.items()
            },
        }
        if trace.keep_warm:
            item["keep_warm"] = {s: asdict(k) for s, k in trace.keep_warm.items()}
        if per_request:
            item["outcomes"] = {s: [asdict(o) for o in outs] for s, outs in trace.outcomes.items()}
        traces.append(item)
    totals = {
        s: {
            **tally(report.total(s)),
            "attainment": report.attainment(s),
            "share_after_first": report.share_after_first(s),
            "cost_ratio": report.cost_ratio(s),
        }
        for s in report.strategies
    }
    return {
        "traces": traces,
        "total": totals,
        "optimum": {
            "read": report.optimum_read,
            "input": report.optimum_total,
            "share_after_first": report.optimum_share_after_first,
            "min_cost": report.min_cost,
        },
        "causal": {"read": report.causal_read},
        "without_usage": report.without_usage,
    }
