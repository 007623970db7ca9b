"""rerender: is a message that changed only in its volatile values the client re-rendering it?

Replay and session inference compare earlier messages by masked digests
(`proxy.pipeline.replay.Masker`): the values inside a volatile rule's span (rules/default.yaml:
date-times, epoch times, usage counters, request ids) are masked, so a client that re-renders
`Current time: ...` in its history every turn still continues its session and has the
earlier bytes replayed. The same equality also held for a person's edit of such a value
(`deploy at 2026-12-03T10:00Z` -> `...12-04...`, `budget remaining: 500` -> `5`) and for two
conversations that differ only there; replay then sent the earlier bytes, undoing the edit
or mixing in the other conversation's message (attack pass, session 13).

What a re-render looks like: the text is the same but for its digits, and each whitespace
token whose digits changed holds a moment that moved forward by no more than the time the
session has run, give or take `SKEW_S` (the client renders a little before it sends, and
minute-resolution values round), with the rest of the token unchanged. A moment is a date
and time (`2026-12-03T10:00:00Z`, `2026-12-03 10:00`), or, after the label the packaged rules
look for, an epoch time (`timestamp: 1796292000`) or a time of day (`Current time: 14:05`,
`1:05 PM`). Nothing else is re-rendered in an earlier message by the clients we know: a
changed counter, id or amount is a person's edit, and so is a digit changed next to a moment
in one token (`2026-12-03T10:00:00Z,user=ALICE,ip=10.0.0.1`: attack pass, session 14).

Pure core:
- `moments(text)`: the moments in `text`, `(start, end, kind, seconds)` each, sorted by start:
  `instant` (a date-time with a zone: epoch seconds), `local` (one without: seconds since
  1970-01-01 in its own zone), `epoch` (10 or 13 digits) and `clock` (seconds of the day).
- `is_forward(kind, old, new, elapsed)`: whether a moment moving from `old` to `new` is a
  re-render in a session `elapsed` seconds old.
- `string_edits(old, new, elapsed)`: the tokens of `new` that are not a re-render of `old`'s.
- `edits(old, new, elapsed)`: the same for two JSON values (the message as stored, the
  message as the client sends it now): each string of `new` occurs unchanged in `old` or
  pairs with a string of `old` equal to it but for its digits (at most `MAX_EDITS` named).
  Strings of `old` with no partner (notes reorder moved onto the message,
  `proxy.pipeline.delivered`) and empty strings of `new` (canonicalise drops empty text
  blocks from what is sent) are ignored. `is_rerender`: `edits` finds none.

Cost: linear in the strings' lengths (C-speed comparisons and splits), plus a window of
tokens around each changed one for the moment patterns (each neighbour cut to
`MAX_CONTEXT_CHARS`; a changed token over `MAX_TOKEN_CHARS` is an edit), for at most
`MAX_CHANGED_PER_STRING` changed tokens per string and `MAX_CHANGED_PER_REQUEST` per request
(`Allowance`); past those a change is taken for an edit without looking. At most `MAX_EDITS`
edits are named.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from itertools import compress
from operator import ne
from typing import Any, Final, Literal

SKEW_S: Final = 300.0
"""Seconds a re-rendered moment may fall behind the one stored, or run ahead of the session's
age (render-to-send delay, minute resolution, clock skew)."""
DAY_S: Final = 86_400.0
MAX_EDITS: Final = 8
"""Edited tokens named per message; the walk stops there (one is enough to tell an edit)."""
MAX_CHANGED_PER_STRING: Final = 32
"""Changed tokens a string may have and still be looked at: a re-render changes a time or
two per message; more is taken for an edit unlooked (named by the string without its digits)."""
MAX_CHANGED_PER_REQUEST: Final = 1024
"""Changed tokens looked at per request (`Allowance`); past it the rest is taken for edits
(a history of 1,024 re-rendered times is replayed whole; past it replay stops at the message
the allowance ran out in). Each costs two windows of `MAX_CONTEXT_CHARS`-bounded tokens
through the moment patterns: 30 us for a plain reminder, about 110 us for windows full of
labelled digits, so a request spends at most about 0.11 s here (a body of 16,000 changed
times held the event loop 20 s before: attack pass, session 14); the rules' own scan budget
(`classify_budget_chars`, 4 MiB at about 6 MB/s) allows more."""
MAX_TOKEN_CHARS: Final = 96
"""A changed token longer than this is taken for an edit unlooked (a re-rendered moment's
token is short: `<current_time>2026-12-03T10:00:00Z</current_time>` is 49 characters)."""
MAX_CONTEXT_CHARS: Final = 64
"""Characters of each neighbouring token a window keeps (the end of one before, the start of
one after): enough for a label or a date, never a whole 16 KB token (attack pass, session 14)."""
WINDOW: Final = 16
"""At most this many tokens before a changed token, and `LOOK_BACK_CHARS` of them, with 3
after, make the window its moments are looked for in: a date before its time, a label before
its epoch or clock (`Current time: Thursday, December 3, 2026 at 10:00:00 AM` has 7 tokens
before its clock: attack pass, session 14)."""
LOOK_BACK_CHARS: Final = 72
"""Characters of tokens before a changed token a window reaches back to (the rules look 40
characters past a 21-character label)."""

MomentKind = Literal["instant", "local", "epoch", "clock"]
Moment = tuple[int, int, MomentKind, float]
"""`(start, end, kind, seconds)` of one moment in a string (`moments`)."""

_INSTANT: Final = re.compile(
    r"(?<!\d)(\d{4})-(\d{2})-(\d{2})[T ](\d{1,2}):(\d{2})(?::(\d{2})(?:[.,]\d{1,9})?)?"
    r"(?:\s?(Z|UTC|GMT|[+-]\d{2}:?\d{2}))?(?![\d:])"
)
_EPOCH: Final = re.compile(r"(?i)\b(?:timestamp|epoch|unix time)\b\D{0,20}?(?<!\d)(\d{10}|\d{13})(?!\d)")
_CLOCK: Final = re.compile(
    r"(?i)\b(?:current|local|system)\s+(?:date\s+and\s+)?time\b[^\n]{0,40}?(?<![\d:])"
    r"(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])(?:\s?([ap])\.?m\b\.?)?"
)
_NAIVE_EPOCH: Final = datetime(1970, 1, 1)
_DIGITS: Final = str.maketrans("", "", "0123456789")


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


def _clock(match: re.Match[str]) -> float | None:
    """Seconds of the day of a labelled time of day (`1:05 PM` is 13:05); `None` when it is none."""
    hour, minute, second = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
    half = match.group(4)
    if half is not None:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half.lower() == "p" else 0)
    if hour > 23 or minute > 59 or second > 59:
        return None
    return float(hour * 3600 + minute * 60 + second)


def moments(text: str) -> list[Moment]:
    """The moments in `text` (module docstring), sorted by start; a labelled clock or epoch
    inside a date-time (or inside something shaped as one that is no date, such as February
    30th) is not listed."""
    out: list[Moment] = []
    taken: list[tuple[int, int]] = []
    for match in _INSTANT.finditer(text):
        taken.append(match.span())
        seconds = _instant(match)
        if seconds is not None:
            kind: MomentKind = "local" if match.group(7) is None else "instant"
            out.append((match.start(), match.end(), kind, seconds))
    for match in _EPOCH.finditer(text):
        digits = match.group(1)
        start, end = match.span(1)
        if not any(s <= start < e for s, e in taken):
            out.append((start, end, "epoch", int(digits) / (1000 if len(digits) == 13 else 1)))
    for match in _CLOCK.finditer(text):
        start, end = match.start(1), match.end()
        clock = _clock(match)
        if clock is not None and not any(s <= start < e for s, e in taken):
            out.append((start, end, "clock", clock))
    out.sort()
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


def _cut(window: str, start: int, end: int, found: list[Moment]) -> tuple[str, list[Moment]]:
    """The token at `window[start:end]` with the moments overlapping it cut out (each leaves a
    NUL), and those moments."""
    over = [m for m in found if m[0] < end and start < m[1]]
    rest, at = [], start
    for m in over:
        rest.append(window[at : max(at, m[0])] + "\x00")
        at = max(at, m[1])
    rest.append(window[at:end])
    return "".join(rest), over


def _token_edit(before: list[str], after: list[str], k: int, elapsed: float) -> str | None:
    """`None` when token `k` of `after` is token `k` of `before` with only its moments moved
    forward (`is_forward`; its moments are looked for in a window of tokens around it), else
    what names the edit: the token with its moments that did move forward cut out, so the
    same edit is named the same while the client re-renders the rest. A token over
    `MAX_TOKEN_CHARS` is an edit, named without its digits; neighbours are cut to
    `MAX_CONTEXT_CHARS`."""
    if len(after[k]) > MAX_TOKEN_CHARS or len(before[k]) > MAX_TOKEN_CHARS:
        return after[k].translate(_DIGITS)
    lo, hi, reach = k, k + 4, 0
    while lo > 0 and k - lo < WINDOW and reach < LOOK_BACK_CHARS:
        lo -= 1
        reach += min(len(after[lo]), MAX_CONTEXT_CHARS) + 1
    old_head = [t[-MAX_CONTEXT_CHARS:] for t in before[lo:k]]
    new_head = [t[-MAX_CONTEXT_CHARS:] for t in after[lo:k]]
    old_window = " ".join([*old_head, before[k], *(t[:MAX_CONTEXT_CHARS] for t in before[k + 1 : hi])])
    new_window = " ".join([*new_head, after[k], *(t[:MAX_CONTEXT_CHARS] for t in after[k + 1 : hi])])
    old_at = sum(len(t) + 1 for t in old_head)
    new_at = sum(len(t) + 1 for t in new_head)
    old_rest, old_moments = _cut(old_window, old_at, old_at + len(before[k]), moments(old_window))
    new_rest, new_moments = _cut(new_window, new_at, new_at + len(after[k]), moments(new_window))
    if old_rest == new_rest and new_moments and len(old_moments) == len(new_moments):
        stuck = [
            new_window[b[0] : b[1]]
            for a, b in zip(old_moments, new_moments, strict=True)
            if a[2] != b[2] or not is_forward(a[2], a[3], b[3], elapsed)
        ]
        if not stuck:
            return None
        return new_rest + "\x00" + "\x00".join(stuck)
    return new_rest + "\x00" + "\x00".join(new_window[b[0] : b[1]] for b in new_moments)


@dataclass(slots=True)
class Allowance:
    """Changed tokens one request may still have looked at (`MAX_CHANGED_PER_REQUEST`)."""

    tokens: int = MAX_CHANGED_PER_REQUEST


def string_edits(
    old: str,
    new: str,
    elapsed: float,
    limit: int = MAX_EDITS,
    allowance: Allowance | None = None,
    same_but_digits: bool = False,
) -> tuple[str, ...]:
    """What names each token of `new` (at most `limit`) that is not `old`'s with only moments
    moved forward (`_token_edit`); `()` when `new` is a re-render of `old`. `new` without its
    digits when the two differ in more than digits, hold another number of tokens, or differ
    in more tokens than `MAX_CHANGED_PER_STRING` or the `allowance` left (which they spend).
    `same_but_digits`: the caller knows the two are equal without their digits."""
    if old == new:
        return ()
    before, after = old.split(), new.split()
    if len(before) != len(after) or (not same_but_digits and old.translate(_DIGITS) != new.translate(_DIGITS)):
        return (new.translate(_DIGITS),)
    changed = list(compress(range(len(after)), map(ne, before, after)))
    left = allowance.tokens if allowance is not None else MAX_CHANGED_PER_REQUEST
    if len(changed) > min(MAX_CHANGED_PER_STRING, left):
        return (new.translate(_DIGITS),)
    if allowance is not None:
        allowance.tokens -= len(changed)
    out: list[str] = []
    for k in changed:
        edit = _token_edit(before, after, k, elapsed)
        if edit is not None:
            out.append(edit)
            if len(out) >= limit:
                break
    return tuple(out)


LOOKAHEAD: Final = 128
"""Strings of the stored message a string of the client's may skip to find its partner (the
notes reorder and the pin stage put before the client's text: at most 64 of each)."""


def _strings(value: Any) -> Iterator[str]:
    """The string values inside `value` (not its keys), depth first, an object's in the order
    of its sorted keys (as the digests see it: a client that reorders keys sends the same)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key in sorted(value):
            yield from _strings(value[key])
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def edits(old: Any, new: Any, elapsed: float, allowance: Allowance | None = None) -> tuple[str, ...]:
    """What in `new` is edited rather than re-rendered against `old` (module docstring): the
    tokens `string_edits` finds, and each string of `new` with no partner in `old`, at most
    `MAX_EDITS`; `()` when `new` is a re-render of `old`. Strings pair in order: each string of
    `new` with the next one of `old`, within `LOOKAHEAD`, that is equal to it or equal but for
    its digits (so values swapped between two places are compared place by place: attack pass,
    session 14). `old`: the message as last stored (parsed sidecar bytes: what was sent);
    `new`: the client's message now; `elapsed`: seconds since the session's first request
    (`math.inf` when unknown: any forward move; NaN: nothing is a re-render); `allowance`: the
    request's (`string_edits`). What is returned names the edit whatever the client re-renders
    around it, so a session told apart by it is found again on its next turn
    (`proxy.pipeline.replay.with_edits`)."""
    olds, news = list(_strings(old)), list(_strings(new))
    if olds == news:
        return ()
    keys: list[str | None] = [None] * len(olds)
    out: list[str] = []
    at = 0
    for text in news:
        if not text:
            continue  # canonicalise drops an empty text block from what is sent
        key = text.translate(_DIGITS)
        found = -1
        for j in range(at, min(len(olds), at + LOOKAHEAD)):
            if olds[j] == text:
                found = j
                break
            known = keys[j]
            if known is None:
                known = keys[j] = olds[j].translate(_DIGITS)
            if known == key:
                found = j
                break
        if found < 0 or math.isnan(elapsed):
            out.append(key)  # digits left out: the same edit re-rendered names the same
        else:
            if olds[found] != text:
                out.extend(string_edits(olds[found], text, elapsed, MAX_EDITS - len(out), allowance, True))
            at = found + 1
        if len(out) >= MAX_EDITS:
            break
    return tuple(out[:MAX_EDITS])


def is_rerender(old: Any, new: Any, elapsed: float) -> bool:
    """Whether `new` is a re-render of `old` (`edits` finds nothing)."""
    return not edits(old, new, elapsed)
