"""`MemoryStore`: an in-process, bounded `SessionStore` (tests and single-process dev).

Bounded three ways: entries expire after their TTL (monotonic clock), at most `max_entries`
entries and `max_bytes` value bytes are kept, least recently used evicted first. A value larger
than `max_bytes` is not stored (a value in parts counts its head and parts). Values are bytes,
so a caller can never mutate what is stored.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import Final

from proxy.store.base import Part, check_key

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
        self._data: OrderedDict[tuple[str, str], tuple[float, bytes, dict[bytes, bytes], int]] = OrderedDict()
        """`(expires, head, parts, size)` per key (`parts` empty for a value stored by `put`)."""
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        """Value bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    def _live(self, key: tuple[str, str]) -> tuple[float, bytes, dict[bytes, bytes], int] | None:
        item = self._data.get(key)
        if item is None:
            return None
        if item[0] <= self._clock():
            self._drop(key)
            return None
        return item

    async def get(self, tenant: str, session: str) -> bytes | None:
        check_key(tenant, session)
        key = (tenant, session)
        item = self._live(key)
        if item is None:
            return None
        self._data.move_to_end(key)
        return item[1]

    async def get_parts(
        self, tenant: str, session: str, known: Collection[bytes] = ()
    ) -> tuple[bytes, dict[bytes, bytes]] | None:
        check_key(tenant, session)
        key = (tenant, session)
        item = self._live(key)
        if item is None:
            return None
        self._data.move_to_end(key)
        if not known:
            return item[1], dict(item[2])
        return item[1], {name: data for name, data in item[2].items() if name not in known}

    async def put(self, tenant: str, session: str, value: bytes, ttl: float) -> None:
        check_key(tenant, session)
        self._store((tenant, session), value, {}, ttl)

    async def put_parts(self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float) -> bool:
        check_key(tenant, session)
        key = (tenant, session)
        item = self._live(key)
        held = item[2] if item is not None else {}
        values = {}
        for part in parts:
            data = part.data if part.data is not None else held.get(part.key)
            if data is None:
                return False
            values[part.key] = data
        self._store(key, head, values, ttl)
        return True

    def _store(self, key: tuple[str, str], head: bytes, parts: dict[bytes, bytes], ttl: float) -> None:
        if key in self._data:
            self._drop(key)
        size = len(head) + sum(map(len, parts.values()))
        if size > self.max_bytes or ttl <= 0:
            return
        self._data[key] = (self._clock() + ttl, head, parts, size)
        self._bytes += size
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
        self._bytes -= self._data.pop(key)[3]
