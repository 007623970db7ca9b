"""`RedisStore`: a shared `SessionStore` for several replicas (redis-py asyncio + hiredis).

- Key: `promptcache:{<tenant>}:<session>`. The tenant is a hash tag, so a tenant's sessions
  share a Redis Cluster slot, and no key of one tenant is a key of another.
- Value: the record bytes, `SET ... PX <ttl ms>`: Redis expires entries itself; the caller
  bounds the TTL by the longest provider cache TTL in use (`proxy.store.RECORD_TTL`).
- In parts (`put_parts`, `proxy.store.base`): the head at the key, the parts in a hash at
  `<key>:parts` (a session id has no `:`, so no key of a session is another's), both written,
  checked and given the same expiry by one Lua script (`_PUT_PARTS`, sent with `EVAL`), which
  Redis runs atomically; `get_parts` reads both in one `MULTI`/`EXEC`, or, given the parts the
  caller holds, in one Lua script that leaves those out of its answer (`_GET_PARTS`). `put` and
  `delete` remove the hash with the head, in one transaction.
- Failures raise `redis.exceptions.RedisError` (or `OSError`) at once: no client-side retries
  (a request must not wait on a dead server; `RecordStore` bounds every call with a timeout and
  counts the error). The client reconnects by itself once the server is back.
- Health: `check()` is a `PING`; `fault_kind` names a refused or dropped connection
  `unavailable`, a server that does not answer in time `unresponsive`, a server refusing
  writes (`MISCONF`, `READONLY` replica, `OOM`) `read_only` / `disk_full`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from proxy.store.base import Part, check_key

KEY_PREFIX: Final = "promptcache"
CONNECT_TIMEOUT: Final = 1.0
"""Seconds to open a connection. Request latency is bounded by `RecordStore`'s own, shorter
per-call timeouts; this one only has to survive a loaded machine opening many connections."""
SOCKET_TIMEOUT: Final = 2.0
"""Seconds to wait on a reply (`RecordStore` usually gives up sooner)."""


_PUT_PARTS: Final = """
local ms = tonumber(ARGV[1])
local kept = tonumber(ARGV[3])
local wanted = {}
for i = 4, 3 + kept do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then return 0 end
  wanted[ARGV[i]] = true
end
local sent = {}
for i = 4 + kept, #ARGV, 2 do
  wanted[ARGV[i]] = true
  sent[#sent + 1] = ARGV[i]
  sent[#sent + 1] = ARGV[i + 1]
end
for _, name in ipairs(redis.call('HKEYS', KEYS[2])) do
  if not wanted[name] then redis.call('HDEL', KEYS[2], name) end
end
if #sent > 0 then redis.call('HSET', KEYS[2], unpack(sent)) end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ms)
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ms) end
return 1
"""
"""KEYS: the head's key, the parts hash; ARGV: ttl ms, head, count of kept parts, their keys,
then (key, bytes) per part sent. 0 (nothing written) when a kept part is not in the hash."""


_GET_PARTS: Final = """
local head = redis.call('GET', KEYS[1])
if not head then return nil end
local known = {}
for i = 1, #ARGV do known[ARGV[i]] = true end
local wanted = {}
for _, name in ipairs(redis.call('HKEYS', KEYS[2])) do
  if not known[name] then wanted[#wanted + 1] = name end
end
local found = {head}
for at = 1, #wanted, 1000 do
  local last = math.min(at + 999, #wanted)
  local values = redis.call('HMGET', KEYS[2], unpack(wanted, at, last))
  for i = at, last do
    found[#found + 1] = wanted[i]
    found[#found + 1] = values[i - at + 1]
  end
end
return found
"""
"""KEYS: the head's key, the parts hash; ARGV: the names of the parts the caller holds. The
head then (name, bytes) per part not named, or nil when the head is absent (`get_parts`); the
held parts' bytes are never copied (their names are listed, then the others fetched, 1,000 at
a time: Lua's `unpack` takes a few thousand values at most)."""


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

    async def get_parts(
        self, tenant: str, session: str, known: Collection[bytes] = ()
    ) -> tuple[bytes, dict[bytes, bytes]] | None:
        key = self.key(tenant, session)
        if known:
            # `EVAL`, not `EVALSHA` first: one round trip every time (as `put_parts`)
            found = await self._client.eval(_GET_PARTS, 2, key, key + ":parts", *known)
            if found is None:
                return None
            return bytes(found[0]), {bytes(found[i]): bytes(found[i + 1]) for i in range(1, len(found), 2)}
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.hgetall(key + ":parts")
            head, parts = await pipe.execute()
        if head is None:
            return None
        return bytes(head), {bytes(k): bytes(v) for k, v in parts.items()}

    async def put(self, tenant: str, session: str, value: bytes, ttl: float) -> None:
        key = self.key(tenant, session)
        milliseconds = round(ttl * 1000)
        async with self._client.pipeline(transaction=True) as pipe:
            if milliseconds <= 0:
                pipe.delete(key, key + ":parts")
            else:
                pipe.set(key, value, px=milliseconds)
                pipe.delete(key + ":parts")
            await pipe.execute()

    async def put_parts(self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float) -> bool:
        key = self.key(tenant, session)
        milliseconds = round(ttl * 1000)
        if milliseconds <= 0:
            await self._client.delete(key, key + ":parts")
            return True
        kept = [p.key for p in parts if p.data is None]
        args: list[bytes | int] = [milliseconds, head, len(kept), *kept]
        for part in parts:
            if part.data is not None:
                args.append(part.key)
                args.append(part.data)
        # `EVAL`, not `EVALSHA` first: one round trip every time (Redis caches the compiled script)
        return bool(await self._client.eval(_PUT_PARTS, 2, key, key + ":parts", *args))

    async def delete(self, tenant: str, session: str) -> None:
        key = self.key(tenant, session)
        await self._client.delete(key, key + ":parts")

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
