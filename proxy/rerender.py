"""rerender: is a message that changed only in its volatile values the client re-rendering it?

Replay and session inference compare earlier messages by masked digests
(`proxy.pipeline.replay.Masker`): the values inside a volatile rule's span (rules/default.yaml:
date-times, epoch times, usage counters, request ids) are masked, so a client that re-renders
`Current time: ...` in its history every turn still continues its session and has the
earlier bytes replayed. The same equality also held for a person's edit of such a value
(`deploy at 2026-12-03T10:00Z` -> `...12-04...`, `budget remaining: 500` -> `5`) and for two
conversations that differ only there; replay then sent the earlier bytes, undoing the edit
or mixing in the other conversation's message (attack pass, session 13).

What a re-render looks like: each changed value is a moment (a date-time, an epoch time, a
time of day) that moved forward by no more than the time the session has run, give or take
`SKEW_S` (the client renders a little before it sends, and minute-resolution values round).
Nothing else a volatile span holds is re-rendered in an earlier message by the clients we
know: a changed counter, id or amount there is a person's edit.

Pure core:
- `changed_tokens(old, new)`: the whitespace tokens at which two strings of equal masked form
  differ, as `(index, old token span, new token span)`, or `None` when their tokens do not line up.
- `moments(text)`: the moments in `text`, `(start, end, kind, seconds)` each: `instant` (a
  date-time with a zone: epoch seconds), `local` (one without: seconds since 1970-01-01 in its
  own zone), `epoch` (10 or 13 digits) and `clock` (`HH:MM[:SS]`: seconds of the day).
- `is_forward(kind, old, new, elapsed)`: whether a moment moving from `old` to `new` is a
  re-render in a session `elapsed` seconds old.
- `edits(old, new, mask, elapsed)`: for two JSON values (the message as stored, the message
  as the client sends it now) whose masked forms are equal, what in `new` is edited: every
  string of `new` either occurs unchanged in `old` or pairs with a string of `old` of the same
  masked form (`mask`), whose changed tokens are edits unless they are moments moved forward
  (`string_edits`). Strings of `old` with no partner (notes reorder moved onto the message,
  `proxy.pipeline.delivered`) are ignored. `is_rerender`: `edits` finds none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final, Literal

SKEW_S: Final = 300.0
"""Seconds a re-rendered moment may fall behind the one stored, or run ahead of the session's
age (render-to-send delay, minute resolution, clock skew)."""
DAY_S: Final = 86_400.0

MomentKind = Literal["instant", "local", "epoch", "clock"]
Moment = tuple[int, int, MomentKind, float]
"""`(start, end, kind, seconds)` of one moment in a string (`moments`)."""

_TOKEN: Final = re.compile(r"\S+")
_INSTANT: Final = re.compile(
    r"(?<!\d)(\d{4})-(\d{2})-(\d{2})[T ](\d{1,2}):(\d{2})(?::(\d{2})(?:[.,]\d+)?)?"
    r"(?:\s?(Z|UTC|GMT|[+-]\d{2}:?\d{2}))?(?![\d:])"
)
_EPOCH: Final = re.compile(r"(?<!\d)(\d{10}|\d{13})(?!\d)")
_CLOCK: Final = re.compile(r"(?<![\d:])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])")
_NAIVE_EPOCH: Final = datetime(1970, 1, 1)


def changed_tokens(old: str, new: str) -> list[tuple[tuple[int, int], tuple[int, int]]] | None:
    """`(old span, new span)` (character offsets) of each whitespace token that differs between
    `old` and `new`, in order; `None` when the two hold another number of tokens (masking only
    replaces whole tokens, so strings of equal masked form hold as many)."""
    a, b = list(_TOKEN.finditer(old)), list(_TOKEN.finditer(new))
    if len(a) != len(b):
        return None
    return [(x.span(), y.span()) for x, y in zip(a, b, strict=True) if x.group() != y.group()]


def _instant(match: re.Match[str]) -> float | None:
    """Seconds of a date-time match (`moments`: `instant` or `local`); `None` when it is no date."""
    year, month, day, hour, minute, second, zone = match.groups()
    try:
        moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0))
    except ValueError:
        return None
    if zone is None:
        return (moment - _NAIVE_EPOCH).total_seconds()
    if zone in ("Z", "UTC", "GMT"):
        return moment.replace(tzinfo=UTC).timestamp()
    sign = 1 if zone[0] == "+" else -1
    digits = zone[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:])
    if hours > 14 or minutes > 59:
        return None
    offset = timezone(sign * timedelta(hours=hours, minutes=minutes))
    return moment.replace(tzinfo=offset).timestamp()


def moments(text: str) -> list[Moment]:
    """The moments in `text` (module docstring), date-times first, then epoch times, then
    clocks; a clock inside a date-time (or inside something shaped as one that is no date,
    such as February 30th) is not listed."""
    out: list[Moment] = []
    taken: list[tuple[int, int]] = []
    for match in _INSTANT.finditer(text):
        taken.append(match.span())  # also a date that is none: its time is no clock either
        seconds = _instant(match)
        if seconds is not None:
            kind: MomentKind = "local" if match.group(7) is None else "instant"
            out.append((match.start(), match.end(), kind, seconds))
    for match in _EPOCH.finditer(text):
        digits = match.group(1)
        out.append((match.start(), match.end(), "epoch", int(digits) / (1000 if len(digits) == 13 else 1)))
    for match in _CLOCK.finditer(text):
        if any(s <= match.start() < e for s, e in taken):
            continue
        hour, minute, second = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
        if hour < 24 and minute < 60 and second < 60:
            out.append((match.start(), match.end(), "clock", float(hour * 3600 + minute * 60 + second)))
    return out


def is_forward(kind: MomentKind, old: float, new: float, elapsed: float) -> bool:
    """Whether a moment re-rendered from `old` to `new` (seconds, `moments`) fits a session that
    has run `elapsed` seconds: it moved forward by at most `elapsed` (a clock: modulo a day),
    `SKEW_S` either way."""
    if kind == "clock":
        shift = (new - old) % DAY_S
        return shift <= elapsed + SKEW_S or shift >= DAY_S - SKEW_S
    shift = new - old
    return -SKEW_S <= shift <= elapsed + SKEW_S


def _covering(found: list[Moment], span: tuple[int, int]) -> Moment | None:
    """The first moment (in `moments`' kind order) that overlaps `span`."""
    start, end = span
    for moment in found:
        if moment[0] < end and start < moment[1]:
            return moment
    return None


def string_edits(old: str, new: str, elapsed: float) -> tuple[str, ...]:
    """The tokens of `new` that are not `old`'s moments moved forward (`is_forward`), in order;
    `()` when `new` is a re-render of `old`. Both strings are of the same masked form; when
    their tokens do not line up, `new` itself is the edit."""
    changed = changed_tokens(old, new)
    if changed is None:
        return (new,)
    if not changed:
        return ()
    old_moments, new_moments = moments(old), moments(new)
    out: list[str] = []
    for old_span, new_span in changed:
        before, after = _covering(old_moments, old_span), _covering(new_moments, new_span)
        if (
            before is None
            or after is None
            or before[2] != after[2]  # a zone added or dropped too
            or not is_forward(before[2], before[3], after[3], elapsed)
        ):
            out.append(new[new_span[0] : new_span[1]])
    return tuple(out)


def _strings(value: Any) -> Iterator[str]:
    """The string values inside `value` (not its keys), depth first."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def edits(old: Any, new: Any, mask: Callable[[str], str], elapsed: float) -> tuple[str, ...]:
    """What in `new` is edited rather than re-rendered against `old` (module docstring): the
    tokens `string_edits` finds, and the masked form of each string of `new` with no partner
    in `old`; `()` when `new` is a re-render of `old`. `old`: the message as last stored
    (parsed sidecar bytes: what was sent); `new`: the client's message now; `mask(text)`:
    `text` with its volatile values masked, as the digests saw it; `elapsed`: seconds since
    the session's first request (`math.inf` when unknown: any forward move; NaN: nothing is a
    re-render). What is returned names the edit whatever the client re-renders around it, so
    a session told apart by it is found again on its next turn (`proxy.pipeline.replay.with_edits`)."""
    pool: dict[str, int] = {}
    for text in _strings(old):
        pool[text] = pool.get(text, 0) + 1
    unpaired: list[str] = []
    for text in _strings(new):
        count = pool.get(text, 0)
        if count:
            pool[text] = count - 1
        else:
            unpaired.append(text)
    if not unpaired:
        return ()
    by_mask: dict[str, list[str]] = {}
    for text, count in pool.items():
        if count:
            by_mask.setdefault(mask(text), []).extend([text] * count)
    out: list[str] = []
    for text in unpaired:
        masked = mask(text)
        partners = by_mask.get(masked)
        if not partners:
            out.append(masked)
        elif math.isnan(elapsed):
            out.append(masked)
            partners.pop(0)
        else:
            out.extend(string_edits(partners.pop(0), text, elapsed))
    return tuple(out)


def is_rerender(old: Any, new: Any, mask: Callable[[str], str], elapsed: float) -> bool:
    """Whether `new` is a re-render of `old` (`edits` finds nothing)."""
    return not edits(old, new, mask, elapsed)
