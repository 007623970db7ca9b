"""TTL from pacing: exact values of the pure core."""

from __future__ import annotations

import pytest

from proxy.pacing import choose_ttl, expected_cost, gaps, hit_probability, plan_ttls

T0 = 1_800_000_000.0


def every(seconds: float, n: int) -> list[float]:
    return [T0 + i * seconds for i in range(n)]


def test_gaps_are_recent_and_non_negative() -> None:
    assert gaps([T0, T0 + 3, T0 + 1]) == (3.0, 0.0)
    assert len(gaps(every(1, 20))) == 8


def test_hit_probability_is_smoothed() -> None:
    assert hit_probability([1200.0], 300.0) == 0.25
    assert hit_probability([1200.0], 3600.0) == 0.75


def test_costs_for_one_twenty_minute_gap() -> None:
    assert expected_cost([1200.0], "5m") == pytest.approx(1.25 + 3 * (0.25 * 0.1 + 0.75 * 1.25))
    assert expected_cost([1200.0], "1h") == pytest.approx(2.0 + 3 * (0.75 * 0.1 + 0.25 * 2.0))


def test_first_request_is_5m() -> None:
    choice = choose_ttl([T0])
    assert (choice.ttl, choice.expected_gap) == ("5m", None)


def test_twenty_minute_gaps_choose_1h() -> None:
    choice = choose_ttl(every(1200, 2))
    assert choice.ttl == "1h"
    assert choice.expected_gap == 1200.0
    assert choice.expected_reads == pytest.approx(3.0)
    assert choice.cost_1h == pytest.approx(3.725)
    assert choice.cost_5m == pytest.approx(4.1375)
    assert choose_ttl(every(1200, 10)).ttl == "1h"


def test_three_second_gaps_choose_5m() -> None:
    assert choose_ttl(every(3, 10)).ttl == "5m"


def test_gaps_beyond_an_hour_choose_5m() -> None:
    choice = choose_ttl(every(4000, 3))
    assert choice.ttl == "5m" and choice.cost_5m < choice.cost_1h


def test_median_gap_at_five_minutes_is_5m() -> None:
    assert choose_ttl(every(300, 5)).ttl == "5m"
    assert choose_ttl(every(301, 5)).ttl == "1h"


def test_shared_prefix_is_never_shorter_than_the_session() -> None:
    assert plan_ttls(every(1200, 3), every(3, 10)) == ("1h", "1h")
    assert plan_ttls(every(3, 10), every(1200, 3)) == ("1h", "5m")
    assert plan_ttls(every(3, 10), every(3, 10)) == ("5m", "5m")
