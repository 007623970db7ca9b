"""The divider's formula (`proxy.whatif`), on figures worked out by hand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.pricing import Prices
from proxy.whatif import tail_price, what_if

SONNET = Prices(input=3.0, output=15.0, cache_write_5m=3.75, cache_write_1h=6.0, cache_read=0.3)


def test_moving_the_volatile_block_to_the_end() -> None:
    tokens = [2000, 10, 300, 40]
    as_sent = what_if(tokens, 1, 1, SONNET, "5m")
    # Order as sent: 2000 read, 350 + 10 recomputed and written at 5m.
    assert (as_sent.cached_tokens, as_sent.tail_tokens) == (2000, 350)
    assert as_sent.cost_usd == (2000 * 0.3 + 350 * 3.75) / 1_000_000
    assert as_sent.saving_usd == 0
    moved = what_if(tokens, 1, 3, SONNET, "5m")
    # Block 1 after block 3: 2000 + 300 + 40 read, only the 10 tokens written.
    assert (moved.cached_tokens, moved.tail_tokens) == (2340, 10)
    assert moved.cost_usd == (2340 * 0.3 + 10 * 3.75) / 1_000_000
    assert moved.saving_usd == pytest.approx((340 * (3.75 - 0.3)) / 1_000_000)


def test_tail_price_follows_the_tail_ttl() -> None:
    assert tail_price(SONNET, "5m") == 3.75
    assert tail_price(SONNET, "1h") == 6.0
    assert tail_price(SONNET, None) == 3.0
    assert tail_price(SONNET, "30m") == 3.0
    assert what_if([100, 5], 0, 1, SONNET, "1h").cost_usd == (5 * 0.3 + 100 * 6.0) / 1_000_000


def test_rejects_a_divider_before_the_chosen_block() -> None:
    with pytest.raises(ValueError):
        what_if([1, 2, 3], 2, 1, SONNET)
    with pytest.raises(ValueError):
        what_if([1, 2, 3], 0, 3, SONNET)


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=40), st.data())
def test_tokens_are_conserved_and_the_prefix_only_grows(tokens: list[int], data: st.DataObject) -> None:
    chosen = data.draw(st.integers(0, len(tokens) - 1))
    previous = None
    for after in range(chosen, len(tokens)):
        r = what_if(tokens, chosen, after, SONNET)
        assert r.cached_tokens + r.tail_tokens == sum(tokens)
        assert r.tail_tokens >= tokens[chosen]
        if previous is not None:
            assert r.cached_tokens >= previous.cached_tokens and r.cost_usd <= previous.cost_usd
        previous = r
