"""regexcheck: reject rule patterns that Python's backtracking `re` can run in super-linear time.

Rule patterns run on client text (system prompts, every message string for masking), so one
pattern that backtracks polynomially or exponentially lets one small request stall the event
loop for every tenant (issue 11: `^\\s*[-*]?\\s*` over a run of newlines is cubic). Rules are
matched one line at a time (never across a newline), and every pattern must pass
`superlinear_reason(pattern)` (`proxy.rules` calls it at load time, so `promptcache
check-rules` and `serve` reject such a rule naming file, rule and line).

The check is a static analysis of the parse tree (`re._parser`, as in `proxy.pipeline.prefilter`)
with character classes evaluated over a sample alphabet (all ASCII plus a few non-ASCII letters,
digits and spaces). An *unbounded* quantifier is `*`, `+` or `{m,n}` with `n > MAX_BOUNDED`.
Rejected, each with its reason:

1. **adjacent**: two unbounded quantifiers over overlapping classes with only optional items
   between them (`\\s*[-*]?\\s*`, `.*\\d+`): a failing match tries every split, O(n^2) per start;
2. **nested**: an unbounded repeat (or a bounded one with more than one iteration) whose body
   can end in an unbounded quantifier overlapping what the body can start with (`(a+)+`,
   `(\\d+,?)*`), or an alternation whose branches can start with the same character
   (`(a|ab)*`): exponentially many ways to split the input;
3. **leading**: an unanchored pattern that starts with an unbounded quantifier and needs more
   after it (`\\s+x`): `search` restarts inside the run, O(n^2). `^`, `\\A` or a `\\b` before a
   word-character run (only the run's first position is a boundary) anchor it.

Bounded repeats (`{0,40}`) cost a constant factor and are allowed. Lookarounds and
backreferences are not analysed (their bodies are checked like any group). The analysis is
conservative: a rejected pattern can always be rewritten (`^\\s*(?:[-*]\\s*)?` instead of
`^\\s*[-*]?\\s*`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from proxy.frozen import fast_init

try:  # Python 3.11+ (as proxy.pipeline.prefilter)
    from re import _constants as _c
    from re import _parser as _sre
except ImportError:  # pragma: no cover - another interpreter: no static check
    _c = _sre = None

MAX_BOUNDED: Final = 100
"""A `{m,n}` repeat with `n` above this counts as unbounded."""
_SAMPLES: Final = tuple(chr(i) for i in range(128)) + tuple("\u00a0\u2028\u3000éÉßſKǅ中٣²")
_ALL: Final = frozenset(range(len(_SAMPLES)))

Chars = frozenset[int]
"""Indices into the sample alphabet a construct can consume."""


@fast_init
@dataclass(frozen=True, slots=True)
class _Info:
    nullable: bool
    chars: Chars
    """Every sample character the construct can consume."""
    first: Chars
    """Characters it can start with."""
    leading: Chars
    """Classes of unbounded quantifiers it can start with (through optional items)."""
    trailing: Chars
    """Classes of unbounded quantifiers it can end with (through optional items)."""


class _Unsafe(Exception):
    pass


def superlinear_reason(pattern: str, flags: int = 0) -> str | None:
    """Why `pattern` can backtrack super-linearly on one line (module docstring), or `None`."""
    if _sre is None:
        return None
    try:
        tree = _sre.parse(pattern, flags)
    except re.error:
        return None  # the caller reports the compile error itself
    ignore_case = bool(tree.state.flags & re.IGNORECASE)
    try:
        items = list(tree)
        info = _sequence(items, ignore_case)
        _check_leading(items, ignore_case)
    except _Unsafe as exc:
        return str(exc)
    del info
    return None


def _class_chars(op: Any, av: Any, ignore_case: bool) -> Chars:
    """Sample characters one single-character construct matches."""
    if op is _c.ANY:
        return frozenset(i for i, ch in enumerate(_SAMPLES) if ch != "\n")
    if op is _c.LITERAL or op is _c.NOT_LITERAL:
        target = chr(av)
        hits = frozenset(i for i, ch in enumerate(_SAMPLES) if _same(ch, target, ignore_case))
        return hits if op is _c.LITERAL else _ALL - hits
    if op is _c.IN:
        negate = False
        out: set[int] = set()
        for sub_op, sub_av in av:
            if sub_op is _c.NEGATE:
                negate = True
            elif sub_op is _c.RANGE:
                low, high = sub_av
                out.update(
                    i
                    for i, ch in enumerate(_SAMPLES)
                    if low <= ord(ch) <= high
                    or (ignore_case and (low <= ord(ch.lower()) <= high or low <= ord(ch.upper()) <= high))
                )
            elif sub_op is _c.CATEGORY:
                out.update(_category(sub_av))
            else:
                out.update(_class_chars(sub_op, sub_av, ignore_case))
        return _ALL - out if negate else frozenset(out)
    if op is _c.CATEGORY:
        return _category(av)
    return _ALL


def _same(ch: str, target: str, ignore_case: bool) -> bool:
    return ch == target or (ignore_case and ch.lower() == target.lower())


_CATEGORY_TESTS: Final = {
    "CATEGORY_DIGIT": lambda ch: bool(re.match(r"\d", ch)),
    "CATEGORY_NOT_DIGIT": lambda ch: not re.match(r"\d", ch),
    "CATEGORY_SPACE": lambda ch: bool(re.match(r"\s", ch)),
    "CATEGORY_NOT_SPACE": lambda ch: not re.match(r"\s", ch),
    "CATEGORY_WORD": lambda ch: bool(re.match(r"\w", ch)),
    "CATEGORY_NOT_WORD": lambda ch: not re.match(r"\w", ch),
}
_WORD: Final = frozenset(i for i, ch in enumerate(_SAMPLES) if re.match(r"\w", ch))


def _category(av: Any) -> Chars:
    test = _CATEGORY_TESTS.get(str(av))
    if test is None:
        return _ALL
    return frozenset(i for i, ch in enumerate(_SAMPLES) if test(ch))


_EMPTY: Final = _Info(True, frozenset(), frozenset(), frozenset(), frozenset())


def _node(op: Any, av: Any, ignore_case: bool) -> _Info:
    if op in (_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN, _c.CATEGORY):
        chars = _class_chars(op, av, ignore_case)
        return _Info(False, chars, chars, frozenset(), frozenset())
    if op is _c.SUBPATTERN:
        _group, add_flags, del_flags, sub = av
        case = (ignore_case or bool(add_flags & re.IGNORECASE)) and not del_flags & re.IGNORECASE
        return _sequence(list(sub), case)
    if op is _c.ATOMIC_GROUP:
        return _sequence(list(av), ignore_case)
    if op is _c.BRANCH:
        infos = [_sequence(list(branch), ignore_case) for branch in av[1]]
        return _Info(
            any(i.nullable for i in infos),
            frozenset().union(*(i.chars for i in infos)),
            frozenset().union(*(i.first for i in infos)),
            frozenset().union(*(i.leading for i in infos)),
            frozenset().union(*(i.trailing for i in infos)),
        )
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
        low, high, sub = av
        items = list(sub)
        body = _sequence(items, ignore_case)
        unbounded = high is _c.MAXREPEAT or high > MAX_BOUNDED
        if high is _c.MAXREPEAT or high > 1:
            if body.trailing & (body.first | body.leading):
                raise _Unsafe(
                    "nested quantifiers: a repeated group ends in an unbounded quantifier that "
                    "overlaps how the group starts, e.g. (a+)+"
                )
            _check_branches(items, ignore_case)
        if op is _c.POSSESSIVE_REPEAT or not body.chars:
            return _Info(low == 0 or body.nullable, body.chars, body.first, frozenset(), frozenset())
        own = body.chars if unbounded else frozenset()
        return _Info(
            low == 0 or body.nullable,
            body.chars,
            body.first,
            body.leading | own,
            body.trailing | own,
        )
    if op in (_c.ASSERT, _c.ASSERT_NOT):
        _sequence(list(av[1]), ignore_case)
        return _EMPTY
    if op is _c.GROUPREF_EXISTS:
        _group, yes, no = av
        infos = [_sequence(list(yes), ignore_case)] + ([_sequence(list(no), ignore_case)] if no else [])
        return _Info(
            True,
            frozenset().union(*(i.chars for i in infos)),
            frozenset().union(*(i.first for i in infos)),
            frozenset().union(*(i.leading for i in infos)),
            frozenset().union(*(i.trailing for i in infos)),
        )
    if op is _c.GROUPREF:
        return _Info(True, _ALL, _ALL, frozenset(), frozenset())
    return _EMPTY  # AT (anchors) and anything zero-width


def _check_branches(items: list[Any], ignore_case: bool) -> None:
    """A repeated alternation whose branches can start with the same character is ambiguous."""
    while len(items) == 1 and items[0][0] is _c.SUBPATTERN:
        items = list(items[0][1][3])
    if len(items) != 1 or items[0][0] is not _c.BRANCH:
        return
    seen: Chars = frozenset()
    for branch in items[0][1][1]:
        first = _sequence(list(branch), ignore_case).first
        if first & seen:
            raise _Unsafe("nested quantifiers: a repeated alternation whose branches overlap, e.g. (a|ab)*")
        seen |= first


def _sequence(items: list[Any], ignore_case: bool) -> _Info:
    """Combine a concatenation, rejecting adjacent overlapping unbounded quantifiers."""
    infos = [_node(op, av, ignore_case) for op, av in items]
    pending: Chars = frozenset()
    """Unbounded classes that can still end right before the current item."""
    for info in infos:
        if pending & info.leading:
            raise _Unsafe(
                "adjacent unbounded quantifiers over overlapping characters with only optional "
                r"items between them, e.g. \s*[-*]?\s* (write ^\s*(?:[-*]\s*)? instead)"
            )
        pending = info.trailing | (pending if info.nullable else frozenset())
    nullable = all(i.nullable for i in infos)
    first: set[int] = set()
    leading: set[int] = set()
    for info in infos:
        first |= info.first
        leading |= info.leading
        if not info.nullable:
            break
    trailing: set[int] = set()
    for info in reversed(infos):
        trailing |= info.trailing
        if not info.nullable:
            break
    chars = frozenset().union(*(i.chars for i in infos)) if infos else frozenset()
    return _Info(nullable, chars, frozenset(first), frozenset(leading), frozenset(trailing))


def _check_leading(items: list[Any], ignore_case: bool) -> None:
    """Rule 3 of the module docstring, for the top-level sequence (and each top-level branch)."""
    while len(items) == 1 and items[0][0] is _c.SUBPATTERN:
        items = list(items[0][1][3])
    if len(items) == 1 and items[0][0] is _c.BRANCH:
        for branch in items[0][1][1]:
            _check_leading(list(branch), ignore_case)
        return
    word_boundary = False
    for index, (op, av) in enumerate(items):
        if op is _c.AT:
            if av in (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING):
                return
            word_boundary = word_boundary or av is _c.AT_BOUNDARY
            continue
        info = _node(op, av, ignore_case)
        if info.leading:
            anchored = word_boundary and info.leading <= _WORD
            rest = [_node(o, a, ignore_case) for o, a in items[index + 1 :]]
            if not anchored and not all(r.nullable for r in rest):
                raise _Unsafe(
                    "unanchored pattern starting with an unbounded quantifier, e.g. \\s+x "
                    "(anchor it with ^ or start with a literal)"
                )
        if not info.nullable:
            return
