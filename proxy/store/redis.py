"""`RedisStore`: a shared `SessionStore` for several replicas (redis-py asyncio + hiredis).

- Key: `promptcache:{<tenant>}:<session>`. The tenant is a hash tag, so a tenant's sessions
  share a Redis Cluster slot, and no key of one tenant is a key of another.
- Value: the record bytes, `SET ... PX <ttl ms>`: Redis expires entries itself; the caller
  bounds the TTL by the longest provider cache TTL in use (`proxy.store.RECORD_TTL`).
- Failures raise `redis.exceptions.RedisError` (or `OSError`) at once: no client-side retries
  (a request must not wait on a dead server; `RecordStore` bounds every call with a timeout and
  counts the error). The client reconnects by itself once the server is back.
- Health: `check()` is a `PING`; `fault_kind` names a refused or dropped connection
  `unavailable`, a server that does not answer in time `unresponsive`, a server refusing
  writes (`MISCONF`, `READONLY` replica, `OOM`) `read_only` / `disk_full`.
"""

from __future__ import annotations

from typing import Final

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from proxy.store.base import check_key

KEY_PREFIX: Final = "promptcache"
CONNECT_TIMEOUT: Final = 1.0
"""Seconds to open a connection. Request latency is bounded by `RecordStore`'s own, shorter
per-call timeouts; this one only has to survive a loaded machine opening many connections."""
SOCKET_TIMEOUT: Final = 2.0
"""Seconds to wait on a reply (`RecordStore` usually gives up sooner)."""


class RedisStore:
    """See the module docstring; `url` is `redis://host:port/db` (or `rediss://`)."""

    backend: Final = "redis"

    def __init__(self, url: str, key_prefix: str = KEY_PREFIX) -> None:
        self._prefix = key_prefix
        self._client = aioredis.Redis.from_url(
            url,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=SOCKET_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )

    def key(self, tenant: str, session: str) -> str:
        check_key(tenant, session)
        return f"{self._prefix}:{{{tenant}}}:{session}"

    async def get(self, tenant: str, session: str) -> bytes | None:
        value = await self._client.get(self.key(tenant, session))
        return None if value is None else value if isinstance(value, bytes) else value.encode()

    async def put(self, tenant: str, session: str, value: bytes, ttl: float) -> None:
        key = self.key(tenant, session)
        milliseconds = round(ttl * 1000)
        if milliseconds <= 0:
            await self._client.delete(key)
            return
        await self._client.set(key, value, px=milliseconds)

    async def delete(self, tenant: str, session: str) -> None:
        await self._client.delete(self.key(tenant, session))

    async def ping(self) -> bool:
        return bool(await self._client.ping())

    async def check(self) -> None:
        """Raise unless the server answers `PING`."""
        await self._client.ping()

    @staticmethod
    def fault_kind(exc: BaseException) -> str:
        """The `FAULT_KINDS` cause of an exception this store raised."""
        if isinstance(exc, redis.exceptions.TimeoutError):
            return "unresponsive"
        if isinstance(exc, redis.exceptions.ConnectionError | ConnectionError):
            return "unavailable"
        if isinstance(exc, redis.exceptions.ReadOnlyError):
            return "read_only"
        if isinstance(exc, redis.exceptions.ResponseError):
            text = str(exc)
            if text.startswith("OOM"):
                return "disk_full"
            if text.startswith(("MISCONF", "READONLY")):
                return "read_only"
        if isinstance(exc, OSError):
            return "unavailable"
        return "other"

    async def close(self) -> None:
        await self._client.aclose()
