"""reorder: durable-first system prompt.

Pure core `reorder_body(adapter, body, rules)`; `STAGE` adapts it to the `Exchange`.

Contract:
- The system prompt (`adapter.system_units`: Anthropic `system` blocks or string; OpenAI head
  system/developer message parts and Responses `instructions`) is split into segments by the
  rules (`proxy.pipeline.segments`) and stable-sorted by tier: stable, session, volatile.
  Unclassified text is stable and keeps its order.
- A unit is split only where its segments classify differently: its segments of one tier are
  joined (in order) into one block, so a unit gives at most three blocks. A marker on a split
  unit moves to its stable part (else its session part, else its volatile part). A unit that
  cannot be split (`splittable` False) is sorted inside its own text and stays one block.
- Segments of a `move_to_user` rule (the packaged volatile rules: rules/default.yaml) leave the
  system prompt and become leading text blocks of the newest user message
  (`adapter.with_user_text`; one block per unit they come from; after a user message's
  `tool_result` blocks; on OpenAI, the newest tool output when a tool turn is last), so the
  whole system prompt becomes byte-stable. Replay then sends that message with the same bytes
  on later turns (its sidecar holds them). Nothing moves when no message can take the text;
  the segments then sort last in the system prompt as volatile ones. A marker on a unit that
  leaves entirely is dropped, and so is a system-section message (OpenAI head messages, a
  Responses developer item) all of whose text leaves: notes in Responses `instructions` and
  in developer items move behind the history as system notes do on Messages, and the plan
  counts the dropped messages (`dropped_messages`, `Exchange.head_dropped`) so replay and the
  session record line the sent array up with the client's.
- Headings carry their sections (`proxy.pipeline.segments`): `## Todo (updated <time>)` and
  its checklist are one volatile segment, so the checklist never stays in the stable tier.
- Tag-wrapped sections (`proxy.pipeline.segments`: a `<tag>` line ... `</tag>` line with
  classified lines inside) stay together in the system prompt: the section sorts as one piece,
  with the latest tier among its lines that stay. Lines moving to the user message leave it
  and carry its tags, which also stay around what remains, so no tag pair is ever left
  wrapping nothing: Codex's `<environment_context>` keeps its `<cwd>` in the system prompt and
  its `<current_time>` arrives on the user message inside `<environment_context>` tags too.
- A part holding a segment of a pinned `stable` rule (an API-significant line: Claude Code's
  billing header) keeps its place like any stable text, but its tier is reported as `session`: its
  value differs between conversations, so the prefix sessions share (the planner's "stable
  system" end) ends before it, at the end of the tools when it comes first.
- Input: a canonical body (canonicalise ran before), so `tiers` line up with the output.
- Text is never edited: every line is kept and only moved, exactly once, except a wrapper's
  tag lines, written once per place its content went. Same input, same output; reordering its
  own output changes nothing (idempotent).
- Bounded work (issue 11): lines not classified before cost the request's scan budget
  (`Exchange.scan_budget`, `reorder_budget_chars`); when it runs out the system prompt is
  forwarded as sent, unclassified (`as_sent`), and counted
  (`promptcache_rules_budget_exceeded_total{stage="reorder"}`).
- Written on the `Exchange`: `system_tiers` (tuple of tier names, one per system block of the output, in
  prefix order: the planner's "stable system" and "session system" ends),
  `system_moved_to_user` (number of text blocks moved onto the user message), `head_dropped`
  (system-section messages that left the array).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from proxy.exchange import Exchange
from proxy.pipeline import delivered
from proxy.pipeline.canonicalise import canonicalise_body
from proxy.pipeline.layout import LayoutCache
from proxy.pipeline.segments import TIER_RANK, BudgetSpent, Classifier, classifier_for, render, section_tiers
from proxy.pipeline.support import (
    NO_CAPABILITY_LIMITS,
    count_budget_spent,
    count_markers,
    layout_cache,
    request_capabilities,
    rules_for,
    scan_budget,
)
from proxy.providers.base import JSONObject, ProviderAdapter, SystemPart, SystemUnit
from proxy.rules import Budget, RuleSet
from proxy.services import Services
from proxy.settings import UpstreamCapabilities

_MOVED: Final = "moved"
"""The group of segments leaving for the user message (`render` group key)."""
_AS_IS: Final = {tier: tier for tier in TIER_RANK}
_IN_PLACE: Final = {**_AS_IS, "stable": "session"}
"""Tier reported for a part holding a pinned `stable` segment (module docstring)."""


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
    emptied: bool = False
    """True when some unit left the system prompt entirely."""
    slots: tuple[str, ...] = ()
    """The slot of each `moved` text (`proxy.pipeline.delivered`): `move`, the names of the
    rules of its segments, and its ordinal among texts of those rules."""
    repeated: int = 0
    """Moved texts left out: equal to what the session last delivered (`delivered` argument)."""
    dropped_messages: int = 0
    """Leading system/developer messages of the message array that left entirely (OpenAI head
    messages whose every segment moved onto the newest user message)."""
    is_budget_spent: bool = False
    """The scan budget ran out: the system prompt is as sent (`as_sent`)."""


NO_SYSTEM: Final = SystemPlan(parts=(), tiers=(), moved=(), changed=False)
"""The plan of a request without a system prompt (nothing to split, classify or move)."""


def as_sent(units: Sequence[SystemUnit]) -> SystemPlan:
    """The plan that keeps every unit as sent, unclassified (stable): the scan budget ran out."""
    parts = tuple(SystemPart(i, unit.text or "", unit.marker, whole=True) for i, unit in enumerate(units))
    return SystemPlan(parts=parts, tiers=("stable",) * len(parts), moved=(), changed=False, is_budget_spent=True)


def _worst(tiers: Sequence[str]) -> str:
    return max(tiers, key=TIER_RANK.__getitem__)


def _text_tier(classifier: Classifier, text: str, budget: Budget | None = None) -> str:
    """The tier of a unit kept as one block: the latest tier its own text classifies as. The
    sorted text is classified again, not its pieces: a section can take in a line sorted after
    it (`# Memory` runs on over the volatile line behind it), and the next pass must see the
    tier this one gave (idempotence)."""
    segments = classifier.segments(text, budget)
    tiers = section_tiers(segments, [False] * len(segments))
    return _worst([t for t, s in zip(tiers, segments, strict=True) if not s.wrap] or ["stable"])


def _join_lines(pieces: Sequence[str]) -> str | None:
    """Concatenate reordered pieces of one string without joining two lines.

    When the only piece without a final newline is not last (the text's unterminated last line
    moved up), that newline moves with the order: every piece loses one final `\n` and the
    pieces are joined with `\n`, so the same lines and the same characters come out, the last
    line still unterminated. `None` when more than one piece is unterminated, or when the last
    piece ends in a blank line (losing one `\n` would leave it terminated: a line lost).
    """
    open_ended = [i for i, p in enumerate(pieces) if not p.endswith("\n")]
    if not open_ended or open_ended == [len(pieces) - 1]:
        return "".join(pieces)
    if len(open_ended) > 1 or pieces[-1].endswith("\n\n"):
        return None  # two open ends, or a last piece ending in a blank line (it would end terminated)
    return "\n".join(p[:-1] if p.endswith("\n") else p for p in pieces)


_SLOT_SEP: Final = "\x1f"


def _slot(names: str, seen: dict[str, int]) -> str:
    """The slot (`SystemPlan.slots`) of the next moved text of the rules `names` (joined with
    `+`): `move`, the names and its ordinal among the texts of those names so far (`seen`,
    updated)."""
    ordinal = seen[names] = seen.get(names, -1) + 1
    return f"move{_SLOT_SEP}{names}{_SLOT_SEP}{ordinal}"


def plan_system(
    units: Sequence[SystemUnit], classifier: Classifier, allow_move: bool = True, budget: Budget | None = None
) -> SystemPlan:
    """Split, classify and stable-sort `units` (pure). Raises `BudgetSpent` when `budget`
    (characters of new lines to classify, `Classifier.segments`) runs out."""
    if not units:
        return NO_SYSTEM  # the value the loop below gives for no units, without building it
    ranked: list[tuple[int, str, SystemPart]] = []
    moved: list[str] = []
    slots: list[str] = []
    seen: dict[str, int] = {}
    changed = emptied = False
    markers_moved = markers_dropped = 0
    in_place = classifier.pinned_in_place
    for source, unit in enumerate(units):
        if unit.text is None:
            ranked.append((0, "stable", SystemPart(source, "", unit.marker, whole=True)))
            continue
        segments = classifier.segments(unit.text, budget)
        leaving = [allow_move and s.move_to_user for s in segments]
        tiers_of = section_tiers(segments, leaving)
        groups = [_MOVED if out else tier for out, tier in zip(leaving, tiers_of, strict=True)]
        kinds = {g for g, s in zip(groups, segments, strict=True) if not s.wrap}
        # a pinned stable line keeps its place (rank), but the sessions' shared prefix ends before it
        shown = _IN_PLACE if in_place and any(
            g == "stable" and s.rule in in_place for g, s in zip(groups, segments, strict=True)
        ) else _AS_IS
        if len(kinds) == 1 and _MOVED not in kinds:
            tier = kinds.pop()
            ranked.append((TIER_RANK[tier], shown[tier], SystemPart(source, unit.text, unit.marker, whole=True)))
            continue
        texts = render(segments, groups)
        away = texts.pop(_MOVED, "")
        if away:
            moved.append(away)
            names = "+".join(dict.fromkeys(s.rule or "" for s, out in zip(segments, leaving, strict=True) if out))
            slots.append(_slot(names, seen))
            changed = True
        if not texts:
            markers_dropped += unit.marker is not None
            emptied = True
            continue
        tiers = sorted(texts, key=TIER_RANK.__getitem__)
        if not unit.splittable:
            pieces = [texts[t] for t in tiers]
            text = _join_lines(pieces)
            if text is None:  # more than one unterminated piece: keep the order
                text = render(segments, ["" if g != _MOVED else g for g in groups])[""]
            tier = _text_tier(classifier, text, budget)
            is_whole = text == unit.text
            changed = changed or not is_whole
            ranked.append((TIER_RANK[tier], shown[tier], SystemPart(source, text, unit.marker, whole=is_whole)))
            continue
        changed = True
        marker = unit.marker
        markers_moved += marker is not None
        for tier in tiers:
            ranked.append((TIER_RANK[tier], shown[tier], SystemPart(source, texts[tier], marker)))
            marker = None
    ordered = sorted(ranked, key=lambda item: item[0])
    if any(a is not b for a, b in zip(ordered, ranked, strict=True)):
        changed = True
    return SystemPlan(
        parts=tuple(part for _, _, part in ordered),
        tiers=tuple(tier for _, tier, _ in ordered),
        moved=tuple(moved),
        slots=tuple(slots),
        changed=changed,
        markers_moved=markers_moved,
        markers_dropped=markers_dropped,
        emptied=emptied,
    )


def reorder_body(
    adapter: ProviderAdapter,
    body: JSONObject,
    rules: RuleSet,
    caps: UpstreamCapabilities = NO_CAPABILITY_LIMITS,
    cache: LayoutCache | None = None,
    delivered: Mapping[str, str] | None = None,
    budget: Budget | None = None,
) -> tuple[JSONObject, SystemPlan]:
    """`body` with its system prompt in durable-first order (pure; `body` is not mutated).

    With a `budget` (`reorder_budget_chars`) that runs out before every line is classified,
    `body` is returned as sent with `as_sent(units)` (`plan.is_budget_spent`).

    `delivered` (slot -> text: the session's notes still in its history,
    `proxy.pipeline.delivered`) leaves out a moved text equal to the one of its slot: it leaves
    the system prompt as always but is not put on the user message again (`plan.moved` holds
    what was put there, `plan.repeated` counts what was left out).

    Text moved onto the user message can make an empty text block there removable, so the
    result is canonicalised again (`caps` as for canonicalise) to stay idempotent. When no
    message can take the moved text, nothing moves. A system-section message (an OpenAI
    leading system / developer message, a Responses developer item) whose every segment moves
    leaves the array: the plan's `dropped_messages` counts them, and replay and the session
    record align the sent array with the client's by it (`replay.aligned_items`). `cache`
    shares layout and scan results with the other stages of the request."""
    units = adapter.system_units(body)
    classifier = classifier_for(rules)
    try:
        plan = plan_system(units, classifier, budget=budget)
    except BudgetSpent:
        return body, as_sent(units)
    if not plan.changed:
        return body, plan
    settled = _settle(adapter, body, plan, classifier, True, budget)
    if settled is None:
        return body, replace(as_sent(units), is_budget_spent=False)
    new_body, plan = settled
    if not plan.moved:
        return new_body, plan
    with_text = adapter.with_user_text(new_body, plan.moved)
    if with_text is not None and delivered:
        pairs = zip(plan.slots, plan.moved, strict=True)
        fresh = [(slot, text) for slot, text in pairs if delivered.get(slot) != text]
        if len(fresh) < len(plan.moved):
            texts = tuple(text for _, text in fresh)
            slots = tuple(slot for slot, _ in fresh)
            plan = replace(plan, moved=texts, slots=slots, repeated=len(plan.moved) - len(fresh))
            with_text = adapter.with_user_text(new_body, texts) if texts else new_body
    cache = cache if cache is not None else LayoutCache()
    if with_text is None:
        staying = plan_system(units, classifier, allow_move=False)  # classified above: no budget
        if not staying.changed:
            return body, staying
        kept = _settle(adapter, body, staying, classifier, False, None)
        return kept if kept is not None else (body, replace(as_sent(units), is_budget_spent=False))
    out = canonicalise_body(adapter, with_text, caps=caps, cache=cache)[0]
    # a system prompt outside the message array cannot take a message with it: nothing to count
    if plan.emptied and cache.system_messages(adapter, body):
        dropped = cache.message_count(adapter, body) - cache.message_count(adapter, out)
        if dropped > 0:
            plan = replace(plan, dropped_messages=dropped)
    return out, plan


SETTLE_PASSES: Final = 3
"""Passes `_settle` makes over a reordered system prompt before giving up on it."""


def _settle(
    adapter: ProviderAdapter,
    body: JSONObject,
    plan: SystemPlan,
    classifier: Classifier,
    allow_move: bool,
    budget: Budget | None,
) -> tuple[JSONObject, SystemPlan] | None:
    """`body` with `plan`'s system prompt, planned again until a pass changes nothing, and the
    plans merged (`_merged`): `(new body, plan)`, or `None` when `SETTLE_PASSES` passes still
    change it (the caller then sends the system prompt as it came). A sorted prompt can
    segment differently from the one it came from: a heading section runs on over a line that
    sorting put behind it, or stops at a tag line that sorting moved (the attack pass found
    674 such outcomes in 120,000 generated prompts); without this the next request's pass
    would change it again, so reordering was not idempotent. A pass the scan budget cannot pay
    for ends the settling with what is planned so far."""
    new_body = adapter.with_system(body, plan.parts)
    for _ in range(SETTLE_PASSES):
        try:
            again = plan_system(adapter.system_units(new_body), classifier, allow_move, budget)
        except BudgetSpent:
            return new_body, plan
        if not again.changed:
            return new_body, plan
        new_body = adapter.with_system(new_body, again.parts)
        plan = _merged(plan, again)
    return None


def _merged(first: SystemPlan, then: SystemPlan) -> SystemPlan:
    """`first` followed by `then` (planned over `first`'s output): `then`'s parts and tiers,
    both passes' moved texts in order, their slots numbered again (a slot's ordinal counts the
    texts of its rules over both passes) and their marker counts added."""
    slots: list[str] = []
    seen: dict[str, int] = {}
    for slot in (*first.slots, *then.slots):
        slots.append(_slot(slot.split(_SLOT_SEP)[1], seen))
    return replace(
        then,
        moved=first.moved + then.moved,
        slots=tuple(slots),
        changed=True,
        markers_moved=first.markers_moved + then.markers_moved,
        markers_dropped=first.markers_dropped + then.markers_dropped,
        emptied=first.emptied or then.emptied,
    )


class ReorderStage:
    name: Final = "reorder"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        body = exchange.body
        if body is None:
            return
        caps = request_capabilities(services, exchange)
        cache = layout_cache(exchange)
        carried = delivered.texts_of(delivered.carried_notes(exchange)) if exchange.session_id else None
        budget = scan_budget(exchange, services)
        new_body, plan = reorder_body(
            exchange.adapter, body, rules_for(services), caps, cache, carried, budget
        )
        if plan.is_budget_spent:
            count_budget_spent(services, self.name)
        exchange.system_tiers = plan.tiers
        exchange.system_moved_to_user = len(plan.moved)
        if exchange.session_id is not None:
            fresh = list(zip(plan.slots, plan.moved, strict=True))
            delivered.record_delivery(exchange, fresh, delivered.last_position(exchange))
        exchange.head_dropped = plan.dropped_messages
        count_markers(exchange, services, moved=plan.markers_moved, dropped=plan.markers_dropped)
        if new_body is not body:
            exchange.replace_body(new_body)


STAGE: Final = ReorderStage()
