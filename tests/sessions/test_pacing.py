"""Pacing: the predictor and the TTL cost rule, exact values of the pure core."""

from __future__ import annotations

import pytest

from proxy.pacing import (
    BREAK_EVEN,
    END_PRIOR,
    HUMAN,
    HUMAN_PRIOR,
    MAX_GAPS,
    MAX_RESPONSES,
    TOOL,
    TOOL_PRIOR,
    Forecast,
    Pacing,
    choose_ttls,
    forecast,
    tail_pays,
)


def test_a_new_tenant_starts_from_the_documented_prior() -> None:
    f = forecast(Pacing(), Pacing())
    assert (f.p_end, f.human_soon, f.human_hour, f.tool_soon, f.tool_hour) == (
        END_PRIOR,
        *HUMAN_PRIOR,
        *TOOL_PRIOR,
    )
    assert f.next_hour == pytest.approx(0.3 * 0.40 + 0.7 * 0.02)
    # a first request of a new tenant: a 5m tail (the chance 0.134 is under the break-even 0.652)
    first = choose_ttls(f, expired=True)
    assert (first.shared, first.anchor, first.tail) == ("5m", "5m", "5m")


def test_gaps_are_split_by_the_kind_of_the_response_before_them() -> None:
    p = Pacing().with_gap(HUMAN, 600).with_gap(TOOL, 4).with_gap(None, 99).with_gap(HUMAN, 120)
    assert p.human == (600.0, 120.0) and p.tool == (4.0,)
    p = p.with_response(HUMAN).with_response(TOOL).with_response(TOOL).with_response(None)
    assert (p.ends, p.responses) == (1, 3)
    f = forecast(p, Pacing())
    assert (f.p_end, f.human_soon, f.human_hour, f.tool_soon, f.tool_hour) == (1 / 3, 0.5, 0.5, 1.0, 0.0)
    assert f.next_hour == pytest.approx(1 / 6)


def test_session_and_tenant_samples_pool_and_the_prior_goes_once_a_kind_is_seen() -> None:
    session = Pacing(human=(400.0,), ends=1, responses=1)
    tenant = Pacing(human=(30.0, 5000.0, 900.0), tool=(3.0,), ends=1, responses=3)
    f = forecast(session, tenant)
    assert (f.human_soon, f.human_hour) == (0.25, 0.5)
    assert (f.tool_soon, f.tool_hour) == (1.0, 0.0)
    assert f.p_end == 0.5
    only_human = forecast(Pacing(human=(30.0,)), Pacing())
    assert (only_human.tool_soon, only_human.tool_hour) == TOOL_PRIOR


def test_bounded_and_round_trips() -> None:
    p = Pacing()
    for i in range(MAX_GAPS + 5):
        p = p.with_gap(HUMAN, i)
    assert len(p.human) == MAX_GAPS and p.human[-1] == MAX_GAPS + 4
    for _ in range(MAX_RESPONSES):
        p = p.with_response(HUMAN)
    p = p.with_response(TOOL)
    assert (p.ends, p.responses) == (MAX_RESPONSES // 2, (MAX_RESPONSES + 1) // 2)
    assert Pacing.from_json(p.to_json()) == p
    assert Pacing.from_json({"h": ["x"]}) == Pacing()
    assert Pacing.from_json({"e": 5, "n": 2}) == Pacing()
    assert Pacing.from_json(None) == Pacing()


def test_break_even_of_a_1h_tail() -> None:
    # cost(5m) = 1.25 d + p (1.25 - 0.1) d against cost(1h) = 2 d: 1h when p > 0.75 / 1.15
    assert BREAK_EVEN == pytest.approx(0.75 / 1.15)

    def at(p: float) -> Forecast:
        return Forecast(p_end=1.0, human_soon=1 - p, human_hour=p, tool_soon=1.0, tool_hour=0.0)

    assert choose_ttls(at(0.65)).tail == "5m"
    assert choose_ttls(at(0.66)).tail == "1h"
    assert choose_ttls(at(1.0)) == choose_ttls(at(1.0), shared_live=True)
    assert (choose_ttls(at(1.0)).shared, choose_ttls(at(1.0)).anchor) == ("1h", "1h")


def test_six_minute_people_get_1h_thirty_second_people_never_do() -> None:
    six = Pacing(human=(360.0,) * 3, tool=(360.0,) * 3, ends=3, responses=6)
    choice = choose_ttls(forecast(six, Pacing()))
    assert (choice.shared, choice.anchor, choice.tail, choice.next_hour) == ("1h", "1h", "1h", 1.0)
    fast = Pacing(human=(30.0,) * 3, tool=(30.0,) * 3, ends=3, responses=6)
    choice = choose_ttls(forecast(fast, Pacing()), expired=True)
    assert (choice.shared, choice.anchor, choice.tail, choice.next_hour) == ("5m", "5m", "5m", 0.0)


def test_anchor_is_1h_while_it_lives_the_shared_prefix_when_alive_and_likely_needed() -> None:
    f = forecast(Pacing(human=(900.0, 60.0)), Pacing())  # next_hour = 0.3 * 0.5 + 0.7 * 0.02 = 0.164
    choice = choose_ttls(f)
    assert (choice.shared, choice.anchor, choice.tail) == ("5m", "1h", "5m")
    assert choose_ttls(f, expired=True).anchor == "5m"
    assert choose_ttls(f, shared_live=True).shared == "1h"


def test_a_subagent_tail_is_5m_whatever_the_pacing() -> None:
    six = Pacing(human=(360.0,) * 3, tool=(360.0,) * 3, ends=3, responses=6)
    choice = choose_ttls(forecast(six, Pacing()), agent=True)
    assert (choice.tail, choice.anchor) == ("5m", "1h")


def test_cost_guard_no_tail_when_the_conversation_is_predicted_to_end() -> None:
    # against sending the new tokens uncached: a 5m tail costs 0.25 more and saves 1.15 when read
    # within 5 minutes, a 1h tail 1.0 more and saves 1.15 when read within the hour
    def at(soon: float, hour: float) -> Forecast:
        return Forecast(p_end=1.0, human_soon=soon, human_hour=hour, tool_soon=1.0, tool_hour=0.0)

    assert at(0.2, 0.1).next_soon == 0.2
    assert not tail_pays(at(0.21, 0.0), "5m") and tail_pays(at(0.22, 0.0), "5m")  # 0.25 / 1.15 = 0.217
    assert not tail_pays(at(0.0, 0.86), "1h") and tail_pays(at(0.0, 0.87), "1h")  # 1.0 / 1.15 = 0.870
    # people who come back the next day: nothing written past the anchor
    gone = Pacing(human=(7200.0,) * 3, ends=3, responses=3)
    choice = choose_ttls(forecast(gone, Pacing()))
    assert (choice.tail, choice.next_hour, choice.write_tail) == ("5m", 0.0, False)
    # a 1h tail that would be read too rarely to repay its 1.0 either
    rare = choose_ttls(at(0.0, 0.7))
    assert (rare.tail, rare.write_tail) == ("1h", False)
    # the prior, six-minute and thirty-second people all write their tails
    assert choose_ttls(forecast(Pacing(), Pacing())).write_tail
    assert forecast(Pacing(), Pacing()).next_soon == pytest.approx(0.3 * 0.55 + 0.7 * 0.98)
    six = Pacing(human=(360.0,) * 3, tool=(360.0,) * 3, ends=3, responses=6)
    assert choose_ttls(forecast(six, Pacing())).write_tail
    # a subagent is machine-paced whatever its tenant's people do
    assert choose_ttls(forecast(gone, Pacing()), agent=True).write_tail


def test_the_share_of_turns_a_person_came_back_after() -> None:
    # prior 0.8 weighing as two turn-ending responses; human gaps seen over turns ended
    assert Pacing().return_share == pytest.approx(0.8)
    p = Pacing().with_response(HUMAN)
    assert p.return_share == pytest.approx(1.6 / 3)
    p = p.with_gap(HUMAN, 400.0).with_response(HUMAN)
    assert (p.ends, p.returns, p.return_share) == (2, 1, pytest.approx(2.6 / 4))
    p = p.with_gap(TOOL, 10.0)
    assert p.returns == 1  # a tool step is not a person coming back
    assert Pacing.from_json(p.to_json()) == p
    assert Pacing.from_json({"e": 1, "n": 2, "r": 5}).returns == 1  # never more than the turns ended
    assert Pacing.from_json({"e": 1, "n": 2}).returns == 0  # a record from before the field
