"""pins: session-context segments sent with their first-seen bytes (rules with `pin: true`).

A system-prompt segment that a rule marks `pin` (a session-context block: `<env>`, a date or a
cwd line; or an API-significant line kept in place, Claude Code's billing header, a pinned
`stable` rule) is sent with the bytes it had when the session first sent it, for as long as its
fields are unchanged; a client that re-renders it with other whitespace or formatting (an
indent, a bullet, a blank line, fields in another order) then keeps the system prompt byte for
byte what the provider cached (docs/provider-rules.md 1.5: a read needs identical content up to the
breakpoint; any changed byte in the system prompt costs a write of everything after it).
When its fields really change:
- by default the new bytes are sent (one system change, one cache write) and become the
  session's pinned bytes from then on;
- with `pin_changes_to_user: true` the first-seen bytes stay in the system prompt and the new
  value (the segment's current text) travels as a leading text block of the newest user
  message (`adapter.with_user_text`, as reorder's `move_to_user`), so the system prompt and
  every earlier message stay byte-identical; later turns replay that message as sent. When no
  message can take the text, the new bytes are sent as in the default.

Pure core `pin_body(adapter, body, rules, pinned)` -> `(body, PinReport)`; `STAGE`
(right after `reorder`, before `replay`; a separate step so it sees the system prompt as it
will be sent: segments sorted, volatile text already moved) adapts it to the `Exchange`.

Contract:
- Segments come from `proxy.pipeline.segments` (the classifier reorder uses) over each system
  unit's text, in order. A pinned segment's key is its rule's name, its label (the
  normalised text before the first `:` of its first line, else empty) and its ordinal among
  segments of that rule and label: the same context block keeps its key while its value
  changes. Its content is the segment without surrounding whitespace; `fields(content)` is
  what counts as a change (whitespace collapsed, list bullets and key case ignored, lines
  in any order).
- `pinned` is the session's mapping key -> first-seen content (`SessionRecord.pins`
  `pinned_segments`, written by the session stage after a 2xx response from
  `PinReport.pinned`). At most `MAX_PINNED_SEGMENTS` keys, each at most `MAX_PIN_CHARS`
  characters (a longer segment is not pinned).
- Text is only ever replaced by text the same session sent before, or moved; nothing else is
  edited. Same input, same output; pinning its own output with the mapping it returned
  changes nothing (idempotent). Copy-on-write: `body` is never mutated.
- Notes: reads `session_pins` (session stage); writes `pinned_segments` (the next mapping),
  `pins_kept` (segments sent with first-seen bytes) and `pins_moved` (new values moved onto
  the user message).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.exchange import Exchange
from proxy.pipeline import delivered as delivered_notes
from proxy.pipeline.segments import BudgetSpent, classifier_for
from proxy.pipeline.support import count_budget_spent, rules_for, scan_budget
from proxy.providers.base import JSONObject, ProviderAdapter, SystemPart
from proxy.rules import Budget, Rule, RuleSet, pinned_rules
from proxy.services import Services

PINS_KEY: Final = "pinned_segments"
"""Key of the mapping inside `SessionRecord.pins`."""
MAX_PINNED_SEGMENTS: Final = 64
MAX_PIN_CHARS: Final = 8192
_BULLETS: Final = frozenset({"-", "*", "+", "\u2022"})


def fields(content: str) -> tuple[str, ...]:
    """What a change of `content` means: its non-blank lines with whitespace collapsed and a
    leading list bullet removed, `key: value` lines with the key lower-cased and the spaces
    around `:` dropped, sorted (line order is formatting). Values keep their case (paths)."""
    out = []
    for line in content.splitlines():
        words = line.split()
        if words and words[0] in _BULLETS:
            words = words[1:]
        if not words:
            continue
        text = " ".join(words)
        key, colon, value = text.partition(":")
        out.append(f"{key.strip().lower()}:{value.strip()}" if colon else text)
    return tuple(sorted(out))


def _label(content: str) -> str:
    first = content.split("\n", 1)[0]
    key, colon, _ = first.partition(":")
    return " ".join(key.split()).lower().lstrip("-*+\u2022 ") if colon else ""


def _split(text: str) -> tuple[str, str, str]:
    """`(leading whitespace, content, trailing whitespace)` of a segment's text."""
    core = text.strip()
    start = len(text) - len(text.lstrip())
    return text[:start], core, text[start + len(core) :]


@dataclass(slots=True)
class PinReport:
    pinned: dict[str, str] = field(default_factory=dict)
    """The session's mapping after this request (key -> first-seen content)."""
    kept: int = 0
    """Segments whose text was replaced by the first-seen bytes (same fields)."""
    moved: int = 0
    """Changed segments whose new value went onto the newest user message."""
    changed: int = 0
    """Changed segments sent with their new bytes."""
    delivered: list[tuple[str, str]] = field(default_factory=list)
    """`(slot, value)` of the moved values (`proxy.pipeline.delivered`)."""
    repeated: int = 0
    """Changed segments whose value the session last delivered and still holds: not moved again."""


_PINNED: dict[int, tuple[RuleSet, dict[str, Rule]]] = {}


def _pinned_rules(rules: RuleSet) -> dict[str, Rule]:
    entry = _PINNED.get(id(rules))
    if entry is None or entry[0] is not rules:
        if len(_PINNED) > 32:
            _PINNED.clear()
        entry = _PINNED[id(rules)] = (rules, pinned_rules(rules))
    return entry[1]


def pin_body(
    adapter: ProviderAdapter,
    body: JSONObject,
    rules: RuleSet,
    pinned: Mapping[str, str] | None = None,
    delivered: Mapping[str, str] | None = None,
    budget: Budget | None = None,
) -> tuple[JSONObject, PinReport]:
    """`body` with its pinned segments as first seen (module docstring), and the report (pure).
    Raises `BudgetSpent` when `budget` (`Classifier.segments`) runs out.

    `delivered` (slot -> value, the session's moved notes still in its history:
    `proxy.pipeline.delivered`; a pin's slot is `pin` + its key) keeps a changed value of a
    `pin_changes_to_user` rule off the user message while it equals the one delivered."""
    by_name = _pinned_rules(rules)
    report = PinReport(dict(pinned or {}))
    if not by_name:
        return body, report
    units = adapter.system_units(body)
    classifier = classifier_for(rules)
    seen: dict[tuple[str, str], int] = {}
    parts: list[SystemPart] = []
    moving: list[tuple[str, str]] = []
    """(key, current content) of changed segments whose rule moves the change."""
    edited = False
    for source, unit in enumerate(units):
        if unit.text is None or not by_name.keys() & {s.rule for s in classifier.segments(unit.text, budget)}:
            parts.append(SystemPart(source, unit.text or "", unit.marker, whole=True))
            continue
        texts = []
        for segment in classifier.segments(unit.text):
            rule = by_name.get(segment.rule) if segment.rule is not None and not segment.wrap else None
            lead, content, trail = _split(segment.text)
            if rule is None or not content or len(content) > MAX_PIN_CHARS:
                texts.append(segment.text)
                continue
            label = _label(content)
            ordinal = seen.get((rule.name, label), 0)
            seen[(rule.name, label)] = ordinal + 1
            key = f"{rule.name}\x1f{label}\x1f{ordinal}"
            first = report.pinned.get(key)
            if not isinstance(first, str) or first != first.strip():  # unknown, or not ours
                first = None
            if first is None:
                if key in report.pinned or len(report.pinned) < MAX_PINNED_SEGMENTS:
                    report.pinned[key] = content
                texts.append(segment.text)
            elif first == content:
                texts.append(segment.text)
            elif fields(first) == fields(content):
                texts.append(lead + first + trail)
                report.kept += 1
            elif rule.pin_changes_to_user:
                texts.append(lead + first + trail)
                if delivered and delivered.get(f"pin\x1f{key}") == content:
                    report.repeated += 1
                else:
                    moving.append((key, content))
            else:
                report.pinned[key] = content
                report.changed += 1
                texts.append(segment.text)
        text = "".join(texts)
        is_whole = text == unit.text
        edited = edited or not is_whole
        parts.append(SystemPart(source, text, unit.marker, whole=is_whole))
    if not edited:
        return body, report
    new_body = adapter.with_system(body, parts)
    if moving:
        with_text = adapter.with_user_text(new_body, [content for _, content in moving])
        if with_text is None:  # nothing can take it: send the new bytes after all
            return _without_moves(adapter, body, rules, pinned, moving, delivered)
        new_body = with_text
        report.moved = len(moving)
        report.delivered = [(f"pin\x1f{key}", content) for key, content in moving]
    return new_body, report


def _without_moves(
    adapter: ProviderAdapter,
    body: JSONObject,
    rules: RuleSet,
    pinned: Mapping[str, str] | None,
    moving: list[tuple[str, str]],
    delivered: Mapping[str, str] | None = None,
) -> tuple[JSONObject, PinReport]:
    """`pin_body` where the changed segments that could not move count as changed: their new
    content becomes the pinned one, so they are sent as the client sent them."""
    updated = {**(pinned or {}), **dict(moving)}
    new_body, report = pin_body(adapter, body, rules, updated, delivered)
    report.changed += len(moving)
    return new_body, report


class PinStage:
    name: Final = "pin"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        body = exchange.body
        if body is None or exchange.session_id is None:
            return
        pins = exchange.session_pins
        stored = pins.get(PINS_KEY) if isinstance(pins, Mapping) else None
        pinned: Any = stored if isinstance(stored, Mapping) else None
        carried = delivered_notes.texts_of(delivered_notes.carried_notes(exchange))
        try:
            budget = scan_budget(exchange, services)
            new_body, report = pin_body(
                exchange.adapter, body, rules_for(services), pinned, carried, budget
            )
        except BudgetSpent:  # the system prompt goes as sent; the pins are kept for later turns
            count_budget_spent(services, self.name)
            new_body, report = body, PinReport(dict(pinned or {}))
        if report.delivered:
            delivered_notes.record_delivery(exchange, report.delivered, delivered_notes.last_position(exchange))
        exchange.pinned_segments = report.pinned
        exchange.pins_kept = report.kept
        exchange.pins_moved = report.moved
        if new_body is not body:
            exchange.replace_body(new_body)


STAGE: Final = PinStage()
