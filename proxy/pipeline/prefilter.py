"""prefilter: necessary conditions for a regex to match, checked before running it.

Masking runs the rules' volatile patterns over every string of a message (`proxy.pipeline.replay`,
Python `re` at about 6 MB/s for the packaged rules); most strings cannot match most patterns. For
a pattern, `needs(pattern)` derives from its parse tree literals that every match must contain
(case-folded under `IGNORECASE`) and whether every match must contain a digit; `Needs.admits(text)`
checks them with substring searches (C speed). A string that is not admitted is left alone by
that pattern: `pattern.sub` would return it unchanged.

Soundness: only ASCII texts are filtered (`str.isascii`; a non-ASCII text always runs the
pattern), so case folding is `str.lower` and `\\d` is `[0-9]`. Anything the analysis does not
understand (lookarounds, backreferences, conditionals, a parser it cannot import) contributes no
condition; a pattern with no condition is always run. Conditions are conjunctive: a sequence
needs each of its parts; an alternation needs one of its branches' conditions; a repeat with a
minimum of zero needs nothing.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Final

try:  # Python 3.11+: the regex parser (stable since 2.x, private name since 3.11)
    from re import _constants as _c
    from re import _parser as _sre
except ImportError:  # pragma: no cover - another interpreter: no prefilter, patterns always run
    _c = _sre = None

_ahocorasick: Any
try:  # a multi-literal search (Aho-Corasick, SIMD); without it `LiteralGate` rejects nothing
    import ahocorasick_rs as _ahocorasick
except ImportError:  # pragma: no cover - not installed: every value is checked as before
    _ahocorasick = None

_DIGITS: Final = "0123456789"
_MAX_ATOMS: Final = 4

Alt = tuple[str, str]
"""`("lit", text)`, `("ilit", lower-cased text)` (matched ignoring case) or `("digit", "")`."""
Atom = frozenset[Alt]
"""At least one alternative occurs in every match."""


class Needs:
    """What every match of one pattern contains (module docstring)."""

    __slots__ = ("atoms",)

    def __init__(self, atoms: Iterable[Atom]) -> None:
        self.atoms = tuple(atoms)

    def admits(self, text: str) -> bool:
        """False only when `text` cannot hold a match."""
        return not text.isascii() or self.admits_ascii(ScannedText(text))

    def admits_ascii(self, text: ScannedText) -> bool:
        """`admits` for an ASCII text (the caller checked `str.isascii`)."""
        for atom in self.atoms:
            for kind, literal in atom:
                if kind == "lit":
                    if literal in text.text:
                        break
                elif kind == "ilit":
                    if literal in text.folded():
                        break
                elif text.has_digit():
                    break
            else:
                return False
        return True


class ScannedText:
    """One ASCII text and, computed once when first asked, its lower-cased form and whether it
    holds a digit (shared by the patterns checked against it)."""

    __slots__ = ("text", "_folded", "_has_digit")

    def __init__(self, text: str) -> None:
        self.text = text
        self._folded: str | None = None
        self._has_digit: bool | None = None

    def folded(self) -> str:
        if self._folded is None:
            self._folded = self.text.lower()
        return self._folded

    def has_digit(self) -> bool:
        if self._has_digit is None:
            text = self.text
            self._has_digit = any(d in text for d in _DIGITS)
        return self._has_digit


def needs(pattern: re.Pattern[str]) -> Needs | None:
    """The conditions every match of `pattern` meets, or `None` when none is known."""
    if _sre is None or not isinstance(pattern.pattern, str):
        return None
    try:
        parsed = _sre.parse(pattern.pattern, pattern.flags)
        ignore_case = bool(parsed.state.flags & re.IGNORECASE)
        atoms = _sequence(parsed, ignore_case)
    except Exception:  # noqa: BLE001 - an unknown construct only costs the prefilter
        return None
    if atoms is None:
        return None
    usable = sorted({a for a in atoms if a}, key=_score, reverse=True)[:_MAX_ATOMS]
    if not usable:
        return None
    return Needs(usable)


def _score(atom: AbstractSet[Alt]) -> tuple[int, int]:
    weakest = min(1 if kind == "digit" else len(literal) for kind, literal in atom)
    return weakest, -len(atom)


def _literal(text: str, ignore_case: bool) -> Atom | None:
    if ignore_case:
        if not text.isascii():
            return None
        return frozenset({("ilit", text.lower())})
    return frozenset({("lit", text)})


def _sequence(items: Any, ignore_case: bool) -> list[Atom] | None:
    """Atoms every match of the sequence `items` has (each one necessary)."""
    out: list[Atom] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            atom = _literal("".join(run), ignore_case)
            if atom is not None:
                out.append(atom)
            run.clear()

    for op, av in items:
        if op is _c.LITERAL:
            run.append(chr(av))
            continue
        flush()
        if op is _c.SUBPATTERN:
            _, add_flags, del_flags, sub = av
            inner_case = (ignore_case or bool(add_flags & re.IGNORECASE)) and not del_flags & re.IGNORECASE
            found = _sequence(sub, inner_case)
            if found:
                out.extend(found)
        elif op is getattr(_c, "ATOMIC_GROUP", None):
            found = _sequence(av, ignore_case)
            if found:
                out.extend(found)
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT) or op is getattr(_c, "POSSESSIVE_REPEAT", None):
            low, _, sub = av
            if low >= 1:
                found = _sequence(sub, ignore_case)
                if found:
                    out.extend(found)
        elif op is _c.BRANCH:
            alternatives: set[Alt] = set()
            for branch in av[1]:
                found = _sequence(branch, ignore_case)
                if not found:
                    break
                alternatives |= max(found, key=_score)
            else:
                out.append(frozenset(alternatives))
        elif op is _c.IN and _is_digit_class(av):
            out.append(frozenset({("digit", "")}))
    flush()
    return out


def _is_digit_class(items: Any) -> bool:
    """`[...]` whose every member is a digit (`\\d`, `[0-9]`, digit literals); never negated."""
    if not items:
        return False
    for op, av in items:
        if op is _c.CATEGORY and av is _c.CATEGORY_DIGIT:
            continue
        if op is _c.LITERAL and chr(av) in _DIGITS:
            continue
        if op is _c.RANGE and ord("0") <= av[0] <= av[1] <= ord("9"):
            continue
        return False
    return True


_TEXT_TYPE: Final = "text"
"""The one string `canonical_value` adds to a value (the `type` of the text block a string
content is shorthand for): a literal inside it is never looked for in a value's bytes."""
_DIGIT_BYTE: Final = re.compile(rb"[0-9]")


class LiteralGate:
    """All filters' conditions checked at once on a batch of values' compact orjson bytes (one
    multi-literal pass over their concatenation, `ahocorasick_rs`, instead of one substring
    search per literal, per filter, per value): `rejects(datas)[i]` is True only when no
    filter's `Needs` admits the string values of the value `datas[i]` was dumped from, so
    masking it changes nothing (`proxy.pipeline.replay.may_mask` would say so too).

    Soundness: orjson writes every printable ASCII character of a string other than `"` and
    `\\` as itself (non-ASCII as UTF-8 bytes, which makes the bytes non-ASCII: never rejected),
    so a literal of such characters that a string value holds, its bytes hold. Keys, JSON
    punctuation and escapes only add text (a condition may be met that the strings do not
    meet: the value is then checked as before). A case-sensitive literal is looked for in the
    lower-cased bytes too (found more often, never less). A literal of other characters, or
    one inside the `"text"` that `canonical_value` adds, counts as present. One-byte literals
    and the digit condition are checked per value (a one-byte needle is slow in the
    automaton). The pass reports leftmost, non-overlapping matches: an occurrence hidden by a
    reported match overlaps it, so each reported literal also marks every literal that can
    overlap it (a substring of it, or one that starts with a suffix of it).

    Without `ahocorasick_rs`, or with a filter that has no condition, `rejects` is all False
    (every value is checked as before)."""

    __slots__ = ("_automaton", "_closure", "_filters", "_unanchored")

    def __init__(self, all_needs: Sequence[Needs | None]) -> None:
        self._automaton: Any = None
        self._closure: tuple[int, ...] = ()
        self._filters: tuple[tuple[tuple[int, tuple[bytes, ...], bool], ...], ...] = ()
        self._unanchored: tuple[tuple[tuple[int, tuple[bytes, ...], bool], ...], ...] = ()
        """The filters without an atom of pass literals only: the ones a value in which the
        pass found nothing may still meet."""
        if _ahocorasick is None or not all_needs or any(n is None for n in all_needs):
            return
        literals: dict[bytes, int] = {}
        filters = []
        for need in all_needs:
            assert need is not None
            atoms = []
            for atom in need.atoms:
                checked = _gate_atom(atom, literals)
                if checked is not None:
                    atoms.append(checked)
            if not atoms:  # every value may be admitted by this filter: nothing to gate
                return
            # the cheapest checks first: literals of the one pass, then bytes, a digit last (most
            # values hold one: ids, line numbers)
            atoms.sort(key=lambda a: (a[0] == 0, a[2], len(a[1])))
            filters.append(tuple(atoms))
        self._filters = tuple(filters)
        self._unanchored = tuple(f for f in filters if not any(a[1] == () and not a[2] for a in f))
        if literals:
            words = sorted(literals, key=literals.__getitem__)
            self._automaton = _ahocorasick.BytesAhoCorasick(words, matchkind=_ahocorasick.MatchKind.LeftmostFirst)
            self._closure = tuple(_overlapping(word, words) for word in words)

    @property
    def is_active(self) -> bool:
        """Whether `rejects` can say True at all."""
        return bool(self._filters)

    def rejects(self, datas: Sequence[bytes]) -> list[bool]:
        """Per value bytes: True when no filter can admit its strings (class docstring)."""
        if not self._filters or not datas:
            return [False] * len(datas)
        found = [0] * len(datas)
        if self._automaton is not None:
            hay = b"\n".join(datas).lower()
            matches = self._automaton.find_matches_as_indexes(hay)
            if matches:
                starts = []
                offset = 0
                for data in datas:
                    starts.append(offset)
                    offset += len(data) + 1
                closure = self._closure
                for word, start, _ in matches:
                    i = bisect_right(starts, start) - 1
                    found[i] |= closure[word]
        out = []
        every, unanchored = self._filters, self._unanchored
        for data, present in zip(datas, found, strict=True):
            if not data.isascii():
                out.append(False)
                continue
            admitted = False
            for atoms in every if present else unanchored:
                for mask, needles, is_digit in atoms:
                    if mask & present:
                        continue
                    if needles and any(n in data for n in needles):
                        continue
                    if is_digit and _DIGIT_BYTE.search(data) is not None:
                        continue
                    break  # this atom is missing: the filter cannot admit
                else:
                    admitted = True
                    break
            out.append(not admitted)
        return out


def _gate_atom(atom: Atom, literals: dict[bytes, int]) -> tuple[int, tuple[bytes, ...], bool] | None:
    """`(mask of pass literals, one-byte needles, digit)` for one atom (met when any is
    present: a pass literal in the lower-cased bytes, a needle or a digit in the bytes as
    they are), registering its pass literals; `None` when the atom counts as always met."""
    mask = 0
    needles: list[bytes] = []
    is_digit = False
    for kind, literal in atom:
        if kind == "digit":
            is_digit = True
            continue
        if not _is_findable(literal):
            return None
        word = literal.lower().encode()
        if len(word) == 1:  # as it is, and in the other case when it is matched ignoring case
            needles.append(literal.encode())
            if kind == "ilit":
                needles.extend({literal.lower().encode(), literal.upper().encode()})
        else:
            mask |= 1 << literals.setdefault(word, len(literals))
    return mask, tuple(sorted(set(needles))), is_digit


def _is_findable(literal: str) -> bool:
    """Whether a string holding `literal` makes its orjson bytes hold it (class docstring)."""
    return (
        bool(literal)
        and all(" " <= c <= "~" and c not in '"\\' for c in literal)
        and literal.lower() not in _TEXT_TYPE
    )


def _overlapping(word: bytes, words: Sequence[bytes]) -> int:
    """Mask of the literals an occurrence of `word` can hide: itself, its substrings, and
    those that start with a proper suffix of it (they begin inside it)."""
    mask = 0
    for i, other in enumerate(words):
        if other in word or any(other.startswith(word[k:]) for k in range(1, len(word))):
            mask |= 1 << i
    return mask
