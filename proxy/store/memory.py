"""`MemoryStore`: an in-process, bounded `SessionStore` (tests and single-process dev).

Bounded three ways: entries expire after their TTL (monotonic clock), at most `max_entries`
entries and `max_bytes` value bytes are kept, least recently used evicted first. A value larger
than `max_bytes` is not stored. Values are bytes, so a caller can never mutate what is stored.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from proxy.store.base import check_key

DEFAULT_MAX_ENTRIES: Final = 10_000
DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024


class MemoryStore:
    """Dict + LRU + TTL; see the module docstring."""

    backend: Final = "memory"

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._data: OrderedDict[tuple[str, str], tuple[float, bytes]] = OrderedDict()
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        """Value bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    async def get(self, tenant: str, session: str) -> bytes | None:
        check_key(tenant, session)
        key = (tenant, session)
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        if expires <= self._clock():
            self._drop(key)
            return None
        self._data.move_to_end(key)
        return value

    async def put(self, tenant: str, session: str, value: bytes, ttl: float) -> None:
        check_key(tenant, session)
        key = (tenant, session)
        if key in self._data:
            self._drop(key)
        if len(value) > self.max_bytes or ttl <= 0:
            return
        self._data[key] = (self._clock() + ttl, value)
        self._bytes += len(value)
        while len(self._data) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._data)))

    async def delete(self, tenant: str, session: str) -> None:
        check_key(tenant, session)
        if (tenant, session) in self._data:
            self._drop((tenant, session))

    async def close(self) -> None:
        self._data.clear()
        self._bytes = 0

    def _drop(self, key: tuple[str, str]) -> None:
        _, value = self._data.pop(key)
        self._bytes -= len(value)
