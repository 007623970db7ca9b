"""What-if of the forensic map's divider: move one block later, what would the cache read?

This is the one documented formula behind the divider of `/ui/sessions/{id}` and of
`promptcache explain --html`. It has two independent implementations that a test holds equal:
this module (Python) and `whatIf` in `proxy/ui/map.js` (the page recomputes live, offline).

Inputs:
- `tokens`: estimated tokens of each block of one request, in render order (`t_0 .. t_{n-1}`,
  `proxy.prefix.estimate_tokens` of each block's canonical bytes);
- `chosen` `c`: the block that changes from one request to the next (a volatile system line,
  the divergence block);
- `after` `k` (`c <= k <= n-1`): the divider; block `c` is moved to sit right after block `k`
  (`k = c` leaves the order as it is). The new order is `0..c-1, c+1..k, c, k+1..n-1`;
- `prices`: one row of `rules/pricing.yaml` (USD per million tokens) and `tail_ttl`, the TTL
  the recomputed tail is written with (`5m`, `1h`; `None` = not written: billed as input).

Formula (everything before the moved block is the same bytes every request, so it is read;
from the moved block on everything is recomputed and written again):

    cached(k) = sum(t_i for i <= k) - t_c
    tail(k)   = total - cached(k)                 total = sum(t_i)
    tail_price = cache_write_5m | cache_write_1h | input      (by tail_ttl)
    cost(k)   = (cached(k) * cache_read + tail(k) * tail_price) / 1_000_000     (USD)
    saving(k) = cost(c) - cost(k)

Output tokens are left out (they do not depend on the order). Evaluation order is fixed as
written (integer sums, then two products, one sum, one division) so that IEEE doubles give
the same figure in both implementations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from proxy.pricing import PER_TOKENS, Prices

TAIL_PRICE_FIELDS: Final = {"5m": "cache_write_5m", "1h": "cache_write_1h"}
"""`tail_ttl` -> the `Prices` field the tail is billed at; anything else bills `input`."""


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The divider's figures for one position (tokens are estimates, cost in USD)."""

    chosen: int
    after: int
    cached_tokens: int
    tail_tokens: int
    cost_usd: float
    baseline_cost_usd: float
    """`cost(c)`: the order as sent."""

    @property
    def saving_usd(self) -> float:
        return self.baseline_cost_usd - self.cost_usd


def tail_price(prices: Prices, tail_ttl: str | None) -> float:
    """Price per million tokens of the recomputed tail (see the module docstring)."""
    field = TAIL_PRICE_FIELDS.get(tail_ttl or "")
    return float(getattr(prices, field)) if field is not None else prices.input


def _cost(cached: int, tail: int, read_price: float, tail_rate: float) -> float:
    return (cached * read_price + tail * tail_rate) / PER_TOKENS


def what_if(tokens: Sequence[int], chosen: int, after: int, prices: Prices, tail_ttl: str | None = "5m") -> WhatIf:
    """The figures for moving block `chosen` to right after block `after` (module docstring).

    Raises `ValueError` unless `0 <= chosen <= after < len(tokens)`."""
    n = len(tokens)
    if not 0 <= chosen <= after < n:
        raise ValueError(f"need 0 <= chosen ({chosen}) <= after ({after}) < blocks ({n})")
    total = sum(tokens)
    cached = sum(tokens[: after + 1]) - tokens[chosen]
    rate = tail_price(prices, tail_ttl)
    baseline_cached = sum(tokens[:chosen])
    return WhatIf(
        chosen=chosen,
        after=after,
        cached_tokens=cached,
        tail_tokens=total - cached,
        cost_usd=_cost(cached, total - cached, prices.cache_read, rate),
        baseline_cost_usd=_cost(baseline_cached, total - baseline_cached, prices.cache_read, rate),
    )
