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
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Any, Final

try:  # Python 3.11+: the regex parser (stable since 2.x, private name since 3.11)
    from re import _constants as _c
    from re import _parser as _sre
except ImportError:  # pragma: no cover - another interpreter: no prefilter, patterns always run
    _c = _sre = None

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
