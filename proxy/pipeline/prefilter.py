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
_QUOTE: Final = ord('"')
_BEFORE_OPENING_QUOTE: Final = b"\\{[,:"
"""The bytes before a `"` that may be escaped or open a string (`holds_string_colon`)."""
GateAtom = tuple[int, tuple[bytes, ...], bool, bool]
"""One atom as `LiteralGate` checks it: `(mask of pass literals, one-byte needles, colon,
digit)` (`_gate_atom`)."""


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
    reported match starts inside it, so each reported literal marks the literals inside it
    (its substrings) and each literal that starts inside it and ends after it (or starts
    where it does and is longer) when the bytes hold it there. A `:` counts as
    present only where it may be inside a string (`holds_string_colon`): the separator after
    every key would otherwise meet a `:` condition in every value (a date or a clock pattern
    then admits every value holding a digit and a `-`).

    Without `ahocorasick_rs`, or with a filter that has no condition, `rejects` is all False
    (every value is checked as before)."""

    __slots__ = ("_automaton", "_closure", "_filters", "_overlaps", "_unanchored")

    def __init__(self, all_needs: Sequence[Needs | None]) -> None:
        self._automaton: Any = None
        self._closure: tuple[int, ...] = ()
        """Per literal: the mask of the literals every occurrence of it holds (itself, its substrings)."""
        self._overlaps: tuple[tuple[tuple[int, int, bytes], ...], ...] = ()
        """Per literal: `(offset, bit, other)` for each literal `other` that an occurrence of
        it can hide by starting at `offset` inside it and ending after it (`_overlapping`)."""
        self._filters: tuple[tuple[GateAtom, ...], ...] = ()
        self._unanchored: tuple[tuple[GateAtom, ...], ...] = ()
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
            atoms.sort(key=lambda a: (a[0] == 0, a[3], len(a[1]) + a[2]))
            filters.append(tuple(atoms))
        self._filters = tuple(filters)
        self._unanchored = tuple(f for f in filters if not any(a[1] == () and not a[2] and not a[3] for a in f))
        if literals:
            words = sorted(literals, key=literals.__getitem__)
            self._automaton = _ahocorasick.BytesAhoCorasick(words, matchkind=_ahocorasick.MatchKind.LeftmostFirst)
            self._closure = tuple(_inside(word, words) for word in words)
            self._overlaps = tuple(_overlapping(word, words) for word in words)

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
                closure, overlaps = self._closure, self._overlaps
                for word, start, _ in matches:
                    i = bisect_right(starts, start) - 1
                    present = found[i] | closure[word]
                    for at, bit, other in overlaps[word]:  # hidden by this match: is it there?
                        if not present & bit and hay.startswith(other, start + at):
                            present |= bit
                    found[i] = present
        out = []
        every, unanchored = self._filters, self._unanchored
        for data, present in zip(datas, found, strict=True):
            if not data.isascii():
                out.append(False)
                continue
            admitted = False
            for atoms in every if present else unanchored:
                for mask, needles, is_colon, is_digit in atoms:
                    if mask & present:
                        continue
                    if needles and any(n in data for n in needles):
                        continue
                    if is_colon and holds_string_colon(data):
                        continue
                    if is_digit and _DIGIT_BYTE.search(data) is not None:
                        continue
                    break  # this atom is missing: the filter cannot admit
                else:
                    admitted = True
                    break
            out.append(not admitted)
        return out


def holds_string_colon(data: bytes) -> bool:
    """Whether a value's compact orjson bytes `data` may hold a `:` inside a string (a key's
    or a value's), not only the separators after keys.

    In compact orjson output every separator follows the closing `"` of its key. A `:` inside
    a string either follows another character than `"`, or an escaped `"` (`\\":`), or the
    string's opening `"`, which follows `{`, `[`, `,` or `:` or starts the bytes: any of
    these counts as present (a closing `"` after such a character too: only ever more)."""
    at = data.find(b":")
    while at != -1:  # one step per `:` (a value holds few: one per key)
        if at < 2 or data[at - 1] != _QUOTE or data[at - 2] in _BEFORE_OPENING_QUOTE:
            return True
        at = data.find(b":", at + 1)
    return False


def _gate_atom(atom: Atom, literals: dict[bytes, int]) -> GateAtom | None:
    """`(mask of pass literals, one-byte needles, colon, digit)` for one atom (met when any
    is present: a pass literal in the lower-cased bytes, a needle or a digit in the bytes as
    they are, a `:` inside a string (`holds_string_colon`: the bytes always hold the key
    separators)), registering its pass literals; `None` when the atom counts as always met."""
    mask = 0
    needles: list[bytes] = []
    is_colon = False
    is_digit = False
    for kind, literal in atom:
        if kind == "digit":
            is_digit = True
            continue
        if not _is_findable(literal):
            return None
        word = literal.lower().encode()
        if word == b":":  # case-free; the key separators hold it in every value's bytes
            is_colon = True
        elif len(word) == 1:  # as it is, and in the other case when it is matched ignoring case
            needles.append(literal.encode())
            if kind == "ilit":
                needles.extend({literal.lower().encode(), literal.upper().encode()})
        else:
            mask |= 1 << literals.setdefault(word, len(literals))
    return mask, tuple(sorted(set(needles))), is_colon, is_digit


def _is_findable(literal: str) -> bool:
    """Whether a string holding `literal` makes its orjson bytes hold it (class docstring)."""
    return (
        bool(literal)
        and all(" " <= c <= "~" and c not in '"\\' for c in literal)
        and literal.lower() not in _TEXT_TYPE
    )


def _inside(word: bytes, words: Sequence[bytes]) -> int:
    """Mask of the literals every occurrence of `word` holds: itself and its substrings."""
    mask = 0
    for i, other in enumerate(words):
        if other in word:
            mask |= 1 << i
    return mask


def _overlapping(word: bytes, words: Sequence[bytes]) -> tuple[tuple[int, int, bytes], ...]:
    """The occurrences a reported match of `word` can hide, as `(offset, bit, other)`: a
    literal `other` (not inside `word`) starting at `offset` in the match (from 0: a longer
    literal that starts with `word` loses to it when `word` comes first) and ending after it.
    The pass resumes after the match; whether `other` is there is looked up in the bytes."""
    out: list[tuple[int, int, bytes]] = []
    for i, other in enumerate(words):
        if other in word:
            continue
        out.extend((k, 1 << i, other) for k in range(len(word)) if other.startswith(word[k:]))
    return tuple(out)
