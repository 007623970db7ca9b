"""Segments: split system-prompt text into stable / session / volatile pieces by rule.

Contract:
- `classifier_for(rules).segments(text)` returns `Segment`s whose texts, joined in order, are
  exactly `text`. Deterministic: the same text and rules give the same segments.
- Rules only ever look at single lines (a pattern is `re.search`ed in a line without its
  `\\n`), so each distinct line is matched once and remembered (bounded cache): a prompt that
  differs from an earlier one in one line (a timestamp) costs one line of matching. A pattern
  that cannot tell digits apart (`_digit_blind`: the packaged rules) is matched once per line
  with its digits zeroed, so a timestamp line seen with other digits costs no matching. Split
  positions are remembered per line shape (`Classifier`), results per text.
- Structure, by precedence (rules/README.md):
  1. `block`: tests the first non-blank line; a match makes the whole text one segment;
  1b. a markdown heading line (`#` to `######`, a space, text) that any rule matches starts a
     *heading section*: the heading and its body up to the next heading
     of the same or higher level (fewer or as many `#`), to before a closing tag whose opening
     tag comes before the heading, or to the end of the text, are one segment (a section
     rule's own `end` / `until` ends it earlier). It takes the most volatile tier among the
     rules its heading line matches (ties: section, paragraph, line/block, then file order),
     so `## Todo (updated 2026-12-01T09:30Z)` carries its whole checklist along, and
     `## Memory` stays one session segment. Its body is not classified line by line. An
     unclassified heading is ordinary text (its body's lines are classified as below). Code
     fences are not tracked: whether a line is a heading depends on that line alone, so a
     sorted group of segments (a fence opened in one tier, closed in another) classifies the
     same way again (reordering stays idempotent);
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
- Tag wrappers: a line that is only an opening tag (`<environment_context>`, `<ctx a="1">`)
  and a later line that is only its closing tag (`</environment_context>`), properly nested,
  with unclassified tag lines and at least one classified line between them, form a wrapper.
  Each of its two tag lines is a segment of its own (`wrap` 1 / -1) with no tier: `render`
  writes a wrapper around its content in every group that takes some of that content, and
  nowhere else, so a wrapped section split across groups never leaves a tag pair wrapping
  nothing, and a line taken out keeps the tags that say what it is (`<current_time>` stays
  inside `<environment_context>`). `section_tiers` keeps a wrapped section together when it
  sorts (one tier for all of it), so only lines leaving for the user message split it. Tag
  lines are the only text that can be repeated; every other line appears exactly once.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final, TypeVar, cast

from proxy.rules import LINE_SCAN_COST, MAX_RULE_LINE_CHARS, Budget, Rule, RuleSet, is_value_token

TIER_RANK: Final = {"stable": 0, "session": 1, "volatile": 2}
_LINE_CACHE_LIMIT: Final = 16384
_LINE_CACHE_CHARS: Final = 4 * 1024 * 1024
"""Characters of the lines the line cache may hold (16,384 lines of 16 KiB would be 256 MiB)."""
_TEXT_CACHE_LIMIT: Final = 256
_TEXT_CACHE_CHARS: Final = 8 * 1024 * 1024
"""Characters of the texts whose segments are remembered."""


class BudgetSpent(Exception):
    """The request's classification budget (`Budget`) ran out before this text was
    classified: the caller leaves the text as sent (and counts it)."""
_OPEN_TAG: Final = re.compile(r"\s*<([A-Za-z_][\w.:-]*)(?:\s[^<>]*)?>\s*")
_CLOSE_TAG: Final = re.compile(r"\s*</([A-Za-z_][\w.:-]*)\s*>\s*")
_HEADING: Final = re.compile(r" {0,3}(#{1,6})[ \t]+\S")
_WRAP_OPEN: Final = "open"
_WRAP_CLOSE: Final = "close"
_ABSENT: Any = object()
G = TypeVar("G", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Segment:
    text: str
    tier: str = "stable"
    rule: str | None = None
    """Name of the rule that classified the segment; `None` = unclassified (stable)."""
    move_to_user: bool = False
    wrap: int = 0
    """1: the opening tag line of a wrapper, -1: its closing tag line, 0: content (module
    docstring). A wrapper line has no tier of its own (`tier` is `stable`, ignored)."""


def render(segments: Sequence[Segment], groups: Sequence[G]) -> dict[G, str]:
    """The text of each group (`groups[i]` is segment `i`'s; ignored for wrapper lines), in
    segment order, each wrapper written around its content in every group that takes some of
    it (outer tags first); groups in order of first appearance. One group for every content
    segment gives back the segmented text exactly."""
    out: dict[G, list[str]] = {}
    stack: list[tuple[str, list[G]]] = []
    for segment, group in zip(segments, groups, strict=True):
        if segment.wrap > 0:
            stack.append((segment.text, []))
            continue
        if segment.wrap < 0:
            _, taken = stack.pop()
            for k, name in enumerate(taken):
                out[name].append(segment.text if k == 0 else _tag_line(segment.text))
            continue
        parts = out.setdefault(group, [])
        for opening, taken in stack:
            if group not in taken:
                parts.append(opening if not taken else _tag_line(opening))
                taken.append(group)
        parts.append(segment.text)
    return {group: "".join(parts) for group, parts in out.items()}


def _tag_line(text: str) -> str:
    """A wrapper segment's tag line without the blank lines that follow it: the copies of a
    wrapper in later groups repeat the tag, while its blank lines stay once, with the first group."""
    head, newline, _ = text.partition("\n")
    return head + newline


def section_tiers(segments: Sequence[Segment], leaving: Sequence[bool]) -> list[str]:
    """The tier each segment sorts with: a content segment inside a wrapper takes the latest
    tier among the content of its outermost wrapper that is not `leaving` (a wrapped section
    sorts as one piece); any other segment its own tier."""
    out = [s.tier for s in segments]
    depth = start = 0
    for i, segment in enumerate(segments):
        if segment.wrap > 0:
            depth += 1
            start = i if depth == 1 else start
        elif segment.wrap < 0:
            depth -= 1
            if depth == 0:
                inside = [k for k in range(start + 1, i) if not segments[k].wrap and not leaving[k]]
                if inside:
                    tier = max((segments[k].tier for k in inside), key=TIER_RANK.__getitem__)
                    for k in inside:
                        out[k] = tier
    return out


_LineInfo = tuple[int, bool, str | None, str | None, int]
"""What the rules, the wrapper pairing and the heading sections see of one line: `(rule mask,
blank, opening tag name, closing tag name, heading)`; heading: the level (1-6) of a markdown
heading line, else 0."""
_BLANK: Final[_LineInfo] = (0, True, None, None, 0)


_ZERO_DIGITS: Final = str.maketrans("123456789", "000000000")
_DIGITS: Final = frozenset(range(ord("0"), ord("9") + 1))


def _digit_blind(pattern: re.Pattern[str]) -> bool:
    """True when `pattern` cannot tell one ASCII digit from another: no digit literal, every
    character class holds all of 0-9 or none, no backreference. Then a line and the same line
    with every digit made `0` match alike (digits keep their positions and classes), so a
    timestamp line that changes on every request is matched once. False when unsure."""
    try:  # the stdlib's own regex parser (private: any surprise means no shortcut)
        import re._constants as sre
        import re._parser as sre_parse

        return _blind(sre_parse.parse(pattern.pattern, pattern.flags), sre, sre_parse.SubPattern)
    except Exception:  # noqa: BLE001
        return False


def _blind(node: Any, sre: Any, subpattern: Any) -> bool:
    if isinstance(node, tuple) and len(node) == 2 and isinstance(node[0], sre._NamedIntConstant):
        op, arg = node
        if op in (sre.LITERAL, sre.NOT_LITERAL):
            return arg not in _DIGITS
        if op == sre.RANGE:
            low, high = arg
            return bool(high < ord("0") or low > ord("9") or (low <= ord("0") and high >= ord("9")))
        if op in (sre.GROUPREF, sre.GROUPREF_EXISTS):
            return False
        if op in (sre.CATEGORY, sre.AT, sre.ANY, sre.NEGATE):
            return True
        return _blind(arg, sre, subpattern)
    if isinstance(node, list | tuple | subpattern):
        return all(_blind(item, sre, subpattern) for item in node)
    return node is None or isinstance(node, int | str)


class Classifier:
    """Segments text by one `RuleSet`; keeps bounded caches of line matches and results.

    Segmenting only ever looks at what `_LineInfo` holds of each line, so a text is reduced to
    its line shape (the info id of each line) and the split positions are remembered per shape:
    a prompt that differs from an earlier one in one line (a timestamp) costs one line of
    matching and a dict lookup per line."""

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self.pinned_in_place: Final = frozenset(r.name for r in rules.rules if r.pin and r.tier == "stable")
        """Names of the pinned `stable` rules (API-significant lines kept in place: reorder)."""
        self._tests: list[re.Pattern[str]] = []
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
        self._rule_mask = self._section_mask | self._paragraph_mask | self._line_mask
        self._lines: dict[str, int] = {}
        """Line -> index into `_infos`."""
        self._line_chars = 0
        """Characters of the keys of `_lines` (bounded by `_LINE_CACHE_CHARS`)."""
        self._text_chars = 0
        """Characters of the keys of `_texts` (bounded by `_TEXT_CACHE_CHARS`)."""
        self._infos: list[_LineInfo] = []
        self._info_ids: dict[_LineInfo, int] = {}
        self._shapes: dict[tuple[int, ...], tuple[tuple[int, Any], ...] | None] = {}
        """Line shape -> `(first line, rule or wrapper kind)` of each segment; `None`: the
        whole text is one unclassified segment."""
        self._texts: dict[str, tuple[Segment, ...]] = {}
        tests = list(enumerate(self._tests))
        self._blind = [(bit, p) for bit, p in tests if _digit_blind(p)]
        self._sighted = [(bit, p) for bit, p in tests if not _digit_blind(p)]
        self._masks: dict[str, int] = {}
        """Line with its digits made `0` -> mask of the digit-blind tests."""

    def _mask(self, line: str) -> int:
        if len(line) > MAX_RULE_LINE_CHARS:
            return 0  # content, not a rule's line: bounded time (`MAX_RULE_LINE_CHARS`)
        mask = 0
        for bit, pattern in self._sighted:
            if pattern.search(line) is not None:
                mask |= 1 << bit
        if self._blind:
            digitless = line.translate(_ZERO_DIGITS)
            blind = self._masks.get(digitless)
            if blind is None:
                blind = 0
                for bit, pattern in self._blind:
                    if pattern.search(line) is not None:
                        blind |= 1 << bit
                self._masks[digitless] = blind
            mask |= blind
        return mask

    def _forget_lines(self) -> None:
        """Drop every remembered line (the line caches are full)."""
        self._lines.clear()
        self._line_chars = 0
        self._infos.clear()
        self._info_ids.clear()
        self._shapes.clear()
        self._masks.clear()

    def _line_id(self, line: str) -> int:
        if not line or line.isspace():
            info = _BLANK
        else:
            mask = self._mask(line)
            opening = closing = None
            close_tag = _CLOSE_TAG.fullmatch(line)
            if close_tag is not None:
                closing = close_tag.group(1)
            else:
                open_tag = _OPEN_TAG.fullmatch(line)
                if open_tag is not None and not line.rstrip().endswith("/>"):
                    opening = open_tag.group(1)
            heading = 0
            if line.lstrip(" ")[:1] == "#":
                found = _HEADING.match(line)
                heading = len(found.group(1)) if found is not None else 0
            info = (mask, False, opening, closing, heading)
        ident = self._info_ids.get(info)
        if ident is None:
            ident = self._info_ids[info] = len(self._infos)
            self._infos.append(info)
        self._lines[line] = ident
        return ident

    def segments(self, text: str, budget: Budget | None = None) -> tuple[Segment, ...]:
        """The segments of `text`. With a `budget`, every line of a text not segmented before
        costs 1 (the per-line work is done for remembered lines too: a body of ten million
        empty lines is refused up front, at `str.count` speed), and each line not classified
        before costs its length plus `LINE_SCAN_COST` more; raises `BudgetSpent` when the
        budget cannot cover it (the lines classified so far stay remembered: a later request
        goes on from there)."""
        cached = self._texts.get(text)
        if cached is None:
            if budget is not None and not budget.take(text.count("\n") + 1):
                raise BudgetSpent
            cached = self._segments(text, budget)
            if len(self._texts) >= _TEXT_CACHE_LIMIT or self._text_chars + len(text) > _TEXT_CACHE_CHARS:
                self._texts.clear()
                self._text_chars = 0
            if len(text) <= _TEXT_CACHE_CHARS:
                self._texts[text] = cached
                self._text_chars += len(text)
        return cached

    def _segments(self, text: str, budget: Budget | None = None) -> tuple[Segment, ...]:
        lines = text.split("\n")
        if not lines[-1]:
            lines.pop()
        found = list(map(self._lines.get, lines))
        if None in found:
            fresh = [line for ident, line in zip(found, lines, strict=True) if ident is None]
            fresh_chars = sum(map(len, fresh))
            if (
                len(self._lines) + len(fresh) > _LINE_CACHE_LIMIT
                or self._line_chars + fresh_chars > _LINE_CACHE_CHARS
            ):
                self._forget_lines()
                found = [None] * len(lines)
            ids = []
            for ident, line in zip(found, lines, strict=True):
                if ident is None:
                    ident = self._lines.get(line)  # a repeat of a line classified just now
                if ident is None:
                    if budget is not None and not budget.take(len(line) + LINE_SCAN_COST):
                        raise BudgetSpent
                    ident = self._line_id(line)
                    self._line_chars += len(line)
                ids.append(ident)
        else:
            ids = cast(list[int], found)
        shape_key = tuple(ids)
        shape = self._shapes.get(shape_key, _ABSENT)
        if shape is _ABSENT:
            infos = self._infos
            shape = self._shape([infos[i] for i in ids])
            if len(self._shapes) >= _TEXT_CACHE_LIMIT:
                self._shapes.clear()
            self._shapes[shape_key] = shape
        if shape is None:
            return (Segment(text),)
        if len(shape) == 1 and shape[0][1] is not None:
            rule = shape[0][1]
            return (Segment(text, rule.tier, rule.name, rule.move_to_user),)
        ends = list(accumulate(map(len, lines)))
        out = []
        for k, (begin, rule) in enumerate(shape):
            start = 0 if k == 0 else ends[begin - 1] + begin
            if k + 1 < len(shape):
                after = shape[k + 1][0]
                end = ends[after - 1] + after
            else:
                end = len(text)
            chunk = text[start:end]
            if rule is None:
                out.append(Segment(chunk))
            elif rule is _WRAP_OPEN or rule is _WRAP_CLOSE:
                out.append(Segment(chunk, wrap=1 if rule is _WRAP_OPEN else -1))
            else:
                out.append(Segment(chunk, rule.tier, rule.name, rule.move_to_user))
        return tuple(out)

    def _shape(self, infos: list[_LineInfo]) -> tuple[tuple[int, Any], ...] | None:
        """The split of a text whose lines are `infos` (see `_shapes`); one element: the
        whole text is one segment of that (`block`) rule."""
        blank = [info[1] for info in infos]
        if all(blank):
            return None
        masks = [info[0] for info in infos]
        first = blank.index(False)
        for bit, rule in self._by_kind["block"]:
            if masks[first] & bit:
                return ((0, rule),)
        spans = self._spans(masks, blank, [info[4] for info in infos], infos)
        if len(spans) == 1 and spans[0][2] is None:
            return None
        spans = _split_wrappers(spans, infos, blank)
        return tuple((begin, rule) for begin, _, rule in spans)

    def _spans(self, masks: list[int], blank: list[bool], levels: list[int], infos: list[_LineInfo]) -> list[list[Any]]:
        """`[start, end, rule]` spans covering every non-blank line, in order (`levels`: heading
        level per line, 0 for none)."""
        spans: list[list[Any]] = []
        n = len(masks)
        section_mask, paragraph_mask, line_mask = self._section_mask, self._paragraph_mask, self._line_mask
        rule_mask = self._rule_mask
        partners: list[int] | None = None
        i = 0
        while i < n:
            if blank[i]:
                i += 1
                continue
            if levels[i] and masks[i] & rule_mask:
                heading = self._heading_rule(masks[i])
                if partners is None:
                    partners = _tag_partners(infos)
                j = self._heading_end(heading, i, masks, levels, infos, partners)
                spans.append([i, j, heading])
                i = j
                continue
            if masks[i] & section_mask:
                section = _first(self._by_kind["section"], masks[i])
                assert section is not None  # masks[i] has a section bit
                j = self._section_end(section, masks, blank, i)
                spans.append([i, j, section])
                i = j
                continue
            p = i + 1
            joined = masks[i]
            while p < n and not blank[p] and not masks[p] & section_mask and not (levels[p] and masks[p] & rule_mask):
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

    def _heading_rule(self, mask: int) -> Rule:
        """The rule a heading section takes: the most volatile one its heading line matches
        (ties: section, paragraph, line/block, then file order)."""
        best: Rule | None = None
        for kind in ("section", "paragraph", "line"):
            for bit, rule in self._by_kind[kind]:
                if mask & bit and (best is None or TIER_RANK[rule.tier] > TIER_RANK[best.tier]):
                    best = rule
        assert best is not None  # the caller checked `mask & _rule_mask`
        return best

    def _heading_end(
        self, rule: Rule, i: int, masks: list[int], levels: list[int], infos: list[_LineInfo], partners: list[int]
    ) -> int:
        """End (exclusive) of the heading section starting at line `i` (module docstring);
        `partners`: `_tag_partners(infos)`. A closing tag whose opening tag is not before the
        heading (none at all: plain text) does not end it: had it ended it, the section would
        end elsewhere once sorting moved that line away, and reordering would not be idempotent."""
        level = levels[i]
        stop = self._stop.get(rule.name) if rule.kind == "section" else None
        opened: list[str] = []
        open_count: dict[str, int] = {}  # per name, its entries in `opened` (no list scans)
        for k in range(i + 1, len(masks)):
            if 0 < levels[k] <= level:
                return k
            if stop is not None and masks[k] & stop:
                return k + 1 if rule.end is not None else k
            _, _, opening, closing, _ = infos[k]
            if closing is not None:
                if not open_count.get(closing):
                    if 0 <= partners[k] < i:
                        return k  # the closing tag of a wrapper around the heading
                    continue
                while True:  # close it and every tag opened after it
                    name = opened.pop()
                    open_count[name] -= 1
                    if name == closing:
                        break
            elif opening is not None:
                opened.append(opening)
                open_count[opening] = open_count.get(opening, 0) + 1
        return len(masks)

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


def _tag_partners(infos: list[_LineInfo]) -> list[int]:
    """Per line, the line of the opening tag a closing tag line closes (the latest one of its
    name not closed yet), else -1 (not a closing tag, or no such opening tag). One pass."""
    partners = [-1] * len(infos)
    open_lines: dict[str, list[int]] = {}
    for k, info in enumerate(infos):
        opening, closing = info[2], info[3]
        if opening is not None:
            open_lines.setdefault(opening, []).append(k)
        elif closing is not None:
            waiting = open_lines.get(closing)
            if waiting:
                partners[k] = waiting.pop()
    return partners


def _wrappers(spans: list[list[Any]], infos: list[_LineInfo], blank: list[bool]) -> dict[int, str]:
    """Line index -> `_WRAP_OPEN` / `_WRAP_CLOSE` for the tag lines of every wrapper (module
    docstring): tag lines in unclassified spans, paired by name with a stack (an unmatched
    tag is plain text), kept when a classified line lies between them."""
    classified = [False] * len(infos)
    free: list[int] = []
    for begin, end, rule in spans:
        if rule is None:
            free.extend(range(begin, end))
        else:
            classified[begin:end] = [True] * (end - begin)
    if not any(classified):
        return {}
    kept: dict[int, str] = {}
    stack: list[tuple[str, int]] = []
    for i in free:
        if blank[i]:
            continue
        _, _, opening, closing, _ = infos[i]
        if closing is not None:
            name = closing
            depth = next((d for d in range(len(stack) - 1, -1, -1) if stack[d][0] == name), None)
            if depth is None:
                continue
            start = stack[depth][1]
            del stack[depth:]
            if any(classified[start + 1 : i]):
                kept[start], kept[i] = _WRAP_OPEN, _WRAP_CLOSE
            continue
        if opening is not None:
            stack.append((opening, i))
    return kept


def _split_wrappers(spans: list[list[Any]], infos: list[_LineInfo], blank: list[bool]) -> list[list[Any]]:
    """`spans` with every wrapper tag line (`_wrappers`) as a span of its own; the blank
    lines after a tag line stay with it."""
    tags = _wrappers(spans, infos, blank)
    if not tags:
        return spans
    out: list[list[Any]] = []
    for begin, end, rule in spans:
        if rule is not None:
            out.append([begin, end, rule])
            continue
        start = begin
        for i in range(begin, end + 1):
            if i < end and i not in tags:
                continue
            if not all(blank[start:i]):
                out.append([start, i, None])
            if i < end:
                out.append([i, i + 1, tags[i]])
                start = i + 1
    return out


def _first(candidates: list[tuple[int, Rule]], mask: int) -> Rule | None:
    for bit, rule in candidates:
        if mask & bit:
            return rule
    return None


def without_volatile(classifier: Classifier, text: str, budget: Budget | None = None) -> str:
    """`text` without its `volatile` segments of more than one line (wrapper tag lines kept):
    what stays the same across a conversation's turns, for session identity
    (`proxy.pipeline.replay.head_form`). Of a volatile segment of one line its words stay,
    without its values (`_words_of`: any token holding a digit), so they tell conversations
    apart while the values change every turn (attack pass, session 14: `You are helping
    alice@example.com. Current time: ...` and the same line for bob were one conversation,
    and replay sent alice's note, moved onto her first message, in bob's history). A section
    (a todo list under a timestamped heading) changes every turn and is left out whole.
    `text` itself when the `budget` cannot cover classifying it (reorder then sends it as is)."""
    try:
        segments = classifier.segments(text, budget)
    except BudgetSpent:
        return text
    if all(s.wrap or s.tier != "volatile" for s in segments):
        return text
    kept = []
    for s in segments:
        if s.wrap or s.tier != "volatile":
            kept.append(s.text)
        elif _is_one_line(s.text):
            kept.append(_words_of(s.text))
    return "".join(kept)


def _is_one_line(text: str) -> bool:
    """Whether `text` is one line (a trailing newline allowed)."""
    return "\n" not in text.rstrip("\n")


def _words_of(line: str) -> str:
    """`line` without its value tokens (`proxy.rules.is_value_token`), in one space-separated
    run: what of a volatile line stays while its values change
    (`Session cost: $0.41 (5 requests)` -> `Session cost: requests)`)."""
    return " ".join(t for t in line.split() if not is_value_token(t)) + "\n"


_CLASSIFIERS: dict[int, tuple[RuleSet, Classifier]] = {}


def classifier_for(rules: RuleSet) -> Classifier:
    """The (cached) classifier of `rules`; one per live `RuleSet`."""
    entry = _CLASSIFIERS.get(id(rules))
    if entry is None or entry[0] is not rules:
        if len(_CLASSIFIERS) > 32:
            _CLASSIFIERS.clear()
        entry = _CLASSIFIERS[id(rules)] = (rules, Classifier(rules))
    return entry[1]
