"""Deterministic filler content for generated workloads: prose, code, ids and timestamps.

Contract: every function takes a `random.Random` and draws from it only through `random()`,
`randrange()`, `choice()`, `shuffle()` and `getrandbits()`, whose sequences CPython keeps
stable for a given seed, so a seed always yields the same text. No wall clock: timestamps are computed from
`EPOCH` plus trace seconds. Sizes are approximate `o200k_base` token counts (prose ~1.1 tokens
per word, code ~1 token per 3.6 bytes); the simulator's counter gives the exact numbers.
"""

from __future__ import annotations

import random
import re
import string
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Final

EPOCH: Final = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)
"""Trace second 0 of every generated workload."""

_WORDS: Final = (
    "the a an of to in for with on by from into over under after before between and or but "
    "if when while because so then that this these those it its we you they each every any "
    "function method class module package file path directory request response cache prefix "
    "token block system user assistant tool result input output config setting value key "
    "index offset length count buffer stream handler error retry timeout session tenant store "
    "record digest chain marker breakpoint window limit budget queue worker thread process loop "
    "event signal parser decoder encoder schema field type list map set string number boolean "
    "returns reads writes checks updates creates deletes moves keeps drops parses renders sends "
    "waits calls loads saves builds runs tests fails passes logs counts hashes splits joins "
    "small large stable volatile current previous next first last empty full valid invalid "
    "fast slow new old local remote shared private default explicit implicit exact partial"
).split()
_IDENTS: Final = (
    "request body headers session store cache entry prefix tokens blocks digest chain marker "
    "ttl offset limit count index result payload config rules plan stage client upstream "
    "reader writer buffer events usage model tools system messages turn gap clock now"
).split()
_FUNCS: Final = (
    "load parse render count split join merge check apply plan build send read write flush "
    "close open touch lookup commit sweep resolve encode decode hash digest"
).split()
_B62: Final = string.ascii_letters + string.digits


def sentence(rng: random.Random, words: int) -> str:
    """One capitalised sentence of `words` words ending in a full stop."""
    text = " ".join(rng.choice(_WORDS) for _ in range(max(1, words)))
    return text[0].upper() + text[1:] + "."


def prose(rng: random.Random, tokens: int) -> str:
    """Paragraphs of sentences totalling about `tokens` tokens."""
    out: list[str] = []
    paragraph: list[str] = []
    budget = max(1, int(tokens / 1.12))
    while budget > 0:
        n = min(budget, rng.randrange(8, 22))
        paragraph.append(sentence(rng, n))
        budget -= n
        if len(paragraph) >= rng.randrange(3, 7):
            out.append(" ".join(paragraph))
            paragraph = []
    if paragraph:
        out.append(" ".join(paragraph))
    return "\n\n".join(out)


def code(rng: random.Random, tokens: int) -> str:
    """Python-looking source of about `tokens` tokens (for file reads and tool results)."""
    lines: list[str] = []
    budget = float(tokens)
    while budget > 0:
        name = f"{rng.choice(_FUNCS)}_{rng.choice(_IDENTS)}"
        args = ", ".join(rng.choice(_IDENTS) for _ in range(rng.randrange(1, 4)))
        lines.append(f"def {name}({args}):")
        body = rng.randrange(2, 7)
        for _ in range(body):
            target = rng.choice(_IDENTS)
            call = f"{rng.choice(_FUNCS)}({rng.choice(_IDENTS)}, {rng.randrange(0, 4096)})"
            lines.append(f"    {target} = {call}")
        lines.append(f"    return {rng.choice(_IDENTS)}")
        lines.append("")
        budget -= 13 + 9.6 * body
    return "\n".join(lines)


def ident(rng: random.Random, prefix: str, length: int = 24) -> str:
    """A provider-style id such as `toolu_01...` or `call_...` (base62)."""
    return prefix + "".join(rng.choice(_B62) for _ in range(length))


def hex_string(rng: random.Random, length: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(length))


def uuid4(rng: random.Random) -> str:
    """A version-4 UUID drawn from `rng`."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def timestamp(seconds: float) -> str:
    """ISO-8601 UTC timestamp `seconds` after `EPOCH` (e.g. `2026-11-30T09:00:05Z`)."""
    return (EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def shuffled(rng: random.Random, items: list[object]) -> list[object]:
    """A shuffled copy of `items`."""
    out = list(items)
    rng.shuffle(out)
    return out


NOW_PATTERN: Final = re.compile(rb"\xe2\x9f\xa6NOW:(\d+)\xe2\x9f\xa7")
"""`⟦NOW:<born second>⟧` in UTF-8: a timestamp placeholder inside a stored message, replaced at
send time by the send time (a client that re-renders history) or by the second it was born."""


def now_sentinel(born: int) -> str:
    """The placeholder for a timestamp born at trace second `born` (see `NOW_PATTERN`)."""
    return f"\u27e6NOW:{born}\u27e7"


def fill_now(raw: bytes, now: int, rerender: bool) -> bytes:
    """Replace every placeholder in JSON bytes by `timestamp(now)` or by its born time."""
    stamp = timestamp(now).encode()
    return NOW_PATTERN.sub(lambda m: stamp if rerender else timestamp(int(m.group(1))).encode(), raw)


def reordered(value: Any, rng: random.Random) -> Any:
    """`value` with every mapping's keys in a random order (like a Go map's JSON)."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: reordered(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [reordered(v, rng) for v in value]
    return value
