"""proxy.rerender: which volatile-only changes of a message are a client re-rendering it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.pipeline.replay import Masker
from proxy.rerender import SKEW_S, changed_tokens, edits, is_forward, is_rerender, moments
from proxy.rules import load_rules, volatile_patterns

MASKER = Masker(volatile_patterns(load_rules()))
MASK = MASKER.mask_text
BASE = datetime(2026, 12, 3, 10, 0, 0, tzinfo=UTC)


def text(value: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": value}]}


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_changed_tokens_are_the_tokens_that_differ() -> None:
    assert changed_tokens("at 10:00 on 2026-12-03", "at 10:05 on 2026-12-03") == [((3, 8), (3, 8))]
    assert changed_tokens("a b", "a b") == []
    assert changed_tokens("a b", "a b c") is None


def test_moments_by_kind() -> None:
    found = moments("at 2026-12-03T10:00:00Z, 2026-12-03 11:30, epoch 1796292000, clock 14:05")
    assert found == [
        (3, 23, "instant", 1796292000.0),
        (25, 41, "local", 1796297400.0),
        (49, 59, "epoch", 1796292000.0),
        (67, 72, "clock", 50700.0),
    ]
    assert moments("2026-12-03T10:00:00+01:00") == [(0, 25, "instant", 1796288400.0)]
    assert moments("ms 1796292000123") == [(3, 16, "epoch", 1796292000.123)]
    assert moments("2026-02-30T10:00:00Z 25:61 99:99") == []


def test_is_forward_bounds() -> None:
    assert is_forward("instant", 0.0, 100.0, 100.0)
    assert is_forward("instant", 0.0, 100.0 + SKEW_S, 100.0)
    assert not is_forward("instant", 0.0, 100.0 + SKEW_S + 1, 100.0)
    assert is_forward("instant", 0.0, -SKEW_S, 100.0)
    assert not is_forward("instant", 0.0, -SKEW_S - 1, 100.0)
    assert is_forward("clock", 86_000.0, 200.0, 1_000.0)  # past midnight, 600 s later
    assert not is_forward("clock", 50_700.0, 54_300.0, 120.0)
    assert is_forward("epoch", 10.0, 1e12, float("inf"))


def test_the_attack_pass_edits_are_not_re_renders() -> None:
    cases = [
        ("Deploy 2026-12-03T10:00:00Z", "Deploy 2026-12-04T10:00:00Z"),
        ("Budget remaining: 500 dollars", "Budget remaining: 5 dollars"),
        ("request id: 7f3a91", "request id: 7f3a92"),
        ("Current time: 2026-12-03T10:00:00Z", "Current time: 2026-12-03T09:00:00Z"),
        ("Current time: 2026-12-03T10:00:00Z", "Current time: 2026-12-03T10:00:30"),  # zone dropped
        ("current time 14:05", "current time 15:05"),
    ]
    for old, new in cases:
        assert MASK(old) == MASK(new), old
        assert not is_rerender(text(old), text(new), MASK, 60.0), new


def test_re_rendered_moments_are_re_renders() -> None:
    cases = [
        ("Current time: 2026-12-03T10:00:00Z", "Current time: 2026-12-03T10:01:00Z"),
        ("<current_time>2026-12-03T10:00:00Z</current_time>", "<current_time>2026-12-03T10:00:59Z</current_time>"),
        ("Current time: 2026-12-03 23:59 local", "Current time: 2026-12-04 00:00 local"),
        ("timestamp: 1796292000", "timestamp: 1796292060"),
        ("current time 23:59", "current time 00:00"),
    ]
    for old, new in cases:
        assert MASK(old) == MASK(new), old
        assert is_rerender(text(old), text(new), MASK, 60.0), new


def test_edits_name_the_edited_tokens_whatever_is_re_rendered_around_them() -> None:
    stored = text("Current time: 2026-12-03T10:00:00Z\nBook it for 2026-12-05T15:00:00Z, budget remaining: 500")
    later = text("Current time: 2026-12-03T10:00:40Z\nBook it for 2026-12-06T15:00:00Z, budget remaining: 5")
    again = text("Current time: 2026-12-03T10:01:10Z\nBook it for 2026-12-06T15:00:00Z, budget remaining: 5")
    assert edits(stored, later, MASK, 60.0) == ("2026-12-06T15:00:00Z,", "5")
    assert edits(stored, again, MASK, 90.0) == ("2026-12-06T15:00:00Z,", "5")
    assert edits(stored, stored, MASK, 0.0) == ()


def test_a_note_moved_onto_the_stored_message_is_ignored() -> None:
    """Reorder put a leading note block on the message as sent; the client's has none."""
    stored = {
        "role": "user",
        "content": [
            {"type": "text", "text": "Current time: 2026-12-03T09:59:00Z"},
            {"type": "text", "text": "<r>Current time: 2026-12-03T10:00:00Z</r> hi"},
        ],
    }
    assert is_rerender(stored, text("<r>Current time: 2026-12-03T10:00:30Z</r> hi"), MASK, 60.0)
    assert not is_rerender(stored, text("<r>Current time: 2026-12-04T10:00:30Z</r> hi"), MASK, 60.0)


def test_an_unknown_session_age_takes_any_forward_move_and_nan_none() -> None:
    old, new = text("Current time: 2026-12-03T10:00:00Z"), text("Current time: 2026-12-09T10:00:00Z")
    assert is_rerender(old, new, MASK, float("inf"))
    assert not is_rerender(old, new, MASK, float("nan"))


@given(
    seconds=st.integers(min_value=-7 * 86_400, max_value=7 * 86_400),
    elapsed=st.integers(min_value=0, max_value=86_400),
    words=st.lists(st.sampled_from(["fix", "the", "bug", "now", "Current", "time:"]), max_size=6),
)
def test_a_time_is_a_re_render_exactly_when_it_moved_forward_within_the_session(
    seconds: int, elapsed: int, words: list[str]
) -> None:
    """Property: the verdict is the bound itself (`is_forward`), for any surrounding words; the
    inputs are not mutated; a message is always a re-render of itself."""
    prose = " ".join(words)
    old = text(f"{prose} Current time: {iso(BASE)} {prose}")
    new = text(f"{prose} Current time: {iso(BASE + timedelta(seconds=seconds))} {prose}")
    before = (repr(old), repr(new))
    verdict = is_rerender(old, new, MASK, float(elapsed))
    assert verdict == (-SKEW_S <= seconds <= elapsed + SKEW_S)
    assert (repr(old), repr(new)) == before
    assert is_rerender(new, new, MASK, 0.0)
