"""In-memory cache entries of the simulated upstreams, partitioned by tenant.

Contract:
- A key is `(tenant, namespace, digest)`: `tenant` is the SHA-256 hex of the API key (the raw key
  is never stored), `namespace` names provider + model (+ machine for OpenAI), `digest` is the
  16-byte prefix digest the provider module computed. A tenant can only ever look up its own keys.
- An entry is live while `now < expires_at`. `lookup` drops expired entries; `touch` refreshes
  a hit (`expires_at = now + ttl`, docs/provider-rules.md 1.7 "refreshed on read", 2.2 idle retention).
- Writes are staged by the caller and `commit`ted when the writer's response starts, so an entry
  is readable only after that (docs/provider-rules.md 1.5); nothing here awaits.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

_SWEEP_EVERY: Final = 1024


@dataclass(slots=True)
class Entry:
    """One cached prefix."""

    tenant: str
    """SHA-256 hex of the API key."""
    namespace: str
    """`anthropic/<model>` or `openai/<model>/<machine>`."""
    digest: bytes
    """Prefix digest (16 bytes)."""
    tokens: int
    """Prefix length in tokens."""
    ttl: float
    """Lifetime in seconds, counted again from each read."""
    expires_at: float
    """Epoch seconds; the entry is live while `now < expires_at`."""
    label: str = ""
    """Short human hint for the admin listing (`5m`, `1h`, `in_memory`, `30m` ...)."""


Key = tuple[str, str, bytes]


class CacheStore:
    """Live entries by `(tenant, namespace, digest)`; single-threaded (one event loop)."""

    __slots__ = ("_entries", "_commits")

    def __init__(self) -> None:
        self._entries: dict[Key, Entry] = {}
        self._commits = 0

    def lookup(self, tenant: str, namespace: str, digest: bytes, now: float) -> Entry | None:
        """The live entry at this key, or None (an expired one is dropped)."""
        key = (tenant, namespace, digest)
        entry = self._entries.get(key)
        if entry is not None and now >= entry.expires_at:
            del self._entries[key]
            return None
        return entry

    @staticmethod
    def touch(entry: Entry, now: float, ttl: float | None = None) -> None:
        """Refresh a hit: lifetime counted again from `now` (a longer `ttl` upgrades it)."""
        if ttl is not None and ttl > entry.ttl:
            entry.ttl = ttl
        entry.expires_at = max(entry.expires_at, now + entry.ttl)

    def commit(self, entries: Iterable[Entry]) -> None:
        """Make staged writes readable (call when the writer's response begins)."""
        for entry in entries:
            self._entries[(entry.tenant, entry.namespace, entry.digest)] = entry
            self._commits += 1
            if self._commits % _SWEEP_EVERY == 0:
                self.sweep(entry.expires_at - entry.ttl)

    def sweep(self, now: float) -> int:
        """Drop expired entries; returns how many."""
        dead = [k for k, e in self._entries.items() if now >= e.expires_at]
        for k in dead:
            del self._entries[k]
        return len(dead)

    def live(self, now: float) -> Iterator[Entry]:
        """Live entries, oldest write first."""
        self.sweep(now)
        return iter(list(self._entries.values()))

    def flush(self) -> int:
        """Drop everything; returns how many entries there were."""
        n = len(self._entries)
        self._entries.clear()
        return n

    def __len__(self) -> int:
        return len(self._entries)
