"""`SessionStore`: the byte-level key-value protocol every session backend implements.

Contract (checked by `tests/store/test_contract.py` against every backend):
- Keys are `(tenant, session)` pairs; a tenant never reads another tenant's value, whatever the
  session ids. Both parts are non-empty strings of `[A-Za-z0-9_.-]` (`check_key`).
- `put(tenant, session, value, ttl)` stores `value` for at most `ttl` seconds (a backend may
  drop it earlier: LRU caps, eviction; `ttl <= 0` stores nothing and removes the old value);
  `get` returns the last value put, or `None` when absent or expired; `delete` removes it
  (absent is fine); `close` releases connections and threads (idempotent).
- Backends raise on failure (connection refused, locked or corrupt file ...): the caller
  (`proxy.store.RecordStore`) times, counts and absorbs errors, so a request never fails on
  the store.
- In parts: `put_parts(tenant, session, head, parts, ttl)` stores a value made of `head` and
  `parts` (`Part`: a key naming its bytes, distinct within the value), replacing the key's old
  value; a part given without `data` is one the key's old value holds (nothing is sent again),
  and when the key does not hold it the call stores nothing, leaves the old value as it was and
  returns `False` (the caller sends every part). The parts expire and go with the head: parts
  of the old value the new one does not name are removed, `put`, `delete`, expiry and eviction
  remove them all. Atomic: `get_parts` returns `(head, {key: bytes})`, the old value whole or
  the new one whole, never a mix (`(value, {})` for one stored by `put`); `get` of a value in
  parts returns its head. `get_parts(..., known)` may leave out the parts named in `known` (the
  caller holds their bytes: the record it decoded before), so an appended turn's read carries
  its head and new parts, not the whole history again; it never leaves out another part.
- No method blocks the event loop.
- Health (optional, `proxy.store.RecordStore.check`): a backend may offer `check()`, a cheap
  probe that raises what a real write would (the SQLite file gone, disk full, read-only;
  Redis unreachable), and `fault_kind(exc)`, naming the cause of one of its exceptions as one
  of `FAULT_KINDS`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

_KEY_PART: Final = re.compile(r"[A-Za-z0-9_.\-]{1,200}")

FAULT_KINDS: Final = (
    "file_gone",
    "disk_full",
    "read_only",
    "cannot_open",
    "corrupt",
    "locked",
    "unavailable",
    "unresponsive",
    "timeout",
    "other",
)
"""Causes of store failures (`promptcache_session_store_faults_total{kind}`)."""
UNHEALTHY_KINDS: Final = frozenset({"disk_full", "read_only", "cannot_open", "unavailable", "unresponsive"})
"""Causes that make the store unhealthy (`/readyz` 503) until a write or a check succeeds;
the others are transient (one slow or locked call, a file recreated at once, one bad record)."""


class StoreFault(Exception):
    """A failure a backend detects itself (not raised by its driver): `kind` is one of
    `FAULT_KINDS`, the message says what was seen."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a value stored in parts (`SessionStore.put_parts`)."""

    key: bytes
    """Its name within the value: the xxh3-128 of its bytes (16 bytes), so one name is one content."""
    size: int
    """Length of its bytes."""
    data: bytes | None = None
    """Its bytes, or `None`: the key's stored value holds it already (not sent again)."""


class SessionStore(Protocol):
    """A tenant-partitioned key-value store with per-entry TTLs (bytes in, bytes out)."""

    @property
    def backend(self) -> str:
        """`memory`, `sqlite` or `redis` (the metric label)."""
        ...

    async def get(self, tenant: str, session: str) -> bytes | None: ...

    async def put(self, tenant: str, session: str, value: bytes, ttl: float) -> None: ...

    async def delete(self, tenant: str, session: str) -> None: ...

    async def put_parts(self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float) -> bool:
        """Store `head` and `parts` for `ttl` seconds (module docstring); `False` when a part
        given without data is not held, and nothing was stored."""
        ...

    async def get_parts(
        self, tenant: str, session: str, known: Collection[bytes] = ()
    ) -> tuple[bytes, dict[bytes, bytes]] | None:
        """The key's head and its parts by key, or `None` when absent or expired; the parts
        named in `known` may be missing from the answer (module docstring)."""
        ...

    async def close(self) -> None: ...


def check_key(tenant: str, session: str) -> None:
    """Raise `ValueError` unless both key parts are safe, non-empty identifiers."""
    if not _KEY_PART.fullmatch(tenant) or not _KEY_PART.fullmatch(session):
        raise ValueError("store keys must be 1-200 characters of [A-Za-z0-9_.-]")
