"""reorder: durable-first system prompt (DESIGN.md section 4).

Pure core `reorder_body(adapter, path, body, rules)`; `STAGE` adapts it to the `Exchange`.

Contract:
- The system prompt (`adapter.system_units`: Anthropic `system` blocks or string; OpenAI head
  system/developer message parts and Responses `instructions`) is split into segments by the
  rules (`proxy.pipeline.segments`) and stable-sorted by tier: stable, session, volatile.
  Unclassified text is stable and keeps its order.
- A unit is split only where its segments classify differently: its segments of one tier are
  joined (in order) into one block, so a unit gives at most three blocks. A marker on a split
  unit moves to its stable part (else its session part, else its volatile part). A unit that
  cannot be split (`splittable` False) is sorted inside its own text and stays one block.
- Segments of a `move_to_user` rule leave the system prompt and become leading text blocks of
  the newest user message (`adapter.with_user_text`; one block per unit they come from), so the
  whole system prompt becomes byte-stable. When the request has no user message that can take
  them they stay in the system prompt as volatile segments. A marker on a unit that leaves
  entirely is dropped.
- Input: a canonical body (canonicalise ran before), so `tiers` line up with the output.
- Text is never edited: the multiset of segment texts is unchanged, only moved. Same input,
  same output; reordering its own output changes nothing (idempotent).
- Notes written: `system_tiers` (tuple of tier names, one per system block of the output, in
  prefix order: the planner's "stable system" and "session system" ends),
  `system_moved_to_user` (number of text blocks moved onto the user message).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from proxy.exchange import Exchange
from proxy.pipeline.canonicalise import canonicalise_body
from proxy.pipeline.segments import TIER_RANK, Classifier, classifier_for
from proxy.pipeline.support import NO_CAPABILITY_LIMITS, capabilities_for, count_markers, rules_for
from proxy.providers.base import JSONObject, ProviderAdapter, SystemPart, SystemUnit
from proxy.rules import RuleSet
from proxy.services import Services
from proxy.settings import UpstreamCapabilities


@dataclass(frozen=True, slots=True)
class SystemPlan:
    """The reordered system prompt of one request."""

    parts: tuple[SystemPart, ...]
    tiers: tuple[str, ...]
    """Tier of each part (a part = one system block of the output)."""
    moved: tuple[str, ...]
    """Texts to put at the head of the newest user message, one block per unit (none: `()`)."""
    changed: bool
    markers_moved: int = 0
    markers_dropped: int = 0


def _worst(tiers: Sequence[str]) -> str:
    return max(tiers, key=TIER_RANK.__getitem__)


def plan_system(units: Sequence[SystemUnit], classifier: Classifier, allow_move: bool = True) -> SystemPlan:
    """Split, classify and stable-sort `units` (pure)."""
    ranked: list[tuple[int, str, SystemPart]] = []
    moved: list[str] = []
    changed = False
    markers_moved = markers_dropped = 0
    for source, unit in enumerate(units):
        if unit.text is None:
            ranked.append((0, "stable", SystemPart(source, "", unit.marker, whole=True)))
            continue
        segments = classifier.segments(unit.text)
        staying = [s for s in segments if not (allow_move and s.move_to_user)]
        leaving = "".join(s.text for s in segments if allow_move and s.move_to_user)
        if leaving:
            moved.append(leaving)
            changed = True
        tiers = {s.tier for s in staying}
        if not leaving and len(tiers) == 1:
            tier = tiers.pop()
            ranked.append((TIER_RANK[tier], tier, SystemPart(source, unit.text, unit.marker, whole=True)))
            continue
        if not staying:
            markers_dropped += unit.marker is not None
            continue
        if not unit.splittable:
            tier = _worst([s.tier for s in staying])
            ordered = sorted(staying, key=lambda s: TIER_RANK[s.tier])
            if not staying[-1].text.endswith("\n") and ordered[-1] is not staying[-1]:
                ordered = staying  # the unterminated last line would join another: keep order
            text = "".join(s.text for s in ordered)
            is_whole = text == unit.text
            changed = changed or not is_whole
            ranked.append((TIER_RANK[tier], tier, SystemPart(source, text, unit.marker, whole=is_whole)))
            continue
        changed = True
        marker = unit.marker
        markers_moved += marker is not None
        for tier in ("stable", "session", "volatile"):
            text = "".join(s.text for s in staying if s.tier == tier)
            if text:
                ranked.append((TIER_RANK[tier], tier, SystemPart(source, text, marker)))
                marker = None
    ordered = sorted(ranked, key=lambda item: item[0])
    if any(a is not b for a, b in zip(ordered, ranked, strict=True)):
        changed = True
    return SystemPlan(
        parts=tuple(part for _, _, part in ordered),
        tiers=tuple(tier for _, tier, _ in ordered),
        moved=tuple(moved),
        changed=changed,
        markers_moved=markers_moved,
        markers_dropped=markers_dropped,
    )


def reorder_body(
    adapter: ProviderAdapter,
    path: str,
    body: JSONObject,
    rules: RuleSet,
    caps: UpstreamCapabilities = NO_CAPABILITY_LIMITS,
) -> tuple[JSONObject, SystemPlan]:
    """`body` with its system prompt in durable-first order (pure; `body` is not mutated).

    Text moved onto the user message can make an empty text block there removable, so the
    result is canonicalised again (`caps` as for canonicalise) to stay idempotent."""
    units = adapter.system_units(path, body)
    classifier = classifier_for(rules)
    plan = plan_system(units, classifier)
    if not plan.changed:
        return body, plan
    new_body = adapter.with_system(path, body, plan.parts)
    if plan.moved:
        with_text = adapter.with_user_text(path, new_body, plan.moved)
        if with_text is None:
            plan = plan_system(units, classifier, allow_move=False)
            if not plan.changed:
                return body, plan
            return adapter.with_system(path, body, plan.parts), plan
        new_body = canonicalise_body(adapter, path, with_text, caps=caps)[0]
    return new_body, plan


class ReorderStage:
    name: Final = "reorder"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        body = exchange.body
        if body is None:
            return
        caps = capabilities_for(services, exchange.adapter)
        new_body, plan = reorder_body(exchange.adapter, exchange.path, body, rules_for(services), caps)
        exchange.notes["system_tiers"] = plan.tiers
        exchange.notes["system_moved_to_user"] = len(plan.moved)
        count_markers(exchange, services, moved=plan.markers_moved, dropped=plan.markers_dropped)
        if new_body is not body:
            exchange.body = new_body
            exchange.notes["dirty"] = True


STAGE: Final = ReorderStage()
