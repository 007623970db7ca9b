"""TTL from pacing: 5m or 1h cache markers, from the gaps observed between requests. Pure.

Inputs are request start times (epoch seconds, oldest first); a provider cache entry lives from
the start of the request that wrote or last read it (PROVIDERS.md 1.7), so the gaps between
request starts are exactly what decides hits.

Rule (`choose_ttl`), per session or per prefix shared by a tenant's sessions:
1. With no gap observed yet, `5m`.
2. The expected gap is the median of the last `RECENT_GAPS` gaps. At or below 5 minutes, a 5m
   entry is read before it expires: `5m`.
3. Otherwise compare the expected cost, in multiples of the base input price per prefix token,
   of writing now and of the expected future turns `n`:
   - `p(T)`: chance that the next gap is at most `T` (a hit with TTL `T`), smoothed:
     `(gaps <= T + PRIOR) / (len(gaps) + 2 * PRIOR)`;
   - `n = q / (1 - q)` with `q = p(1h)` (a geometric run of continuations), at most
     `MAX_EXPECTED_READS`;
   - `cost(T) = write(T) + n * (p(T) * READ + (1 - p(T)) * write(T))`, with `write(5m) = 1.25`,
     `write(1h) = 2.0`, `READ = 0.1` (PROVIDERS.md 1.9).
   `1h` when `cost(1h) < cost(5m)`, else `5m`.
`plan_ttls` returns the TTL of the tenant-shared prefix and of the session: the shared prefix
precedes the session's markers, and a 1h entry must not follow a 5m one, so a 1h session lifts
the shared prefix to 1h. The breakpoint planner gives the session TTL to every marker it plans,
the client's own included (a 1h session turns a client's 5m tail marker into 1h: the newest
message is what the next turn, more than 5 minutes away, must read).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

Ttl = Literal["5m", "1h"]

FIVE_MINUTES: Final = 300.0
ONE_HOUR: Final = 3600.0
WRITE_5M: Final = 1.25
WRITE_1H: Final = 2.0
READ: Final = 0.1
PRIOR: Final = 0.5
RECENT_GAPS: Final = 8
MAX_ARRIVALS: Final = 16
"""Arrival times worth keeping per session or shared prefix (the rest is never read)."""
MAX_EXPECTED_READS: Final = 20.0


@dataclass(frozen=True, slots=True)
class TtlChoice:
    """A TTL and the numbers behind it (for notes and explanations)."""

    ttl: Ttl
    expected_gap: float | None
    """Median of recent gaps, seconds; `None` before the second request."""
    expected_reads: float
    cost_5m: float
    """Expected cost per prefix token, in multiples of the base input price."""
    cost_1h: float


def gaps(arrivals: Sequence[float]) -> tuple[float, ...]:
    """Seconds between consecutive arrivals, the last `RECENT_GAPS` (never negative)."""
    out = tuple(max(0.0, b - a) for a, b in zip(arrivals, arrivals[1:], strict=False))
    return out[-RECENT_GAPS:]


def hit_probability(observed: Sequence[float], ttl_seconds: float) -> float:
    """Smoothed chance that the next gap is at most `ttl_seconds`."""
    hits = sum(1 for g in observed if g <= ttl_seconds)
    return (hits + PRIOR) / (len(observed) + 2 * PRIOR)


def expected_cost(observed: Sequence[float], ttl: Ttl) -> float:
    """Write now plus the expected future turns (module docstring, rule 3)."""
    q = hit_probability(observed, ONE_HOUR)
    n = min(q / (1.0 - q), MAX_EXPECTED_READS)
    write, seconds = (WRITE_1H, ONE_HOUR) if ttl == "1h" else (WRITE_5M, FIVE_MINUTES)
    p = hit_probability(observed, seconds)
    return write + n * (p * READ + (1.0 - p) * write)


def choose_ttl(arrivals: Sequence[float]) -> TtlChoice:
    """The TTL for markers written now, given the arrivals so far (this request included)."""
    observed = gaps(arrivals)
    if not observed:
        return TtlChoice("5m", None, 0.0, WRITE_5M, WRITE_1H)
    q = hit_probability(observed, ONE_HOUR)
    reads = min(q / (1.0 - q), MAX_EXPECTED_READS)
    gap = statistics.median(observed)
    cost_5m = expected_cost(observed, "5m")
    cost_1h = expected_cost(observed, "1h")
    ttl: Ttl = "1h" if gap > FIVE_MINUTES and cost_1h < cost_5m else "5m"
    return TtlChoice(ttl, gap, reads, cost_5m, cost_1h)


def plan_ttls(session_arrivals: Sequence[float], shared_arrivals: Sequence[float]) -> tuple[Ttl, Ttl]:
    """`(shared prefix TTL, session TTL)`; the shared one is never shorter than the session's."""
    session = choose_ttl(session_arrivals).ttl
    shared = choose_ttl(shared_arrivals).ttl
    if session == "1h":
        shared = "1h"
    return shared, session
