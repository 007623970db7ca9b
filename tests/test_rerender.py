"""proxy.rerender: which volatile-only changes of a message are a client re-rendering it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.rerender import (
    MAX_CHANGED_PER_STRING,
    MAX_EDITS,
    MAX_TOKEN_CHARS,
    SKEW_S,
    Allowance,
    edits,
    is_forward,
    is_rerender,
    moments,
    string_edits,
)

BASE = datetime(2026, 12, 3, 10, 0, 0, tzinfo=UTC)
DIGITS = str.maketrans("", "", "0123456789")
LONG = "Current time: Thursday, December 3, 2026"
DATED = "Current date and time: Thursday, December 3, 2026"


def text(value: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": value}]}


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_moments_by_kind() -> None:
    found = moments("at 2026-12-03T10:00:00Z, 2026-12-03 11:30, epoch 1796292000, current time 14:05")
    assert found == [
        (3, 23, "instant", 1796292000.0),
        (25, 41, "local", 1796297400.0),
        (49, 59, "epoch", 1796292000.0),
        (74, 79, "clock", 50700.0),
    ]
    assert moments("2026-12-03T10:00:00+01:00") == [(0, 25, "instant", 1796288400.0)]
    assert moments("timestamp: 1796292000123") == [(11, 24, "epoch", 1796292000.123)]
    assert moments("Current time: 1:05 PM") == [(14, 21, "clock", 47100.0)]
    assert moments("Current time: 12:59 am") == [(14, 22, "clock", 3540.0)]


def test_only_labelled_epochs_and_clocks_are_moments() -> None:
    assert moments("tokens used: 1796292000, ratio 4:32") == []
    assert moments("2026-02-30T10:00:00Z, current time 25:61, current time 13:05 PM") == []


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
        # session 14: a digit beside a moment in one token, an unlabelled epoch or clock
        ("2026-12-03T10:00:00Z,login,user=ALICE,ip=10.0.0.1", "2026-12-03T10:00:10Z,login,user=ALICE,ip=10.0.0.2"),
        ("Row: 2026-12-03T10:00:00Z,amount=500", "Row: 2026-12-03T10:00:00Z,amount=5"),
        ("2026-12-03 10:00,ALICE,4242,500.00", "2026-12-03 10:00,ALICE,4242,5.00"),
        ("tokens used: 1796292000", "tokens used: 1796292100"),
        ("the ratio was 4:32", "the ratio was 4:33"),
        # session 14, second pass: digits after the seconds are not a fraction past 9 digits
        ("Refund:\n2026-12-03 10:00:00,4111111111111111", "Refund:\n2026-12-03 10:00:00,5500000000000004"),
        ("2026-12-03T10:00:00.1234567890123456Z", "2026-12-03T10:00:00.6543210987654321Z"),
    ]
    for old, new in cases:
        assert not is_rerender(text(old), text(new), 60.0), new


def test_re_rendered_moments_are_re_renders() -> None:
    cases = [
        ("Current time: 2026-12-03T10:00:00Z", "Current time: 2026-12-03T10:01:00Z"),
        ("<current_time>2026-12-03T10:00:00Z</current_time>", "<current_time>2026-12-03T10:00:59Z</current_time>"),
        ("Current time: 2026-12-03 23:59 local", "Current time: 2026-12-04 00:00 local"),
        ("timestamp: 1796292000", "timestamp: 1796292060"),
        ("current time 23:59", "current time 00:00"),
        ("Current time: 12:59 PM", "Current time: 1:00 PM"),
        # a weekday and a spelled-out date before the clock (7 tokens back: attack pass 3)
        (f"{LONG} at 10:00:00 AM UTC", f"{LONG} at 10:00:40 AM UTC"),
        (f"{DATED} 10:00", f"{DATED} 10:01"),
        ("2026-12-03T10:00:00Z,login,user=ALICE", "2026-12-03T10:00:30Z,login,user=ALICE"),
    ]
    for old, new in cases:
        assert is_rerender(text(old), text(new), 60.0), new


def test_edits_name_the_edited_tokens_whatever_is_re_rendered_around_them() -> None:
    stored = text("Current time: 2026-12-03T10:00:00Z\nBook it for 2026-12-05T15:00:00Z, budget remaining: 500")
    later = text("Current time: 2026-12-03T10:00:40Z\nBook it for 2026-12-06T15:00:00Z, budget remaining: 5")
    again = text("Current time: 2026-12-03T10:01:10Z\nBook it for 2026-12-06T15:00:00Z, budget remaining: 5")
    assert edits(stored, later, 60.0) == ("\x00,\x002026-12-06T15:00:00Z", "5\x00")
    assert edits(stored, again, 90.0) == edits(stored, later, 60.0)
    assert edits(stored, stored, 0.0) == ()
    assert string_edits("a b", "a c", 0.0) == ("a c",)
    assert string_edits("a 1", "a 1 2", 0.0) == ("a  ",)


def test_at_most_max_edits_are_named_and_too_many_changes_are_not_looked_at() -> None:
    def amounts(n: int, shift: int) -> str:
        return " ".join(f"amount={i + shift}" for i in range(n))

    assert len(edits(text(amounts(20, 0)), text(amounts(20, 1)), 60.0)) == MAX_EDITS
    many = amounts(MAX_CHANGED_PER_STRING + 1, 1)
    assert edits(text(amounts(MAX_CHANGED_PER_STRING + 1, 0)), text(many), 60.0) == (many.translate(DIGITS),)
    allowance = Allowance(tokens=3)
    old, new = "Current time: 2026-12-03T10:00:00Z", "Current time: 2026-12-03T10:00:09Z"
    assert edits(text(old), text(new), 60.0, allowance) == ()
    assert allowance.tokens == 2
    two_old, two_new = f"{old} {old} {old}", f"{new} {new} {new}"
    assert edits(text(two_old), text(two_new), 60.0, allowance) == (two_new.translate(DIGITS),)
    assert allowance.tokens == 2


def test_values_swapped_between_two_places_are_compared_place_by_place() -> None:
    """Strings pair in order, an object's by sorted key: swapping two dates is two moves, one of
    them back (attack pass 3: paired by value, every string was found unchanged)."""
    call = {"type": "tool_use", "input": {"start": "2026-12-03T10:00Z", "end": "2026-12-05T10:00Z"}}
    swapped = {"type": "tool_use", "input": {"end": "2026-12-03T10:00Z", "start": "2026-12-05T10:00Z"}}
    assert not is_rerender(call, swapped, 7 * 86_400.0)
    reordered = {"input": {"end": "2026-12-05T10:00Z", "start": "2026-12-03T10:00Z"}, "type": "tool_use"}
    assert edits(call, reordered, 0.0) == ()
    blocks = [{"type": "text", "text": "due 2026-12-03T10:00Z"}, {"type": "text", "text": "due 2026-12-09T10:00Z"}]
    assert not is_rerender(blocks, blocks[::-1], 7 * 86_400.0)


def test_a_long_changed_token_is_an_edit_unlooked() -> None:
    """A changed token over MAX_TOKEN_CHARS is an edit named without its digits; a neighbour
    token of any length is cut to MAX_CONTEXT_CHARS in the window (so its cost is bounded)."""
    glued = ",".join(["2026-12-03T10:00Z,timestamp:1796292000"] * 4)
    later = glued.replace("10:00Z", "10:01Z")
    assert len(later) > MAX_TOKEN_CHARS
    assert string_edits(glued, later, 600.0) == (later.translate(DIGITS),)
    pad = "x" * 100_000
    assert string_edits(f"{pad} Current time: 10:00Z", f"{pad} Current time: 10:01Z", 600.0) == ()
    assert string_edits(f"{pad} 2026-12-03T10:00Z", f"{pad} 2026-12-03T10:01Z", 600.0) == ()


def test_a_note_moved_onto_the_stored_message_and_an_empty_block_are_ignored() -> None:
    """Reorder put a leading note block on the message as sent, and canonicalise dropped the
    client's empty text block from it; the client's has no note and still its empty block."""
    stored = {
        "role": "user",
        "content": [
            {"type": "text", "text": "Current time: 2026-12-03T09:59:00Z"},
            {"type": "text", "text": "<r>Current time: 2026-12-03T10:00:00Z</r> hi"},
        ],
    }
    client = {
        "role": "user",
        "content": [
            {"type": "text", "text": ""},
            {"type": "text", "text": "<r>Current time: 2026-12-03T10:00:30Z</r> hi"},
        ],
    }
    assert is_rerender(stored, client, 60.0)
    assert not is_rerender(stored, text("<r>Current time: 2026-12-04T10:00:30Z</r> hi"), 60.0)


def test_an_unknown_session_age_takes_any_forward_move_and_nan_none() -> None:
    old, new = text("Current time: 2026-12-03T10:00:00Z"), text("Current time: 2026-12-09T10:00:00Z")
    assert is_rerender(old, new, float("inf"))
    assert not is_rerender(old, new, float("nan"))


@given(
    seconds=st.integers(min_value=-7 * 86_400, max_value=7 * 86_400),
    elapsed=st.integers(min_value=0, max_value=86_400),
    words=st.lists(st.sampled_from(["fix", "the", "bug", "now", "Current", "time:", "7", "a1"]), max_size=12),
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
    verdict = is_rerender(old, new, float(elapsed))
    assert verdict == (-SKEW_S <= seconds <= elapsed + SKEW_S)
    assert (repr(old), repr(new)) == before
    assert is_rerender(new, new, 0.0)
