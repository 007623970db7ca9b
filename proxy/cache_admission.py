"""cache_admission: when a full per-session cache takes a session's entry in, and when it turns it away.

Two caches hold one entry per long session and are bounded in bytes: the parsed bodies kept for
the incremental parse (`proxy.pipeline.rawprefix.RawPrefixIndex`) and the decoded session
records (`proxy.store.RecordStore`'s memo). Plain LRU fails both when more sessions take turns
than fit: each entry is evicted just before its session's next turn, so none is ever reused
(measured with `bench/turn_cpu.py --interleave`: 6 sessions of 600 KB fit the default budget, and
at 8 the event loop's CPU per appended turn doubled, 3.2 -> 6.0 ms).

The rule (`admits`): a session whose entry is still held replaces it, evicting the least recently
used as needed. Any other session's entry is taken in only when the entries it would evict have
each been idle (on the cache's own clock) at least as long as that session was away (`gap`). A
session the cache has no time for (a new conversation) counts as away for as many ticks as the
cache holds entries: LRU's own horizon, so a stream of new conversations that re-send a known
history still keeps the newest bodies (the kept body `parse_around` reads). A set of sessions
that fits then stays held while they keep coming back, and one that stopped gives way to one
that comes back. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable


def admits(over: int, gap: int | None, now: int, oldest_first: Iterable[tuple[int, int]], held: int) -> bool:
    """Whether a new entry needing `over` bytes freed may evict entries (module docstring).

    `gap`: clock ticks since the new entry's session was last seen (`None`: unknown, counted as
    `held`, the number of entries held); `now`: the clock; `oldest_first`: `(last use, bytes)`
    of the held entries, least recently used first. True when `over <= 0`, or when the leading
    entries whose bytes reach `over` were each last used at least `gap` ticks ago."""
    if over <= 0:
        return True
    if gap is None:
        gap = held
    freed = 0
    for at, size in oldest_first:
        if now - at < gap:
            return False
        freed += size
        if freed >= over:
            return True
    return False
