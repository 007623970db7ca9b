"""Session identity: which conversation a request continues, per tenant.

First match wins (`explicit_session`):
1. a configured header (`settings.session_headers`, e.g. `x-claude-code-session-id`);
2. a session id inside `metadata.user_id`: Claude Code's JSON (`{"session_id": ...}`) or its
   string form `user_<h>_account_<uuid>_session_<uuid>`;
3. `prompt_cache_key`, then `user` (OpenAI);
4. inference (`SessionIndex.infer`): the tenant's recent request sharing the longest prefix,
   compared on identity boundaries (chain digests, one per message, over masked canonical
   digests: see `proxy.pipeline.replay.view_messages`). When the match is the matched
   session's whole last request, this request appends to it: same session. A shorter match is a
   fork: a new session id derived from the parent's, and the parent's record serves as the
   previous request. A fork whose latest request ended at the shared boundary (a re-run's
   opening: every boundary it holds is the parent's) is continued by the request that matches
   it there, and a later fork at that boundary gets an id of its own (`SessionIndex._fork`).
   No match: a new session whose id derives from the first boundary, so the same conversation
   gets the same id after a restart or on another replica.

Session ids are hashes (`x...` explicit, `r...` root, `f...` fork), never a client's raw string,
and safe as store keys. The index is bounded (LRU over sessions, a cap on boundaries held, a
TTL) and partitioned by tenant. `SessionState` bundles the per-process parts: tenant secret,
upstream hosts, index, shared-prefix pacing statistics and the clock used for arrivals.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, count
from typing import TYPE_CHECKING, Final, Literal
from urllib.parse import urlsplit

import orjson
import xxhash

from proxy.frozen import fast_init
from proxy.memory_budget import BOUNDARY_BYTES, INDEX_SESSION_BYTES, MemoryBudget
from proxy.pacing import MAX_ARRIVALS, Pacing
from proxy.providers.base import JSONObject, ProviderAdapter
from proxy.settings import Settings
from proxy.tenant import TenantKey, credential_of, load_secret

if TYPE_CHECKING:
    from proxy.pipeline.replay import Masker
    from proxy.rules import RuleSet
    from proxy.store import RecordStore

INDEX_TTL: Final = 4200.0
"""Seconds an index entry stays usable (as long as a stored record)."""
MAX_INDEX_SESSIONS: Final = 16_384
MAX_INDEX_BOUNDARIES: Final = 131_072
"""Boundaries held over all tenants (16 bytes each plus dict overhead: about 40 MB)."""
MAX_BOUNDARIES_PER_SESSION: Final = 4096
MAX_FORK_CHAIN: Final = 8
"""Forks of one boundary `SessionIndex.infer` tells apart (re-runs of one opening message)."""
MAX_HEADS: Final = 16_384
"""Shared-prefix pacing entries held over all tenants."""


InferenceKind = Literal["explicit", "append", "fork", "new"]

_log = logging.getLogger("promptcache.sessions")


def hashed_id(prefix: str, raw: bytes) -> str:
    """`prefix` + 32 hex characters of xxh3-128 of `raw`."""
    return prefix + xxhash.xxh3_128_hexdigest(raw)


def explicit_session(
    headers: Mapping[str, str], body: JSONObject, header_names: Sequence[str], adapter: ProviderAdapter
) -> tuple[str, str] | None:
    """`(source, raw id)` from the configured headers, else from the body fields the provider
    defines (`adapter.session_hint`: Anthropic `metadata.user_id`, OpenAI `prompt_cache_key` /
    `user`), else `None`."""
    for name in header_names:
        value = headers.get(name)
        if value:
            return "header", value
    return adapter.session_hint(body)


def explicit_id(raw: str) -> str:
    """Store-safe id of a client-provided session id (same raw id, same session, any source)."""
    return hashed_id("x", raw.encode())


def root_id(first_boundary: bytes) -> str:
    return hashed_id("r", first_boundary)


def fork_id(parent: str, boundary: bytes) -> str:
    return hashed_id("f", parent.encode() + b"\x00" + boundary)


@fast_init
@dataclass(frozen=True, slots=True)
class Inference:
    """How a request's session was decided."""

    session_id: str | None
    kind: InferenceKind
    parent: str | None = None
    """For `append`, the same id; for `fork`, the session whose record is the previous request."""
    shared_messages: int = 0
    """Leading messages identical (masked) to the matched session's."""


@dataclass(slots=True)
class _Entry:
    last: bytes
    owned: deque[bytes]
    seen: float
    registered: int = 0
    """Boundaries the session's latest request had (`last` is the final one)."""


class SessionIndex:
    """Recent requests per tenant, for inference (module docstring, rule 4). Bounded: at most
    `max_sessions` sessions and `max_boundaries` boundaries over all tenants (LRU), and at most
    `max_bytes` bytes at `proxy.memory_budget.BOUNDARY_BYTES` per boundary and `INDEX_SESSION_BYTES`
    per session (`SessionState.start`: the memory budget's `index` share); each usable for `ttl`
    seconds after its last registration. A session that falls out keeps its id (a root id
    derives from its first boundary) but a fork of it is no longer recognised."""

    def __init__(
        self,
        max_sessions: int = MAX_INDEX_SESSIONS,
        max_boundaries: int = MAX_INDEX_BOUNDARIES,
        ttl: float = INDEX_TTL,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_boundaries = max_boundaries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._clock = clock
        self._owner: dict[str, dict[bytes, str]] = {}
        self._sessions: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._count = 0

    @property
    def boundaries_held(self) -> int:
        return self._count

    @property
    def bytes_held(self) -> int:
        """Estimated bytes (`proxy.memory_budget.BOUNDARY_BYTES`, `INDEX_SESSION_BYTES`)."""
        return self._count * BOUNDARY_BYTES + len(self._sessions) * INDEX_SESSION_BYTES

    def __len__(self) -> int:
        return len(self._sessions)

    def infer(self, tenant: str, boundaries: Sequence[bytes]) -> Inference:
        """The session `boundaries` (one per message, in order) continues or forks."""
        if not boundaries:
            return Inference(None, "new")
        owner = self._owner.get(tenant)
        if owner:
            now = self._clock()
            for k in _held_newest_first(owner, boundaries):
                sid = owner[boundaries[k]]
                entry = self._sessions.get((tenant, sid))
                if entry is None or entry.seen + self.ttl <= now:
                    continue
                if entry.last == boundaries[k]:
                    return Inference(sid, "append", sid, k + 1)
                return self._fork(tenant, sid, boundaries[k], k + 1, now)
        return Inference(root_id(boundaries[0]), "new")

    def _fork(self, tenant: str, parent: str, boundary: bytes, shared: int, now: float) -> Inference:
        """A request sharing `shared` messages (up to `boundary`) with `parent`'s newer request.
        A fork whose latest request ended at that boundary owns none of its boundaries (the
        parent does): this request appends to it (a re-run's next turn, not a rewrite of the
        parent's history). A live fork that went on elsewhere is forked in turn (a third
        re-run of the same opening), up to `MAX_FORK_CHAIN` ids deep."""
        sid = fork_id(parent, boundary)
        for _ in range(MAX_FORK_CHAIN):
            entry = self._sessions.get((tenant, sid))
            if entry is None or entry.seen + self.ttl <= now:
                break
            if entry.last == boundary:
                return Inference(sid, "append", sid, shared)
            sid = fork_id(sid, boundary)
        return Inference(sid, "fork", parent, shared)

    def register(self, tenant: str, session: str, boundaries: Sequence[bytes]) -> None:
        """Record that `session`'s latest request had `boundaries` (chained digests: equal at
        position `i`, equal up to it). The boundaries its previous request had too (the same
        digest where that request's last one was) were offered then and are not walked again:
        an appended turn costs its new messages, not the whole history (4% of a 600 KB appended
        turn's event-loop time). One of them another session owned then stays unclaimed when
        that session falls out."""
        if not boundaries:
            return
        key = (tenant, session)
        entry = self._sessions.get(key)
        start = 0
        if entry is None:
            entry = _Entry(boundaries[-1], deque(), 0.0)
            self._sessions[key] = entry
        else:
            self._sessions.move_to_end(key)
            seen = entry.registered
            if 0 < seen <= len(boundaries) and boundaries[seen - 1] == entry.last:
                start = seen
        entry.last = boundaries[-1]
        entry.registered = len(boundaries)
        entry.seen = self._clock()
        owner = self._owner.setdefault(tenant, {})
        for digest in boundaries[max(start, len(boundaries) - MAX_BOUNDARIES_PER_SESSION) :]:
            if digest not in owner:
                owner[digest] = session
                entry.owned.append(digest)
                self._count += 1
        while len(entry.owned) > MAX_BOUNDARIES_PER_SESSION:
            self._release(owner, session, entry.owned.popleft())
        while (
            len(self._sessions) > self.max_sessions
            or self._count > self.max_boundaries
            or (self.max_bytes is not None and self.bytes_held > self.max_bytes)
        ):
            (old_tenant, old_session), old = self._sessions.popitem(last=False)
            old_owner = self._owner[old_tenant]
            for digest in old.owned:
                self._release(old_owner, old_session, digest)
            if not old_owner:
                del self._owner[old_tenant]

    def _release(self, owner: dict[bytes, str], session: str, digest: bytes) -> None:
        if owner.get(digest) == session:
            del owner[digest]
        self._count -= 1


NEWEST_LOOKED_UP: Final = 8
"""Boundaries `SessionIndex.infer` looks up one by one from the newest (an appended turn finds
its session in the last two); the older ones are looked up at C speed."""


def _held_newest_first(owner: Mapping[bytes, str], boundaries: Sequence[bytes]) -> Iterator[int]:
    """The positions of `boundaries` that `owner` holds, the newest first (`infer`'s order):
    the last `NEWEST_LOOKED_UP` one by one, then the rest at once (a new session's 800
    boundaries cost a `map`, not a Python loop)."""
    n = len(boundaries)
    cut = max(0, n - NEWEST_LOOKED_UP)
    for k in range(n - 1, cut - 1, -1):
        if boundaries[k] in owner:
            yield k
    if cut:
        yield from reversed(list(compress(count(), map(owner.__contains__, boundaries[:cut]))))


class HeadStats:
    """Arrival times of requests per (tenant, shared-prefix digest), for shared-prefix pacing.
    Bounded: `max_heads` entries (LRU), `MAX_ARRIVALS` times each."""

    def __init__(self, max_heads: int = MAX_HEADS) -> None:
        self.max_heads = max_heads
        self._arrivals: OrderedDict[tuple[str, bytes], deque[float]] = OrderedDict()

    def observe(self, tenant: str, head: bytes, now: float) -> tuple[float, ...]:
        """Add an arrival (epoch seconds); returns the arrivals held, oldest first."""
        key = (tenant, head)
        times = self._arrivals.get(key)
        if times is None:
            times = deque(maxlen=MAX_ARRIVALS)
            self._arrivals[key] = times
            if len(self._arrivals) > self.max_heads:
                self._arrivals.popitem(last=False)
        else:
            self._arrivals.move_to_end(key)
        times.append(now)
        return tuple(times)


PACING_KEY: Final = "pacing"
"""Store key (beside the tenant's session records) of the tenant's pacing. Session ids are
`x`/`r`/`f` + 32 hex characters, so it never names a session."""
PACING_TTL: Final = 7 * 24 * 3600.0
"""Seconds a tenant's pacing outlives its last request."""
MAX_TENANTS: Final = 4096
SAVE_EVERY: Final = 16
"""A tenant's pacing is saved after its first response, after a response that follows a new
human gap (a few per conversation), and every 16th response otherwise: losing the newest tool
gaps at a restart costs nothing measurable, a write per request would."""


class TenantPacing:
    """Each tenant's pacing (`proxy.pacing.Pacing`): an LRU of `max_tenants` in memory, loaded
    from the store on first sight (one read per tenant per process), saved in the background
    (`SAVE_EVERY`). A store failure costs only the learned pacing (the tenant starts again from
    the prior)."""

    def __init__(self, max_tenants: int = MAX_TENANTS) -> None:
        self.max_tenants = max_tenants
        self._known: OrderedDict[str, Pacing] = OrderedDict()
        self._unsaved: set[str] = set()
        """Tenants with a human gap not saved yet."""

    async def get(self, tenant: str, store: RecordStore | None) -> Pacing:
        known = self._known.get(tenant)
        if known is not None:
            self._known.move_to_end(tenant)
            return known
        pacing = Pacing()
        if store is not None:
            data = await store.load_bytes(tenant, PACING_KEY)
            if data is not None:
                try:
                    pacing = Pacing.from_json(orjson.loads(data))
                except orjson.JSONDecodeError:
                    pacing = Pacing()
            known = self._known.get(tenant)  # another request may have learned meanwhile
            if known is not None:
                return known
        self.put(tenant, pacing)
        return pacing

    def peek(self, tenant: str) -> Pacing:
        """The tenant's pacing held in memory (an empty one when unknown); no store read."""
        return self._known.get(tenant, Pacing())

    def record_response(self, tenant: str, turn: str, store: RecordStore | None) -> None:
        """Count a response of `turn` for the tenant; save its pacing in the background after
        its first response and every `SAVE_EVERY`th."""
        pacing = self._known.get(tenant, Pacing()).with_response(turn)
        due = tenant in self._unsaved or pacing.responses % SAVE_EVERY == 1
        self.put(tenant, pacing, store if due else None)

    def put(self, tenant: str, pacing: Pacing, store: RecordStore | None = None) -> None:
        """Remember `pacing` (and save it in the background when `store` is given)."""
        old = self._known.get(tenant)
        if old is not None and old.human != pacing.human:
            self._unsaved.add(tenant)
        self._known[tenant] = pacing
        self._known.move_to_end(tenant)
        while len(self._known) > self.max_tenants:
            self._unsaved.discard(self._known.popitem(last=False)[0])
        if store is not None:
            self._unsaved.discard(tenant)
            store.save_bytes_soon(tenant, PACING_KEY, orjson.dumps(pacing.to_json()), PACING_TTL)


def upstream_hosts(settings: Settings) -> dict[str, str]:
    """Provider -> upstream `host[:port]` as configured (the simulator's port is not part of it)."""
    urls = {name: provider.upstream for name, provider in settings.providers.items()}
    if settings.upstream.startswith(("http://", "https://")):
        urls = dict.fromkeys(urls, settings.upstream)
    return {name: urlsplit(url).netloc.lower() for name, url in urls.items()}


@dataclass(slots=True)
class SessionState:
    """Per-process session machinery (`Services.sessions`), built by `proxy.store.store_ctx`."""

    secret: bytes
    header_names: tuple[str, ...]
    hosts: dict[str, str]
    index: SessionIndex = field(default_factory=SessionIndex)
    heads: HeadStats = field(default_factory=HeadStats)
    pacing: TenantPacing = field(default_factory=TenantPacing)
    clock: Callable[[], float] = time.time
    """Epoch seconds for arrivals (pacing); tests share the simulator's manual clock."""
    masker: tuple[RuleSet | None, Masker] | None = None
    """`(RuleSet, proxy.pipeline.replay.Masker)` of the rules in use (`session.masker_for`)."""
    tenant_key: TenantKey | None = field(default=None, repr=False)
    """`secret`'s `proxy.tenant.TenantKey` (built on first use, again when `secret` changes)."""

    @classmethod
    async def start(cls, settings: Settings, is_persistent: bool = True) -> SessionState:
        """Load (or create) the tenant secret off the loop.

        `is_persistent` false (a `memory://` store: nothing outlives the process) uses a
        per-process secret unless `settings.secret` is set, and writes no file. An unusable
        state directory also gives a per-process secret (tenants then change at restart) and a
        warning. Replicas sharing Redis must share `settings.secret` (or the secret file).
        """
        if not is_persistent and not settings.secret:
            secret = secrets.token_hex(32).encode()
            return cls._of(secret, settings)
        try:
            secret = await asyncio.to_thread(load_secret, settings.secret, settings.state_dir)
        except OSError as exc:
            _log.warning(
                "cannot keep the tenant secret in %s (%s); using a per-process secret",
                settings.state_dir,
                type(exc).__name__,
            )
            secret = secrets.token_hex(32).encode()
        return cls._of(secret, settings)

    @classmethod
    def _of(cls, secret: bytes, settings: Settings) -> SessionState:
        index = SessionIndex(max_bytes=MemoryBudget.of_mb(settings.memory_budget_mb).index)
        return cls(secret, tuple(h.lower() for h in settings.session_headers), upstream_hosts(settings), index)

    def tenant_of(self, provider: str, headers: Mapping[str, str]) -> str:
        """The request's tenant (keyed hash of credential and upstream host)."""
        key = self.tenant_key
        if key is None or key.secret is not self.secret:
            key = self.tenant_key = TenantKey(self.secret)
        return key.tenant(credential_of(headers), self.hosts.get(provider, provider))
