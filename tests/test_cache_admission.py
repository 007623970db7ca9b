"""The admission rule of the per-session caches (`proxy.cache_admission.admits`)."""

from __future__ import annotations

from proxy.cache_admission import admits


def test_an_entry_that_fits_is_taken_in_and_an_unknown_session_is_away_as_long_as_the_cache_holds() -> None:
    assert admits(0, None, 10, [], 0)
    assert admits(-5, None, 10, [(9, 100)], 1)
    held = [(7, 100), (8, 100), (9, 100)]
    assert admits(100, None, 10, held, 3)  # idle 3 >= 3 entries
    assert admits(100, None, 10, held[1:], 2)  # idle 2 >= 2 entries
    assert not admits(100, None, 10, held, 4)  # idle 3 < 4


def test_it_evicts_only_entries_idle_at_least_as_long_as_the_session_was_away() -> None:
    held = [(2, 100), (5, 100), (9, 100)]  # (last use, bytes), least recently used first
    assert admits(100, 8, 10, held, 3)  # idle 8 >= 8
    assert not admits(100, 9, 10, held, 3)  # idle 8 < 9
    assert admits(200, 5, 10, held, 3)  # idle 8 and 5 free 200
    assert not admits(200, 6, 10, held, 3)  # the second one, idle 5, is in use
    assert not admits(400, 1, 10, held, 3)  # all 300 bytes are not enough
