"""Upstream affinity: a session keeps to one of several base URLs, so its cache stays warm.

An upstream setting may list several base URLs (regions, accounts: `https://a,https://b`). A
prompt cache lives on one of them only, so every request of a session goes to the same one:
rendezvous (highest-random-weight) hashing of `(session key, URL)` ranks the URLs per session,
and the session uses the first URL of its ranking that has not failed it. Adding or removing a
URL moves only the sessions whose first choice it was.

A session moves to its next URL only after a failure there (a connect error, a 5xx, a 429); the
move is counted (`promptcache_upstream_moves_total{provider}`), since the next request writes its
cache afresh on the new URL (a cold write). A move is remembered per session (bounded LRU of
`MAX_MOVED` sessions; a forgotten one starts from its first choice again, which costs at most one
more cold write). With one URL nothing is hashed. Pure apart from that memory; no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

import xxhash

MAX_MOVED: Final = 65536
FAILURE_STATUSES: Final = frozenset({429})
"""Statuses that move a session besides every 5xx (and a connect error, status 502 locally)."""


def base_urls(setting: str) -> tuple[str, ...]:
    """The base URLs of an upstream setting: comma-separated, trailing `/` removed."""
    return tuple(part.strip().rstrip("/") for part in setting.split(",") if part.strip())


def ranking(key: str, urls: Sequence[str]) -> list[str]:
    """`urls` by descending rendezvous weight for `key` (stable for a given set of URLs)."""
    return sorted(urls, key=lambda url: xxhash.xxh3_64_intdigest(f"{key}\x00{url}".encode()), reverse=True)


def is_failure(status: int) -> bool:
    """True for an answer that moves a session: 5xx (502 includes a connect error), 429."""
    return status >= 500 or status in FAILURE_STATUSES


class Affinity:
    """The base URL of each session for one upstream."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("an upstream needs at least one base URL")
        self.urls = tuple(urls)
        self._moved: OrderedDict[str, int] = OrderedDict()

    def pick(self, key: str | None) -> str:
        """The base URL for session `key` (`None`: no session known, the first URL)."""
        if key is None or len(self.urls) == 1:
            return self.urls[0]
        order = ranking(key, self.urls)
        return order[self._moved.get(key, 0) % len(order)]

    def failed(self, key: str | None, url: str) -> bool:
        """Record that `url` failed session `key`; True when the session moved (its next
        request goes to its next URL), False when it had already moved away or cannot move."""
        if key is None or len(self.urls) == 1 or self.pick(key) != url:
            return False
        self._moved[key] = self._moved.get(key, 0) + 1
        self._moved.move_to_end(key)
        while len(self._moved) > MAX_MOVED:
            self._moved.popitem(last=False)
        return True
