"""Segments: split system-prompt text into stable / session / volatile pieces by rule.

Contract:
- `classifier_for(rules).segments(text)` returns `Segment`s whose texts, joined in order, are
  exactly `text`. Deterministic: the same text and rules give the same segments.
- Rules only ever look at single lines (a pattern is `re.search`ed in a line without its
  `\\n`), so each distinct line is matched once and remembered (bounded cache): a prompt that
  differs from an earlier one in one line (a timestamp) costs one line of matching.
- Structure, by precedence (rules/README.md):
  1. `block`: tests the first non-blank line; a match makes the whole text one segment;
  2. `section`: starts at a matching line and runs to the first later line matching `end`
     (included), to just before the first later line matching `until`, or else to the next
     blank line; a section is one segment;
  3. the remaining text splits into paragraphs at blank lines (and before section starts):
     a `paragraph` rule matching any of its lines makes the paragraph one segment;
  4. otherwise each line matching a `line` rule is a segment of its own, and the runs of
     lines between them are unclassified segments. A `block` rule's line that is not the
     text's first counts as a `line` rule here (so a sorted group of segments that starts with
     it classifies the same way again: reordering stays idempotent).
  Within one kind the first rule in file order wins. Unclassified text is `stable`.
- Blank lines never form a segment: leading blank lines join the first segment, others the
  segment before them. So no segment is whitespace-only unless the whole text is.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Final

from proxy.rules import Rule, RuleSet

TIER_RANK: Final = {"stable": 0, "session": 1, "volatile": 2}
_LINE_CACHE_LIMIT: Final = 16384
_TEXT_CACHE_LIMIT: Final = 256


@dataclass(frozen=True, slots=True)
class Segment:
    text: str
    tier: str = "stable"
    rule: str | None = None
    """Name of the rule that classified the segment; `None` = unclassified (stable)."""
    move_to_user: bool = False


class Classifier:
    """Segments text by one `RuleSet`; keeps bounded caches of line matches and results."""

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self._tests = []
        self._start: list[tuple[int, Rule]] = []
        self._stop: dict[str, int] = {}
        for rule in rules.rules:
            self._start.append((1 << len(self._tests), rule))
            self._tests.append(rule.pattern)
            stop = rule.end or rule.until
            if stop is not None:
                self._stop[rule.name] = 1 << len(self._tests)
                self._tests.append(stop)
        self._by_kind = {
            kind: [(bit, r) for bit, r in self._start if r.kind == kind]
            for kind in ("block", "section", "paragraph", "line")
        }
        self._by_kind["line"] = [(bit, r) for bit, r in self._start if r.kind in ("line", "block")]
        self._section_mask = sum(bit for bit, _ in self._by_kind["section"])
        self._paragraph_mask = sum(bit for bit, _ in self._by_kind["paragraph"])
        self._line_mask = sum(bit for bit, _ in self._by_kind["line"])
        self._lines: dict[str, int] = {}
        self._texts: dict[str, tuple[Segment, ...]] = {}

    def _mask(self, line: str) -> int:
        mask = self._lines.get(line)
        if mask is None:
            mask = 0
            for bit, pattern in enumerate(self._tests):
                if pattern.search(line) is not None:
                    mask |= 1 << bit
            if len(self._lines) >= _LINE_CACHE_LIMIT:
                self._lines.clear()
            self._lines[line] = mask
        return mask

    def segments(self, text: str) -> tuple[Segment, ...]:
        cached = self._texts.get(text)
        if cached is None:
            cached = self._segments(text)
            if len(self._texts) >= _TEXT_CACHE_LIMIT:
                self._texts.clear()
            self._texts[text] = cached
        return cached

    def _segments(self, text: str) -> tuple[Segment, ...]:
        lines = text.split("\n")
        if not lines[-1]:
            lines.pop()
        blank = [not line or line.isspace() for line in lines]
        if all(blank):
            return (Segment(text),)
        known = self._lines.get
        masks = [0 if is_blank else known(line, -1) for is_blank, line in zip(blank, lines, strict=True)]
        if -1 in masks:
            masks = [self._mask(line) if mask < 0 else mask for mask, line in zip(masks, lines, strict=True)]
        first = blank.index(False)
        for bit, rule in self._by_kind["block"]:
            if masks[first] & bit:
                return (Segment(text, rule.tier, rule.name, rule.move_to_user),)
        spans = self._spans(masks, blank)
        if len(spans) == 1 and spans[0][2] is None:
            return (Segment(text),)
        offsets = list(accumulate([len(line) + 1 for line in lines], initial=0))
        out = []
        for k, (begin, _, rule) in enumerate(spans):
            start = 0 if k == 0 else offsets[begin]
            end = offsets[spans[k + 1][0]] if k + 1 < len(spans) else len(text)
            chunk = text[start:end]
            if rule is None:
                out.append(Segment(chunk))
            else:
                out.append(Segment(chunk, rule.tier, rule.name, rule.move_to_user))
        return tuple(out)

    def _spans(self, masks: list[int], blank: list[bool]) -> list[list]:
        """`[start, end, rule]` spans covering every non-blank line, in order."""
        spans: list[list] = []
        n = len(masks)
        section_mask, paragraph_mask, line_mask = self._section_mask, self._paragraph_mask, self._line_mask
        i = 0
        while i < n:
            if blank[i]:
                i += 1
                continue
            if masks[i] & section_mask:
                section = _first(self._by_kind["section"], masks[i])
                j = self._section_end(section, masks, blank, i)
                spans.append([i, j, section])
                i = j
                continue
            p = i + 1
            joined = masks[i]
            while p < n and not blank[p] and not masks[p] & section_mask:
                joined |= masks[p]
                p += 1
            if joined & paragraph_mask:
                spans.append([i, p, _first(self._by_kind["paragraph"], joined)])
            elif joined & line_mask:
                run_start = i
                for q in range(i, p):
                    if masks[q] & line_mask:
                        if run_start < q:
                            spans.append([run_start, q, None])
                        spans.append([q, q + 1, _first(self._by_kind["line"], masks[q])])
                        run_start = q + 1
                if run_start < p:
                    spans.append([run_start, p, None])
            elif spans and spans[-1][2] is None:
                spans[-1][1] = p
            else:
                spans.append([i, p, None])
            i = p
        return spans

    def _section_end(self, rule: Rule, masks: list[int], blank: list[bool], i: int) -> int:
        n = len(masks)
        stop = self._stop.get(rule.name)
        for k in range(i + 1, n):
            if stop is None:
                if blank[k]:
                    return k
            elif masks[k] & stop:
                return k + 1 if rule.end is not None else k
        return n


def _first(candidates: list[tuple[int, Rule]], mask: int) -> Rule | None:
    for bit, rule in candidates:
        if mask & bit:
            return rule
    return None


_CLASSIFIERS: dict[int, tuple[RuleSet, Classifier]] = {}


def classifier_for(rules: RuleSet) -> Classifier:
    """The (cached) classifier of `rules`; one per live `RuleSet`."""
    entry = _CLASSIFIERS.get(id(rules))
    if entry is None or entry[0] is not rules:
        if len(_CLASSIFIERS) > 32:
            _CLASSIFIERS.clear()
        entry = _CLASSIFIERS[id(rules)] = (rules, Classifier(rules))
    return entry[1]
