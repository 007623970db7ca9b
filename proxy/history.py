"""The index of recent sessions behind `/ui/` and `/debug/sessions`: bounded, per tenant, in memory.

One `SessionEntry` per `(tenant, session_id)` holds what the forensic map draws:
- one `RequestRow` per measured request (newest `requests_per_session` kept): usage read /
  written 5m / 1h / uncached, cost and uncached cost (`rules/pricing.yaml`), and where and why
  the prefix diverged from the session's previous request, with short one-line excerpts around
  the divergence (`proxy.forensics.excerpt`, the same as `promptcache explain`);
- the map of the newest request: its blocks in render order (`MapBlock`: section, kind, role,
  message, estimated tokens, tier of a system block by the rules, marker TTL), at most
  `MAX_MAP_BLOCKS` (the blocks of one message merge when a prompt has more);
- totals over every request of the session (also the ones whose rows were dropped);
- the newest `Measurement` (`/debug/sessions/{id}`'s `last_request`).

Bounds: at most `max_sessions` entries, at most `max_per_tenant` per tenant, at most
`max_bytes` estimated bytes over all entries (`entry_bytes`; `serve` passes the memory budget's
`history` share, `proxy.memory_budget`): the least recently seen go first. No credential ever
reaches it (tenants are keyed hashes). Prompt text is kept
only as the rows' short excerpts, plus, to cut the next request's excerpt, the newest request's
tools and system block bytes when they fit in `HEAD_BYTES_CAP` (kept in memory, never written
anywhere, dropped with the entry); an earlier message's old text comes from the session
record's sidecars, which the store holds anyway.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.forensics import excerpt, first_difference
from proxy.frozen import fast_init
from proxy.prefix import MARKER_KEYS, PrefixChain, PromptScan, estimate_tokens, shared_blocks
from proxy.providers.base import known_name

MAX_SESSIONS: Final = 512
MAX_PER_TENANT: Final = 64
MAX_REQUESTS: Final = 200
MAX_MAP_BLOCKS: Final = 2000
ENTRY_BYTES: Final = 2048
ROW_BYTES: Final = 512
MAP_BLOCK_BYTES: Final = 80
"""Estimated memory of a `SessionEntry` (its fields and last measurement), of one
`RequestRow` (with its excerpts) and of one block of a `PromptMap` (its offset, kind and
chain digest); `entry_bytes` adds them to the head bytes held."""
HEAD_BYTES_CAP: Final = 64 * 1024
"""Tools + system bytes of the newest request kept for the next excerpt (per session)."""
TENANT_PREFIX_CHARS: Final = 8
"""Characters of the tenant hash shown on `/ui/`."""
_TIER_RANK: Final = {"stable": 0, "session": 1, "volatile": 2}


@dataclass(frozen=True, slots=True)
class MapBlock:
    """One block of the map, in render order."""

    section: str
    kind: str
    role: str | None
    message: int | None
    tokens: int
    """Estimated tokens (`estimate_tokens` of the block's canonical bytes)."""
    tier: str | None
    """`stable` / `session` / `volatile` for a system block (the rules), else `None`."""
    ttl: str | None
    """TTL of the marker on the block (`5m` when the marker names none), `None` = no marker."""
    blocks: int = 1
    """Blocks merged into this one (only when a prompt has more than `MAX_MAP_BLOCKS`)."""


@fast_init
@dataclass(frozen=True, slots=True)
class RequestRow:
    """One measured request of a session."""

    n: int
    """1-based number of the request in its session."""
    at: float
    """Epoch seconds when it was measured."""
    model: str
    family: str
    read: int
    write_5m: int
    write_1h: int
    uncached: int
    output: int
    cost_usd: float | None
    uncached_cost_usd: float | None
    cause: str
    section: str
    block: int
    """First block not shared with the previous request."""
    block_path: str | None
    field_path: str | None
    tokens_before: int
    """Estimated tokens before the divergence."""
    prompt_tokens: int
    """Estimated tokens of the whole prompt (`estimate_tokens` of its canonical bytes)."""
    predicted_read: int
    before: str | None
    """Excerpt of the previous request around the divergence (`None` when not known)."""
    after: str | None
    """Excerpt of this request around the divergence."""

    @property
    def prompt_usage(self) -> int:
        return self.read + self.write_5m + self.write_1h + self.uncached


@dataclass(slots=True)
class SessionEntry:
    tenant: str
    session_id: str
    provider: str
    path: str
    first_seen: float
    last_seen: float
    requests: int = 0
    read_tokens: int = 0
    prompt_tokens: int = 0
    """Sum of usage prompt tokens (read + written + uncached) over every request."""
    usage_seen: int = 0
    """Requests whose response carried usage (a Chat stream without
    `stream_options.include_usage` carries none: its tokens and cost are unknown, not 0)."""
    cost_usd: float = 0.0
    uncached_cost_usd: float = 0.0
    rows: deque[RequestRow] = field(default_factory=deque)
    map: PromptMap | None = None
    """The newest request's map (`blocks` builds it)."""
    prices: dict[str, float] | None = None
    """The newest request's price row (USD per million tokens), for the page's divider."""
    last_measurement: Any = None
    _head: tuple[bytes, ...] | None = None
    """orjson bytes of the newest request's tools + system blocks (module docstring)."""
    _bytes: int = 0
    """Estimated memory of the entry (`entry_bytes`, as of its last `add`)."""

    @property
    def blocks(self) -> tuple[MapBlock, ...]:
        """The newest request's blocks in render order (built on each call)."""
        return self.map.blocks() if self.map is not None else ()

    @property
    def hit_ratio(self) -> float | None:
        """Cache-read share of the prompt tokens of the requests whose usage was seen; `None`
        (unknown) when none was, or none had a prompt token."""
        return self.read_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def savings_usd(self) -> float | None:
        """USD saved against no token cached, over the requests whose usage was seen; `None`
        (unknown) when none was."""
        return self.uncached_cost_usd - self.cost_usd if self.usage_seen else None

    @property
    def last_cause(self) -> str | None:
        return self.rows[-1].cause if self.rows else None

    def summary(self) -> dict[str, Any]:
        """The listing's fields (`/debug/sessions`, `/ui/`)."""
        return {
            "session_id": self.session_id,
            "tenant": self.tenant[:TENANT_PREFIX_CHARS],
            "provider": self.provider,
            "model": self.rows[-1].model if self.rows else "",
            "requests": self.requests,
            "hit_ratio": None if (ratio := self.hit_ratio) is None else round(ratio, 4),
            "savings_usd": None if (saved := self.savings_usd) is None else round(saved, 6),
            "cost_usd": round(self.cost_usd, 6) if self.usage_seen else None,
            "last_cause": self.last_cause,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
        }


# --- pure pieces ---------------------------------------------------------------------------------


def marker_ttl(value: Any) -> str | None:
    """TTL of a block's marker (`ttl` of the marker object, else `5m`), `None` without one."""
    if not isinstance(value, dict):
        return None
    for key in MARKER_KEYS:
        marker = value.get(key)
        if marker is not None:
            ttl = marker.get("ttl") if isinstance(marker, dict) else None
            return ttl if isinstance(ttl, str) else "5m"
    return None


def block_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    return ""


@fast_init
@dataclass(frozen=True, slots=True)
class PromptMap:
    """What the map of one request needs, kept compact: the request's own `ends` and `kinds`
    (no text), one `(section, role, message, first block, blocks)` per layout run, the marker
    TTLs and the system tiers by block index. `blocks()` builds the `MapBlock`s when a page
    asks (the response path only pays for the runs and the system blocks)."""

    ends: Sequence[int]
    kinds: Sequence[str]
    runs: tuple[tuple[str, str | None, int | None, int, int], ...]
    ttls: dict[int, str]
    tiers: dict[int, str]
    is_budget_spent: bool = False
    """The scan budget ran out: some system blocks show `stable`, unclassified."""
    chain: PrefixChain | None = None
    """The request's chain digests (`PromptScan.chain`), for the session's next map to reuse
    the runs and tiers of the blocks the two requests share (`prompt_map`'s `previous`)."""
    classifier: Any = None
    """The classifier the tiers came from (reused tiers need the same one)."""

    def blocks(self) -> tuple[MapBlock, ...]:
        out: list[MapBlock] = []
        previous_end = 0
        for section, role, message, first, count in self.runs:
            for index in range(first, first + count):
                end = self.ends[index]
                out.append(
                    MapBlock(
                        section,
                        self.kinds[index],
                        role,
                        message,
                        estimate_tokens(end - previous_end),
                        self.tiers.get(index),
                        self.ttls.get(index),
                    )
                )
                previous_end = end
        return merge_blocks(out, MAX_MAP_BLOCKS)


def prompt_map(
    prompt: PromptScan,
    top_marker_ttl: str | None = None,
    classifier: Any = None,
    budget: Any = None,
    previous: PromptMap | None = None,
) -> PromptMap:
    """The `PromptMap` of one request from its `PromptScan` (`proxy.prefix.scan_prompt`).

    `top_marker_ttl`: TTL of a top-level marker (it marks the last block); `classifier`: a
    `proxy.pipeline.segments.Classifier` for the tier of system blocks (worst segment tier;
    `stable` without one), spending `budget` (`proxy.rules.Budget`, the request's: once it
    runs out the remaining blocks are `stable` and `is_budget_spent` is set).

    `previous`: the session's previous map. Its runs and tiers are taken as they are for the
    leading blocks the two chains share (`_reused`), so an appended turn walks its new runs
    only; the result equals the map made without `previous` (a property test holds it), except
    that the reused system blocks spend no budget."""
    is_spent = False
    layout = prompt.blocks
    runs, tiers, at = _reused(previous, prompt, classifier)
    starts = layout.starts
    first_run = bisect_left(starts, at) if at else 0
    bounds = [*starts[first_run + 1 :], len(prompt.values)] if first_run < len(starts) else []
    for run, index, stop in zip(layout.runs[first_run:], starts[first_run:], bounds, strict=True):
        count = stop - index
        if not count:
            continue
        role = run.role
        runs.append((run.section, known_name(role) if role is not None else None, run.message, index, count))
        if run.section == "system":
            for offset in range(count):
                tier = "stable"
                if classifier is not None and not is_spent:
                    value = prompt.values[index + offset]
                    try:
                        segments = classifier.segments(block_text(value), budget)
                    except _budget_spent():
                        is_spent, segments = True, ()
                    found = [seg.tier for seg in segments if not seg.wrap]
                    tier = max(found, key=_TIER_RANK.__getitem__) if found else "stable"
                tiers[index + offset] = tier
    ttls: dict[int, str] = {}
    for i in prompt.marked:
        ttl = marker_ttl(prompt.values[i])
        if ttl is not None:
            ttls[i] = ttl
    n = len(prompt.values)
    if n and top_marker_ttl is not None and (n - 1) not in ttls:
        ttls[n - 1] = top_marker_ttl
    return PromptMap(prompt.chain.ends, prompt.kinds, tuple(runs), ttls, tiers, is_spent, prompt.chain, classifier)


def _reused(
    previous: PromptMap | None, prompt: PromptScan, classifier: Any
) -> tuple[list[tuple[str, str | None, int | None, int, int]], dict[int, str], int]:
    """The runs and tiers of `previous` that `prompt`'s map shares, and the block they end at.

    A run is shared when it ends within the blocks whose chain digests the two requests share
    (same bytes, sections, roles and message boundaries: `proxy.prefix.shared_blocks`) and
    `prompt`'s layout has a run that starts where the last shared one ends and a run the same
    as that last one (a message number shifted by an empty message, or a run split otherwise,
    shows there). Nothing is shared when the previous map ran out of budget or was classified
    by another classifier. Runs are compared by `(section, role, message, first, count)`."""
    if previous is None or previous.chain is None or previous.is_budget_spent or previous.classifier is not classifier:
        return [], {}, 0
    shared = shared_blocks(previous.chain, prompt.chain)
    old, starts, runs = previous.runs, prompt.blocks.starts, prompt.blocks.runs
    j = bisect_right(old, shared, key=_run_end) if shared else 0
    for candidate in (j, j - 1):  # the last shared run, else the one before (a message grew)
        if candidate <= 0:
            break
        last = old[candidate - 1]
        at = last[3] + last[4]
        k = bisect_left(starts, at)  # the run after: the first one starting at `at` or later
        # the run holding block `at - 1` (not an empty one: that starts where the next run does)
        mine = runs[k - 1]
        here = (mine.section, mine.role, mine.message, starts[k - 1], at - starts[k - 1])
        if (starts[k] == at if k < len(starts) else at == len(prompt.values)) and here == last:
            return list(old[:candidate]), {i: t for i, t in previous.tiers.items() if i < at}, at
    return [], {}, 0


def _run_end(run: tuple[str, str | None, int | None, int, int]) -> int:
    return run[3] + run[4]


def _budget_spent() -> type[Exception]:
    """`proxy.pipeline.segments.BudgetSpent` (imported when a classifier is used: the pipeline
    imports this module)."""
    from proxy.pipeline.segments import BudgetSpent

    return BudgetSpent


def map_blocks(prompt: PromptScan, top_marker_ttl: str | None = None, classifier: Any = None) -> tuple[MapBlock, ...]:
    """The map of one request: `prompt_map(...).blocks()`."""
    return prompt_map(prompt, top_marker_ttl, classifier).blocks()


def merge_blocks(blocks: Sequence[MapBlock], cap: int) -> tuple[MapBlock, ...]:
    """At most `cap` blocks: the blocks of one message merge (tokens summed, the last TTL kept)
    when there are more; if still more, the oldest messages merge into one."""
    if len(blocks) <= cap:
        return tuple(blocks)
    out: list[MapBlock] = []
    for block in blocks:
        last = out[-1] if out else None
        if last is not None and block.message is not None and block.message == last.message:
            out[-1] = MapBlock(
                last.section,
                "message",
                last.role,
                last.message,
                last.tokens + block.tokens,
                None,
                block.ttl or last.ttl,
                last.blocks + block.blocks,
            )
        else:
            out.append(block)
    if len(out) > cap:
        head = [b for b in out if b.section != "messages"]
        messages = [b for b in out if b.section == "messages"]
        keep = max(1, cap - len(head) - 1)
        old, recent = messages[:-keep], messages[-keep:]
        if old:
            merged = MapBlock(
                "messages",
                "messages",
                None,
                old[0].message,
                sum(b.tokens for b in old),
                None,
                next((b.ttl for b in reversed(old) if b.ttl), None),
                sum(b.blocks for b in old),
            )
            out = [*head, merged, *recent]
    return tuple(out)


def top_ttl(body: Any) -> str | None:
    """TTL of a top-level marker of `body` (Anthropic automatic caching), `None` without one."""
    return marker_ttl(body) if isinstance(body, dict) else None


def head_bytes(prompt: PromptScan, cap: int = HEAD_BYTES_CAP) -> tuple[bytes, ...] | None:
    """orjson bytes of the leading tools + system blocks, or `None` when over `cap` bytes."""
    n = 0
    for run in prompt.blocks.runs:
        if run.section == "messages":
            break
        n += len(run)
    end = prompt.chain.ends[n - 1] if n else 0
    if end > cap:
        return None
    return tuple(orjson.dumps(v) for v in prompt.values[:n])


def _message_slot(path: str) -> tuple[str, int] | None:
    """`("messages", 3)` of a block path such as `messages[3].content[0]` or `input[5]`."""
    key, bracket, rest = path.partition("[")
    if not bracket:
        return None
    number, _, _ = rest.partition("]")
    return (key, int(number)) if number.isdigit() else None


def divergence_excerpts(
    section: str,
    index: int,
    prompt: PromptScan,
    body: Any,
    head: tuple[bytes, ...] | None,
    sidecars: Iterable[Any],
) -> tuple[str | None, str | None, str | None]:
    """`(field_path, before, after)` around the first difference of block `index`.

    The previous value comes from `head` (tools / system) or from the previous request's sidecar
    of the same message (messages); `before` is `None` when it is not known."""
    if section == "none" or index >= len(prompt.values):
        return None, None, None
    block = prompt.blocks[index]
    old: Any = None
    new: Any = block.value
    where = block.path
    if section in ("tools", "system"):
        if head is not None and index < len(head):
            old = orjson.loads(head[index])
    else:
        slot = _message_slot(block.path)
        if slot is not None and isinstance(body, dict) and isinstance(body.get(slot[0]), list):
            key, position = slot
            items = body[key]
            if position < len(items):
                new, where = items[position], f"{key}[{position}]"
                found = next((s for s in sidecars if getattr(s, "position", None) == position), None)
                if found is not None:
                    old = orjson.loads(found.value)
    if old is None:
        text = block_text(new)
        return where, None, excerpt(text if text else new, 0)
    path, char, leaf_old, leaf_new = first_difference(old, new, where)
    return path, excerpt(leaf_old, char), excerpt(leaf_new, char)


# --- the index ---------------------------------------------------------------------------------


class SessionHistory:
    """Recent sessions, bounded (module docstring). Event-loop only (no locking)."""

    def __init__(
        self,
        max_sessions: int = MAX_SESSIONS,
        max_per_tenant: int = MAX_PER_TENANT,
        requests_per_session: int = MAX_REQUESTS,
        max_bytes: int | None = None,
    ) -> None:
        self._entries: OrderedDict[tuple[str, str], SessionEntry] = OrderedDict()
        self.max_bytes = max_bytes
        self.bytes_held = 0
        """Sum of the entries' `entry_bytes` estimates."""
        self._per_tenant: dict[str, int] = {}
        self.max_sessions = max(1, max_sessions)
        """At least 1 (`history_sessions: 0` means no index at all: nothing calls `add`)."""
        self.max_per_tenant = max(1, max_per_tenant)
        self.requests_per_session = max(1, requests_per_session)

    def __len__(self) -> int:
        return len(self._entries)

    # Compatibility with the former `LastMeasurements` (newest measurement per session).
    def get(self, tenant: str, session_id: str) -> Any:
        entry = self._entries.get((tenant, session_id))
        return entry.last_measurement if entry is not None else None

    def entry(self, tenant: str, session_id: str) -> SessionEntry | None:
        return self._entries.get((tenant, session_id))

    def find(self, session_id: str, tenant_prefix: str = "") -> SessionEntry | None:
        """The most recently seen entry with this session id (and tenant hash prefix)."""
        for (tenant, sid), entry in reversed(self._entries.items()):
            if sid == session_id and tenant.startswith(tenant_prefix):
                return entry
        return None

    def recent(self, tenants: Iterable[tuple[str, str]] | None = None) -> list[SessionEntry]:
        """Entries newest first; only `(provider, tenant)` pairs in `tenants` when given."""
        wanted = None if tenants is None else set(tenants)
        return [e for e in reversed(self._entries.values()) if wanted is None or (e.provider, e.tenant) in wanted]

    def _open(self, tenant: str, session_id: str, provider: str, path: str, now: float) -> SessionEntry:
        key = (tenant, session_id)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry
        if self._per_tenant.get(tenant, 0) >= self.max_per_tenant:
            oldest = next(k for k in self._entries if k[0] == tenant)
            self._drop(oldest)
        while len(self._entries) >= self.max_sessions:
            self._drop(next(iter(self._entries)))
        entry = SessionEntry(tenant, session_id, provider, path, now, now, rows=deque(maxlen=self.requests_per_session))
        self._entries[key] = entry
        self._per_tenant[tenant] = self._per_tenant.get(tenant, 0) + 1
        return entry

    def _drop(self, key: tuple[str, str]) -> None:
        self.bytes_held -= self._entries.pop(key)._bytes
        left = self._per_tenant[key[0]] - 1
        if left:
            self._per_tenant[key[0]] = left
        else:
            del self._per_tenant[key[0]]

    def add(
        self,
        tenant: str,
        session_id: str,
        measurement: Any,
        *,
        path: str,
        body: Any = None,
        prompt: PromptScan | None = None,
        previous: Any = None,
        classifier: Any = None,
        prices: Any = None,
        now: float | None = None,
        budget: Any = None,
    ) -> SessionEntry:
        """Record one measured request (`proxy.measure.Measurement`) of a session.

        `body` and `prompt` are what was sent (for the map and the excerpts), `previous` the
        session's previous `SessionRecord` (its sidecars), `prices` the request's `Prices`."""
        now = time.time() if now is None else now
        entry = self._open(tenant, session_id, measurement.provider, path, now)
        entry.last_seen = now
        entry.requests += 1
        entry.last_measurement = measurement
        usage = measurement.usage
        divergence = measurement.divergence
        field_path = before = after = None
        if prompt is not None:
            field_path, before, after = divergence_excerpts(
                divergence.section,
                divergence.block_index,
                prompt,
                body,
                entry._head,
                getattr(previous, "sidecars", ()),
            )
            entry.map = prompt_map(prompt, top_ttl(body), classifier, budget, entry.map)
            entry._head = head_bytes(prompt)
        if prices is not None:
            entry.prices = {
                "input": prices.input,
                "output": prices.output,
                "cache_write_5m": prices.cache_write_5m,
                "cache_write_1h": prices.cache_write_1h,
                "cache_read": prices.cache_read,
            }
        row = RequestRow(
            n=entry.requests,
            at=now,
            model=_model(body),
            family=measurement.family,
            read=usage.cache_read if usage else 0,
            write_5m=usage.cache_write_5m if usage else 0,
            write_1h=usage.cache_write_1h if usage else 0,
            uncached=usage.input_none if usage else 0,
            output=usage.output if usage else 0,
            cost_usd=measurement.cost_usd,
            uncached_cost_usd=measurement.uncached_cost_usd,
            cause=measurement.cause,
            section=divergence.section,
            block=divergence.block_index,
            block_path=measurement.block_path,
            field_path=field_path,
            tokens_before=divergence.tokens,
            prompt_tokens=estimate_tokens(measurement.prompt_bytes),
            predicted_read=measurement.predicted_read_tokens,
            before=before,
            after=after,
        )
        entry.rows.append(row)
        size = entry_bytes(entry)
        self.bytes_held += size - entry._bytes
        entry._bytes = size
        key = (tenant, session_id)
        while self.max_bytes is not None and self.bytes_held > self.max_bytes and len(self._entries) > 1:
            oldest = next(iter(self._entries))
            self._drop(oldest if oldest != key else list(self._entries)[1])
        entry.usage_seen += usage is not None
        entry.read_tokens += row.read
        entry.prompt_tokens += row.prompt_usage
        entry.cost_usd += measurement.cost_usd or 0.0
        entry.uncached_cost_usd += measurement.uncached_cost_usd or 0.0
        return entry


def entry_bytes(entry: SessionEntry) -> int:
    """Estimated memory of `entry` (`ENTRY_BYTES`, `ROW_BYTES`, `MAP_BLOCK_BYTES`, head bytes)."""
    head = sum(map(len, entry._head)) if entry._head else 0
    blocks = len(entry.map.ends) if entry.map is not None else 0
    return ENTRY_BYTES + head + ROW_BYTES * len(entry.rows) + MAP_BLOCK_BYTES * blocks


def _model(body: Any) -> str:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else ""
