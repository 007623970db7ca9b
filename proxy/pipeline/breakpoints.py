"""breakpoints: plan at most `MarkerPolicy.max_markers` cache markers.

Pure core `place_breakpoints(adapter, body, ...)` -> `(body, Plan)` (its planning parts
live in `proxy.pipeline.planner`); `STAGE` adapts it to the `Exchange`.

Contract (positions are indices into `adapter.prefix_blocks(body)`):
- Client markers that are legal stay. Illegal ones move to the nearest block that may carry a
  marker (ties: the earlier block): from thinking blocks and empty text (docs/provider-rules.md 1.3), from
  tool messages when the upstream has `no_tool_message_markers`; markers inside
  `tool_result.content` move onto the `tool_result` (section 7). A top-level automatic marker
  (1.1) becomes an explicit one on the last eligible block. Two markers on one block merge
  (the longer TTL wins). With no legal block a marker is dropped.
- More than `max_markers` (4: 1.4, 2.3): the last and the earliest ones are kept.
- Free slots get candidates, in priority order, each snapped back to the nearest block at or
  before it that may take a marker: the last eligible block; the end of tools + stable system
  (TTL `ttl_shared`: shared across the tenant's sessions); a bridge at most `lookback - 1`
  positions after the previous request's last breakpoint when the last marker cannot reach it
  (1.5: 20 positions, a run of tool_use or of tool_result blocks counting as one); the last
  message block before the newest user message (the end of the previous turn: still
  byte-identical next turn when volatile text was moved onto the newest user message); when
  the client rewrote its history (`PlanContext.rewritten_from`: aider rebuilds the messages
  after its few-shot examples every turn), the last block before the first rewritten message
  (reason `survivor`: the last block that survived the previous turn, the prefix the next turn
  is known to keep); the end of the session-stable system; the end of the tools (reason
  `tools`, TTL `ttl_shared`: a conversation that shares the tools but not the system prompt
  still reads them). When the newest block is marked with a 1h TTL the order is last, shared,
  bridge, session, anchor, turn, survivor, tools (`planner.ONE_HOUR_TAIL_ORDER`: a 1h tail
  keeps everything an anchor would, and the session system's end is what the tenant's next
  conversation reads: Claude Code marks three blocks itself and leaves one slot). A
  candidate whose prefix is under the model's minimum
  (`rules/models.yaml`, 1.6) is skipped. The estimate is the proxy's own: UTF-8 bytes of the
  blocks up to it / 4, rounded up (text blocks count their text, other blocks their JSON
  without markers), deliberately independent of the simulator's tokenizer.
- Wasted tails (`PlanContext.tail_misses`): a write is only worth its 1.25x when a later
  request reads it, and a read needs the prefix up to the marked block byte for byte (1.5).
  When the session's last `TAIL_MISSES_TO_SKIP` requests each rewrote the newest message of
  the request before them (aider appends a reminder to its newest user message and drops it
  next turn), a marker on the newest message would be written and never read; the first
  candidate then goes to the end of the previous turn instead (the last block the client
  has kept so far, reason `turn`). A client's own markers are never moved for it. As soon
  as a request keeps the previous newest message (the count is back to 0), the last block
  is marked again. Deterministic: the count comes from the session record. A rewrite of an
  earlier message up to the previous request's newest one counts too (that tail was not read
  either). On a session's first request (`PlanContext.first`: no record of an earlier one), a
  client that marked messages itself but not its newest message has said where its reusable
  prefix ends (aider marks its few-shot examples and files and rebuilds what follows): the
  first candidate goes to the end of the previous turn as well.
- Cost guard (`proxy.pacing.tail_pays`): when the forecast says no later request reads a new
  tail (the conversation is predicted to end, or to resume only after the hour), no marker is
  added past the anchor: only the shared prefix, the tools' end and the anchor (while its
  entry lives: an expired anchor would be a write like any tail) are candidates.
- TTLs (1.7, 1.9): injected markers take the TTLs of `PlanContext` (pacing, `proxy.pacing`):
  with `PlanContext.pacing` set, `proxy.pacing.choose_ttls` picks them from the forecast and
  the share of the prompt past the previous request's last marker (the planner's byte
  estimate; the whole prompt when that entry expired), and every marker up to the shared
  prefix's takes the shared TTL.
  When the session's TTL is 1h (the next read is expected more than 5 minutes away and the
  reads repay the 2x write), every 5m marker becomes 1h, the client's included, so the tail
  written this turn is still there after the gap; a TTL is never shortened. A 1h marker may
  not follow a 5m one, so every marker before the last 1h marker becomes 1h (billing charges
  1h writes up to the highest 1h breakpoint anyway: no extra cost).
  Capabilities strip `ttl` / `scope` from every marker. Injected markers before a client marker
  with a `scope` take the same scope (1.2: `global` only after global blocks).
- Providers without markers (`max_markers` 0: OpenAI before GPT-5.6) keep their markers as
  sent. When the policy names a `cache_key_field` (`prompt_cache_key`) the client did not set,
  it is set to a digest of the first ~1,024 tokens of tools + stable system
  (`planner.prefix_cache_key`: conversations sharing that much prefix share a key, so the key
  never routes apart requests that could share a cache entry; a client's own key is kept;
  never derived from a credential).
- Pure and idempotent: planning its own output changes nothing; `body` is never mutated.

Notes: reads `plan_context` (`PlanContext`, from the session engineer) and `system_tiers`
(from reorder); writes `plan` (`Plan`: final marker positions and TTLs, counts, cache key).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from proxy.exchange import Exchange
from proxy.frozen import fast_init
from proxy.pacing import Forecast
from proxy.pipeline.blocks import (
    BlockView,
    Editor,
    marker_ttl,
    order_top_keys,
    write_marker,
)
from proxy.pipeline.layout import LayoutCache
from proxy.pipeline.planner import Planner, first_cacheable, prefix_cache_key, system_ends
from proxy.pipeline.support import (
    NO_CAPABILITY_LIMITS,
    count_markers,
    layout_cache,
    request_capabilities,
    request_min_tokens,
)
from proxy.providers.base import JSONObject, MarkerPolicy, ProviderAdapter
from proxy.services import Services
from proxy.settings import UpstreamCapabilities

TAIL_MISSES_TO_SKIP: Final = 1
"""Consecutive rewritten newest messages after which the newest message gets no new marker."""


@fast_init
@dataclass(frozen=True, slots=True)
class PacingInput:
    """What the TTL rule needs besides the prompt (`proxy.pacing`)."""

    forecast: Forecast
    agent: bool = False
    """A subagent request (machine-paced): its tail gets 5m."""
    expired: bool = False
    """The previous request's tail entry is gone by now (5m, more than 5 minutes ago): this
    request writes its whole prompt again."""
    shared_live: bool = False
    """The shared prefix was sent less than 5 minutes ago (its entry is alive)."""


@fast_init
@dataclass(frozen=True, slots=True)
class PlanContext:
    """What the session knows for planning (`Exchange.plan_context`)."""

    previous_breakpoints: tuple[int, ...] = ()
    """Positions (prefix-block indices) of the markers the session's previous request wrote."""
    ttl_shared: str = "5m"
    """TTL of the marker ending tools + stable system (shared across sessions): `5m` or `1h`."""
    ttl_session: str = "5m"
    """TTL of every other marker the planner adds."""
    tail_misses: int = 0
    """Consecutive requests of the session, this one included, that rewrote the newest message
    of the request before them (`SessionRecord.tail_misses`): a marker there was never read."""
    rewritten_from: int | None = None
    """Index (in the message array) of the first earlier message this request rewrote
    (`Exchange.history_rewritten`); `None` when the client kept its history."""
    pacing: PacingInput | None = None
    """The session's forecast: when set, the planner chooses `ttl_shared` / `ttl_session` itself
    (`proxy.pacing.choose_ttls`) from the share of the prompt this request writes."""
    first: bool = False
    """The session's first request (no record of an earlier one): see `skips_tail`."""

    @property
    def skips_tail(self) -> bool:
        """No new marker on the newest message (module docstring, wasted tails)."""
        return self.tail_misses >= TAIL_MISSES_TO_SKIP


@dataclass(frozen=True, slots=True)
class PlannedMarker:
    index: int
    """Prefix-block index the marker is on."""
    ttl: str | None
    """`5m` / `1h`; `None` where markers have no TTL of their own (OpenAI)."""
    origin: str
    """`client` (kept in place), `moved` or `injected`."""
    reason: str
    """Why it is there: `client`, `last`, `survivor`, `shared`, `bridge`, `turn`, `session` or
    `tools`."""


@fast_init
@dataclass(frozen=True, slots=True)
class Plan:
    markers: tuple[PlannedMarker, ...] = ()
    """Final markers in prefix order."""
    cache_key: str | None = None
    """The `prompt_cache_key` the proxy set, if it set one."""
    injected: int = 0
    moved: int = 0
    dropped: int = 0
    kept: int = 0

    @property
    def positions(self) -> tuple[int, ...]:
        return tuple(m.index for m in self.markers)


def place_breakpoints(
    adapter: ProviderAdapter,
    body: JSONObject,
    *,
    min_tokens: int = 0,
    system_tiers: Sequence[str] | None = None,
    context: PlanContext | None = None,
    caps: UpstreamCapabilities = NO_CAPABILITY_LIMITS,
    cache: LayoutCache | None = None,
) -> tuple[JSONObject, Plan]:
    """`body` with its markers planned (see the module docstring), and the plan (pure).

    `cache` reuses layout and scan results of earlier stages of the same request."""
    policy = adapter.marker_policy(body)
    cache = cache if cache is not None else LayoutCache()
    view, marks, nested = cache.view(adapter, body, policy, adapter.tool_shape.call_kinds)
    stable_end, session_end = system_ends(view, system_tiers)
    editor = Editor(body)
    cache_key = None
    if policy.cache_key_field is not None and policy.cache_key_field not in body:
        cache_key = prefix_cache_key(view, policy, stable_end)
        if cache_key is not None:
            editor.set((policy.cache_key_field,), cache_key)
    if policy.max_markers <= 0:
        return _finish(editor, adapter, cache_key), Plan(cache_key=cache_key)
    top_key = policy.top_level_key
    top = body.get(top_key) if top_key is not None else None
    cacheable_from = first_cacheable(view, policy, min_tokens)
    if not marks and not nested and top is None and cacheable_from >= view.size:
        # no client marker to keep or move and no prefix long enough to cache: the planner
        # would inject nothing (every candidate lies before `cacheable_from`)
        return _finish(editor, adapter, cache_key), Plan(cache_key=cache_key)
    ends = (stable_end, session_end)
    return _plan(editor, adapter, view, policy, caps, context, marks, nested, top, cacheable_from, ends, cache_key)


def _plan(
    editor: Editor,
    adapter: ProviderAdapter,
    view: BlockView,
    policy: MarkerPolicy,
    caps: UpstreamCapabilities,
    context: PlanContext | None,
    marks: dict[int, Any],
    nested: list[int],
    top: Any,
    cacheable_from: int,
    ends: tuple[int, int],
    cache_key: str | None,
) -> tuple[JSONObject, Plan]:
    """`place_breakpoints` past its checks: the `Planner` keeps, moves and injects markers
    (blocks before `cacheable_from` get none injected; `ends`: the last blocks of the stable
    and of the session-stable prefix, `system_ends`) and `editor` writes them."""
    stable_end, session_end = ends
    planner = Planner(adapter, policy, view, caps, context or PlanContext())
    top_key = policy.top_level_key
    planner.resolve(marks, nested, top)
    tools_end = view.span("tools")[1] - 1
    injected = planner.candidates(stable_end, session_end, cacheable_from, tools_end=tools_end)
    final = planner.finish()
    _apply(editor, adapter, view, policy.key, marks, nested, final)
    if top_key is not None and top is not None:
        editor.delete((top_key,))
    markers = tuple(
        PlannedMarker(i, marker_ttl(m) if policy.has_ttl else None, origin, reason)
        for i, (m, origin, reason) in final.items()
    )
    kept = sum(1 for m in markers if m.origin == "client")
    plan = Plan(markers, cache_key, injected, planner.moved, planner.dropped, kept)
    return _finish(editor, adapter, cache_key), plan


def _finish(editor: Editor, adapter: ProviderAdapter, cache_key: str | None) -> JSONObject:
    """The edited body; an added top-level key goes before the prefix keys (canonical order)."""
    result = editor.result()
    return order_top_keys(result, adapter.prefix_keys) if cache_key is not None else result


def _apply(
    editor: Editor,
    adapter: ProviderAdapter,
    view: BlockView,
    key: str,
    marks: dict[int, Any],
    nested: list[int],
    final: dict[int, tuple[Any, str, str]],
) -> None:
    strip = set(nested)
    for index in sorted(set(marks) | set(final) | strip):
        desired = final[index][0] if index in final else None
        if desired is marks.get(index) and index not in strip:
            continue
        run, pos = view.locate(index)
        if not run.is_list:
            write_marker(editor, adapter, view, key, index, desired)
            continue
        value = run.value[pos]
        new = {k: v for k, v in value.items() if k != key}
        if desired is not None:
            new[key] = desired
        if index in strip:
            new["content"] = [
                {k: v for k, v in p.items() if k != key} if isinstance(p, dict) and key in p else p
                for p in value["content"]
            ]
        editor.set(run.key + (pos,), new)


class BreakpointsStage:
    name: Final = "breakpoints"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        body = exchange.body
        if body is None:
            return
        new_body, plan = place_breakpoints(
            exchange.adapter,
            body,
            min_tokens=request_min_tokens(services, exchange),
            system_tiers=exchange.system_tiers,
            context=exchange.plan_context,
            caps=request_capabilities(services, exchange),
            cache=layout_cache(exchange),
        )
        exchange.plan = plan
        count_markers(
            exchange, services, injected=plan.injected, moved=plan.moved, dropped=plan.dropped, kept=plan.kept
        )
        if new_body is not body:
            exchange.replace_body(new_body)


STAGE: Final = BreakpointsStage()
