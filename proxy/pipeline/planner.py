"""The breakpoint planner's pure parts: size estimate, system ends, prefix key, `Planner`.

Used by `proxy.pipeline.breakpoints` (which holds the contract); see its docstring for the
rules. Everything here works on a `BlockView` of one request and never touches the body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson
import xxhash

from proxy.pacing import choose_ttls
from proxy.pipeline.blocks import BlockView, Legality, marker_ttl, stronger
from proxy.providers.base import JSONObject, MarkerPolicy, ProviderAdapter
from proxy.settings import UpstreamCapabilities

if TYPE_CHECKING:
    from proxy.pipeline.breakpoints import PlanContext

BYTES_PER_TOKEN: Final = 4
"""The planner's size estimate: one token per 4 UTF-8 bytes, rounded up."""


def _block_bytes(value: Any, key: str, text_kinds: frozenset[str]) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, dict):
        text, kind = value.get("text"), value.get("type")
        if isinstance(text, str) and type(kind) is str and kind in text_kinds:
            return len(text.encode())
        if key in value:
            value = {k: v for k, v in value.items() if k != key}
    return len(orjson.dumps(value))


def first_cacheable(view: BlockView, policy: MarkerPolicy, min_tokens: int) -> int:
    """The first block index whose prefix reaches `min_tokens` (estimate: bytes / 4, rounded
    up); `view.size` when none does."""
    need = BYTES_PER_TOKEN * (min_tokens - 1) + 1
    total = 0
    index = 0
    for run in view.runs:
        for value in run.value if run.is_list else (run.value,):
            total += _block_bytes(value, policy.key, policy.text_kinds)
            if total >= need:
                return index
            index += 1
    return view.size


def system_ends(view: BlockView, tiers: Sequence[str] | None) -> tuple[int, int]:
    """Last block of tools + stable system, and of tools + stable/session system."""
    first, end = view.span("system")
    if tiers is None or len(tiers) != end - first:
        return end - 1, end - 1
    stable = session = 0
    while stable < len(tiers) and tiers[stable] == "stable":
        stable += 1
    while session < len(tiers) and tiers[session] in ("stable", "session"):
        session += 1
    return first + stable - 1, first + session - 1


def prefix_cache_key(view: BlockView, policy: MarkerPolicy, end: int) -> str | None:
    """`pc-` + xxh3-128 (35 characters; the API allows 64, docs/provider-rules.md 9) of the first
    `policy.cache_key_tokens` (the planner's estimate: 4 bytes each) of blocks 0..`end`
    (`policy.key` markers removed, each block's orjson bytes in prefix order); `None` for an
    empty prefix.

    Requests sharing that head of tools + stable system (OpenAI: ~1,024 tokens, its minimum
    cacheable prefix, docs/provider-rules.md 2.1) share the key, so two conversations that could
    share a cache entry are never routed apart by it (the routing hash also covers the first
    ~256 tokens, 2.1), and a session's key does not move while that head is unchanged. A
    shorter prefix is digested whole (nothing shorter is cached anyway)."""
    if end < 0:
        return None
    digest = xxhash.xxh3_128()
    key = policy.key
    left = policy.cache_key_tokens * BYTES_PER_TOKEN
    for i in range(end + 1):
        value = view.value(i)
        if isinstance(value, dict) and key in value:
            value = {k: v for k, v in value.items() if k != key}
        data = orjson.dumps(value)
        digest.update(data[:left])
        left -= len(data)
        if left <= 0:
            break
    return "pc-" + digest.hexdigest()


ONE_HOUR_TAIL_ORDER: Final = ("last", "shared", "bridge", "session", "anchor", "turn", "survivor", "tools")
"""Candidate priority when the newest block is written with a 1h TTL: the anchor keeps nothing
the tail does not (the tail's read reaches it, through a bridge beyond the lookback), so the
end of the session system, which the tenant's next conversation reads, goes before it."""


class Planner:
    def __init__(
        self,
        adapter: ProviderAdapter,
        policy: MarkerPolicy,
        view: BlockView,
        caps: UpstreamCapabilities,
        context: PlanContext,
    ) -> None:
        self.adapter, self.policy, self.view, self.caps = adapter, policy, view, caps
        self.context = context
        self.legal = Legality(adapter, policy, caps, view)
        self.final: dict[int, tuple[Any, str, str]] = {}
        self.moved = self.dropped = 0
        self.ttl_shared, self.ttl_session = context.ttl_shared, context.ttl_session
        self.shared_index: int | None = None
        self.anchor_index: int | None = None
        """The block ending the shared prefix (its marker, and every one before, take
        `ttl_shared`)."""
        self.ttl_anchor: str | None = None
        """TTL of the marker on the previous request's last marker (`proxy.pacing`), when paced."""
        self.write_tail = True
        """False when pacing predicts nobody reads a tail (`proxy.pacing.tail_pays`): no new
        marker past the anchor (the shared prefix, the anchor and tools only)."""
        if context.pacing is not None:
            pacing = context.pacing
            choice = choose_ttls(
                pacing.forecast, agent=pacing.agent, expired=pacing.expired, shared_live=pacing.shared_live
            )
            self.ttl_shared, self.ttl_session, self.ttl_anchor = choice.shared, choice.tail, choice.anchor
            self.write_tail = choice.write_tail

    def _anchor(self) -> int | None:
        """The previous request's last marker position, when this request kept everything up to
        it (no history rewritten before it) and a marker may go there."""
        previous = [i for i in self.context.previous_breakpoints if 0 <= i < self.view.size]
        if not previous or self.context.skips_tail:
            return None
        index = max(previous)
        rewritten = self.context.rewritten_from
        if rewritten is not None:
            return None
        return index if self.legal(index) else None

    def put(self, index: int | None, marker: Any, origin: str, reason: str) -> None:
        if index is None:
            self.dropped += 1
            return
        if origin == "moved":
            self.moved += 1
        current = self.final.get(index)
        if current is None or stronger(current[0], marker) is not current[0]:
            self.final[index] = (marker, origin, reason)

    def resolve(self, marks: dict[int, Any], nested: list[int], top: Any) -> None:
        for index, marker in sorted(marks.items()):
            if self.legal(index):
                self.put(index, marker, "client", "client")
            else:
                self.put(self.legal.nearest(index), marker, "moved", "client")
        for index in nested:
            target = index if self.legal(index) else self.legal.nearest(index)
            content = self.view.value(index)["content"]
            for part in content:
                if isinstance(part, dict) and part.get(self.policy.key) is not None:
                    self.put(target, part[self.policy.key], "moved", "client")
        if top is not None:
            self.put(self.legal.at_or_before(self.view.size - 1), top, "moved", "client")
        excess = len(self.final) - self.policy.max_markers
        if excess > 0:
            order = sorted(self.final)
            for index in order[self.policy.max_markers - 1 : -1]:
                del self.final[index]
            self.dropped += excess

    def candidates(self, stable_end: int, session_end: int, cacheable_from: int, tools_end: int = -1) -> int:
        """Fill free slots; returns how many markers were injected."""
        ctx = self.context
        injected = 0
        last = self.legal.at_or_before(self.view.size - 1)
        first = "last"
        if ctx.skips_tail or self._client_leaves_tail(last):
            last, first = self._turn_boundary(), "turn"
        shared, session = self.ttl_shared, self.ttl_session
        self.shared_index = self.legal.at_or_before(stable_end) if stable_end >= 0 else None
        steps: list[tuple[str, str]] = [
            (first, session),
            ("shared", shared),
            ("anchor", self.ttl_anchor or session),
            ("bridge", session),
            ("turn", session),
            ("survivor", session),
            ("session", session),
            ("tools", shared),
        ]
        if self.ttl_session == "1h" and self.write_tail and first == "last":
            steps = sorted(steps, key=lambda step: ONE_HOUR_TAIL_ORDER.index(step[0]))
        if not self.write_tail:  # only what other conversations or this one already read
            alive = ctx.pacing is None or not ctx.pacing.expired
            keep = ("shared", "tools", "anchor") if alive else ("shared", "tools")
            steps = [step for step in steps if step[0] in keep]
        for reason, ttl in steps:
            if len(self.final) >= self.policy.max_markers:
                break
            if reason == first:
                index = last
            elif reason == "shared":
                index = self.legal.at_or_before(stable_end) if stable_end >= 0 else None
            elif reason == "anchor":
                index = self.anchor_index = self._anchor() if self.ttl_anchor is not None else None
            elif reason == "bridge":
                index = self._bridge(max(self.final)) if self.final else None
            elif reason == "turn":
                index = self._turn_boundary()
            elif reason == "survivor":
                index = self._survivor()
            elif reason == "tools":
                index = self.legal.at_or_before(tools_end) if tools_end >= 0 else None
            else:
                index = self.legal.at_or_before(session_end) if session_end >= 0 else None
            if index is None or index in self.final or index < cacheable_from:
                continue
            self.final[index] = (self._new_marker(ttl), "injected", reason)
            injected += 1
        return injected

    def _client_leaves_tail(self, last: int | None) -> bool:
        """On a session's first request, whether the client marked messages itself and left its
        newest message unmarked: it has said where its reusable prefix ends (aider marks its
        few-shot examples and files and rebuilds what follows every turn), and with no turn
        seen yet nothing says a write on the newest message will be read. From the second
        request on the session's own evidence decides (`PlanContext.skips_tail`)."""
        if not self.context.first or last is None or last in self.final:
            return False
        first_message = self.view.span("messages")[0]
        return any(i >= first_message and origin == "client" for i, (_, origin, _) in self.final.items())

    def _new_marker(self, ttl: str) -> JSONObject:
        marker = dict(self.policy.template)
        if self.policy.has_ttl and ttl == "1h":
            marker["ttl"] = "1h"
        return marker

    def _bridge(self, last: int) -> int | None:
        lookback = self.policy.lookback
        previous = [i for i in self.context.previous_breakpoints if 0 <= i < last]
        if lookback is None or not previous:
            return None
        start = max(previous)
        run_kinds = self.policy.run_kinds
        position, best, before = 0, None, self.view.kind(start)
        for i in range(start + 1, last + 1):
            kind = self.view.kind(i)
            if not (kind == before and kind in run_kinds):
                position += 1
            before = kind
            if position > lookback - 1:
                return best
            if i == last:
                return None
            if self.legal(i, new=True):
                best = i
        return None

    def _survivor(self) -> int | None:
        """The last block before the first message the client rewrote (`PlanContext.
        rewritten_from`), when it lies in the messages section; else `None`."""
        rewritten = self.context.rewritten_from
        if rewritten is None:
            return None
        first_message = self.view.span("messages")[0]
        for r, run in enumerate(self.view.runs):
            if run.section == "messages" and run.message is not None and run.message >= rewritten:
                first = self.view.starts[r]
                index = self.legal.at_or_before(first - 1) if first > 0 else None
                return index if index is not None and index >= first_message else None
        return None

    def _turn_boundary(self) -> int | None:
        runs, starts = self.view.runs, self.view.starts
        for r in range(len(runs) - 1, -1, -1):
            run = runs[r]
            if run.section == "messages" and run.role == "user":
                message = run.message
                first = starts[r]
                while r > 0 and runs[r - 1].message == message and runs[r - 1].section == "messages":
                    r -= 1
                    first = starts[r]
                index = self.legal.at_or_before(first - 1) if first > 0 else None
                return index if index is not None and index >= self.view.span("messages")[0] else None
        return None

    def finish(self) -> dict[int, tuple[Any, str, str]]:
        """Pacing, capabilities, scope and TTL order applied to the final markers.

        Pacing: with `ttl_session` 1h (the session's next read is expected more than 5 minutes
        away and the expected reads repay the 2x write: `proxy.pacing`, docs/provider-rules.md 1.7, 1.9)
        every 5m marker, the client's included, becomes 1h. A 5m tail would be written again
        on every turn after a long gap; a client marker keeps its place and only lives longer
        (its TTL is never shortened)."""
        caps, policy = self.caps, self.policy
        lift = policy.has_ttl and not caps.strip_ttl and self.ttl_session == "1h"
        lift_shared = policy.has_ttl and not caps.strip_ttl and self.ttl_shared == "1h"
        shared_index = self.shared_index if self.shared_index is not None else -1
        if policy.has_ttl and not caps.strip_ttl and self.ttl_anchor == "1h":
            anchor = self._anchor() if self.anchor_index is None else self.anchor_index
            if anchor is not None:  # the anchor and every marker before it (1.7 order)
                shared_index, lift_shared = max(shared_index, anchor), True
        out: dict[int, tuple[Any, str, str]] = {}
        scope: Any = None
        for index in sorted(self.final, reverse=True):
            marker, origin, reason = self.final[index]
            lifted = lift or (lift_shared and (index <= shared_index or reason in ("shared", "tools")))
            if lifted and isinstance(marker, dict) and marker_ttl(marker) != "1h":
                marker = {**marker, "ttl": "1h"}
            if isinstance(marker, dict):
                if caps.strip_ttl and "ttl" in marker or caps.strip_scope and "scope" in marker:
                    drop = {"ttl"} if caps.strip_ttl else set()
                    drop |= {"scope"} if caps.strip_scope else set()
                    marker = {k: v for k, v in marker.items() if k not in drop}
                if "scope" in marker:
                    scope = marker["scope"]
                elif origin == "injected" and scope is not None:
                    marker = {**marker, "scope": scope}
            out[index] = (marker, origin, reason)
        if policy.has_ttl:
            one_hour = [i for i, (m, _, _) in out.items() if marker_ttl(m) == "1h"]
            if one_hour:
                for index in [i for i in out if i < max(one_hour)]:
                    marker, origin, reason = out[index]
                    if marker_ttl(marker) != "1h":
                        out[index] = ({**marker, "ttl": "1h"}, origin, reason)
        return dict(sorted(out.items()))
