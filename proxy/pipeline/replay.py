"""replay: send earlier messages with the exact value sent before (sidecars).

Pure core:
- `Masker.digest(value)`: xxh3-128 of orjson(value, OPT_SORT_KEYS) after removing cache
  markers (`cache_control`, `prompt_cache_breakpoint`: not part of the provider's cache key),
  writing string content as its one text block (`proxy.prefix.canonical_value`: the string is
  shorthand for that block and renders identically, docs/provider-rules.md 1.5; the same normalisation
  as the prefix chain's block bytes, so inference, replay and divergence agree: a client that
  re-sends a message as a string after a one-block list, or back, sends "the same" message),
  and replacing by `MASK` the text the rules' volatile patterns match inside string values,
  each match extended to the end of its token (`span_pattern`). Only the values inside that
  span (tokens holding a digit, hex tokens) are masked, never its words nor the rest of its line: an
  edit next to a timestamp, or of a word a pattern spans, is still an edit. Sorted keys make a client
  that reorders JSON keys (Go/Swift maps) send "the same" message; masking makes a client
  that re-renders a timestamp send "the same" message.
- `view_messages(...)`: per request, the masked digest of each element of the message array
  (`messages` or `input`: whichever array the adapter's `prefix_blocks` point into), the head
  digest (top-level system, system-section messages and the tool SET: the tool digests sorted,
  schema keys sorted as in every digest here, so a client that shuffles its tools or their
  schema keys every turn still continues its session) and the identity boundaries
  `c_k = xxh3(c_{k-1} || d_k)` with `c_{-1}` the head (session inference, `proxy.session_identity`).
  Computed once, by the `session` stage, on the client's body. It keeps the xxh3-128 of each
  element's marker-free orjson bytes (`keys`), which `splice` and the session record compare
  with a sidecar's (`Sidecar.sent_digest`) for an element that is still the same object (bodies
  are copy-on-write) instead of dumping it again.
- Cost per request: one unsorted `orjson.dumps` per element. The sorted dump and the masking
  run only for an element not seen recently (`Masker` memo keyed by the xxh3 of its stripped
  bytes: a content key, never an object identity).
- `first_mismatch(...)`: the first earlier message whose digest differs from its stored
  sidecar: the client rewrote history there (`Exchange.history_rewritten`).
- `first_volatile_edit(...)`: the first message that masks equal to its sidecar but is not a
  re-render of it (`proxy.rerender`: a person's edit of a date-time, counter or id);
  `with_edits(...)` makes it compare as changed (replay stops there, inference diverges
  there) while the session record keeps its masked digest (`MessageView.recorded`).
- `tail_rewritten(...)`: the previous request's newest message is the first one changed (the
  breakpoint planner's wasted-tail count, `SessionRecord.tail_misses`).
- `splice(...)`: earlier messages (never the newest) whose digest matches their sidecar, up to
  the first mismatch, are replaced by the stored value (parsed with orjson, so key order and
  content are exactly what was sent before: also the form, a string or a one-block list, the
  provider cached); a message whose bytes already equal the stored value is left as is.
  Copy-on-write: returns a new list, never edits the input.

Spliced values are parsed stored bytes, not `orjson.Fragment`s, so the breakpoints stage can
still place markers on replayed messages (a Fragment is opaque).

Stage (`STAGE`, after `reorder`, before `breakpoints`): applies `splice` to `exchange.body`
using `Exchange.previous` (a `SessionRecord`) and `Exchange.message_view` (both from the
session stage), counts `promptcache_replayed_messages_total{provider}`, sets
`Exchange.replayed` (count), `Exchange.replayed_bytes` (position -> `(value, stored bytes)`
of each replayed message, for the session record) and `Exchange.replace_body` when anything changed.
Positions are the client's: when reorder dropped leading system-section messages
(`Exchange.head_dropped`) the sent array is lined up with the client's first (`aligned_items`);
replay skips itself when an earlier stage changed the number of messages otherwise (positions
would not line up).
"""

from __future__ import annotations

import re
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import compress, count, repeat
from operator import attrgetter, is_, not_
from typing import Any, Final

import orjson
import xxhash

from proxy.exchange import Exchange
from proxy.frozen import fast_init
from proxy.malformed import skipped
from proxy.nulls import NullAbsent, has_nulls, without_nulls
from proxy.pipeline import rawprefix
from proxy.pipeline.prefilter import LiteralGate, Needs, ScannedText, needs
from proxy.prefix import MARKER_KEYS, canonical_value, may_hold_marker
from proxy.providers.base import JSONObject, ProviderAdapter, Run
from proxy.rerender import Allowance, edits
from proxy.rules import LINE_SCAN_COST, MAX_RULE_LINE_CHARS, Budget, is_value_token
from proxy.services import Services
from proxy.store.codec import Sidecar

MASK: Final = "\x00volatile\x00"
"""What a volatile span becomes before digesting (never sent anywhere)."""
MEMO_SIZE: Final = 16_384
_GLOBAL_FLAGS: Final = re.compile(r"^\(\?[aiLmsux]+\)")

Patterns = Sequence[re.Pattern[str]]


def has_markers(message: Any) -> bool:
    """Whether `strip_markers(message)` would remove anything (same levels it looks at)."""
    if not isinstance(message, dict):
        return False
    if "cache_control" in message or "prompt_cache_breakpoint" in message:
        return True
    content = message.get("content")
    if not isinstance(content, list):
        return False
    for part in content:
        if not isinstance(part, dict):
            continue
        if "cache_control" in part or "prompt_cache_breakpoint" in part:
            return True
        nested = part.get("content")
        if isinstance(nested, list):
            for p in nested:
                if isinstance(p, dict) and ("cache_control" in p or "prompt_cache_breakpoint" in p):
                    return True
    return False


MARKER_WALK_PARTS: Final = 8
"""A message of at most this many content parts is looked at key by key for markers
(`has_markers_in`: a few dict lookups); one of more has its bytes searched first."""


def has_markers_in(message: Any, data: bytes) -> bool:
    """`has_markers(message)`, given `data` (the compact orjson bytes of `message`): the same
    answer as `may_hold_marker(data) and has_markers(message)`, since a marker key is written
    quoted into the bytes. A message of at most `MARKER_WALK_PARTS` content parts (the usual
    one or two) is looked at key by key, which costs less than searching its bytes twice
    (about 0.7 us for 1.4 KB, `bytes.__contains__`); a longer one has its bytes searched
    first (C speed, whatever the number of parts)."""
    if type(message) is not dict:
        return has_markers(message)
    content = message.get("content")
    if type(content) is list and len(content) > MARKER_WALK_PARTS and not may_hold_marker(data):
        return False
    return has_markers(message)


def head_form(value: Any, system_text: Callable[[str], str]) -> Any:
    """`value` with `system_text` applied to its text: a string, a block's `text`, a message's
    string `content` or its parts' `text` (copy-on-write). Session identity digests a system
    prompt in this form, so a note that changes every turn (a todo list under a timestamped
    heading: a volatile segment, moved onto the newest user message by reorder) does not make
    each request look like a new conversation."""
    if isinstance(value, str):
        return system_text(value)
    if not isinstance(value, dict):
        return value
    out = dict(value)
    text = value.get("text")
    if isinstance(text, str):
        out["text"] = system_text(text)
    content = value.get("content")
    if isinstance(content, str | list):
        out["content"] = (
            system_text(content) if isinstance(content, str) else [head_form(part, system_text) for part in content]
        )
    return out


def compact(data: bytes) -> bytes:
    """A copy of `data` in an allocation of its own size, for bytes kept past the request:
    orjson returns a small output in a buffer of several KB (about 8 KB for 700 bytes, orjson
    3.13), so keeping hundreds of them (sidecars) costs ten times their size."""
    return bytes(memoryview(data))


def stripped_bytes(message: Any) -> bytes:
    """`orjson.dumps(strip_markers(message))` (what a sidecar stores), copying nothing when
    there is no marker."""
    return orjson.dumps(strip_markers(message) if has_markers(message) else message)


def strip_markers(message: Any) -> Any:
    """`message` without marker keys on itself, its content parts and their nested `content`
    parts (a `tool_result`'s); copy-on-write: unchanged parts are the same objects."""
    if not isinstance(message, dict):
        return message
    out = {k: v for k, v in message.items() if k not in MARKER_KEYS}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [_strip_part(part) for part in content]
    return out


def _strip_part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    if not MARKER_KEYS.isdisjoint(part.keys()):
        part = {k: v for k, v in part.items() if k not in MARKER_KEYS}
    nested = part.get("content")
    if isinstance(nested, list) and any(isinstance(p, dict) and not MARKER_KEYS.isdisjoint(p) for p in nested):
        part = {
            **part,
            "content": [
                {k: v for k, v in p.items() if k not in MARKER_KEYS} if isinstance(p, dict) else p for p in nested
            ],
        }
    return part


def span_pattern(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """`pattern` extended to the end of the token it ends in (`(?:pattern)\\S*`). It is run on
    one line at a time (`sub_lines`), as the rules match, so `^` / `$` anchor at line starts
    and ends and no quantifier crosses a newline (time linear in the text for the patterns
    `proxy.regexcheck` admits).

    The extension takes a timestamp's seconds and zone along (`2026-11-29T20:09` + `:13Z`) and
    never reaches past the next whitespace.
    """
    source = _GLOBAL_FLAGS.sub("", pattern.pattern, count=1)
    return re.compile(rf"(?:{source})\S*", pattern.flags & ~re.MULTILINE)


_TOKEN: Final = re.compile(r"\S+")


def _mask_token(token: re.Match[str]) -> str:
    """`MASK` for a value: a whitespace-delimited token holding a digit (`2026-11-29T20:09:13Z`,
    `1,046`, `(0.5%)`, `$1.25`), or a hex token of 4+ (an id without a digit)."""
    text = token.group()
    if is_value_token(text):
        return MASK
    return text


def _mask_values(match: re.Match[str]) -> str:
    """The match with only its values replaced by `MASK` (`_mask_token`), one mask per token,
    so a value that grows a digit group (`546` -> `1,046`) still masks the same. Tokens without
    a digit stay, so a rule whose pattern also spans a few words (`Budget remaining\\D{0,20}\\d+`)
    can never hide an edit of those words (`marketing` -> `engineering` is a rewrite). Linear
    in the match."""
    return _TOKEN.sub(_mask_token, match.group())


def sub_lines(pattern: re.Pattern[str], text: str) -> str:
    """`text` with the values (`_mask_values`) of each match of `pattern` in each of its
    `\\n`-separated lines replaced by `MASK` (a match never spans two lines); a line longer than
    `MAX_RULE_LINE_CHARS` is kept as it is."""
    if "\n" not in text:
        return text if len(text) > MAX_RULE_LINE_CHARS else pattern.sub(_mask_values, text)
    return "\n".join(
        [line if len(line) > MAX_RULE_LINE_CHARS else pattern.sub(_mask_values, line) for line in text.split("\n")]
    )


def mask_strings(value: Any, spans: Patterns) -> Any:
    """`value` with every match of `spans` inside its string values replaced by `MASK`; keys
    and non-strings are kept."""
    return mask_filtered(value, tuple((pattern, None) for pattern in spans))


def mask_filtered(
    value: Any, filters: Sequence[tuple[re.Pattern[str], Needs | None]], budget: Budget | None = None
) -> Any:
    """`mask_strings` with each pattern run only on the strings its `Needs` admits (a string it
    does not admit cannot hold a match: `proxy.pipeline.prefilter`), in pattern order, each on
    the text the earlier ones left, one line at a time (`sub_lines`); with a `budget`, each
    string costs `LINE_SCAN_COST` to look at (the prefilter's work: a body of 100,000 tiny
    blocks held the loop for seconds) and a pattern runs only while the budget covers the
    text's length; once spent, the rest of `value` is returned as it is, unwalked.

    Nothing masked, `value` itself is returned (no copy); else a copy holding the masked
    strings (the containers on their way copied, the rest shared): `value` is never edited."""
    if budget is not None and budget.is_spent:
        return value
    if isinstance(value, str):
        if budget is not None and not budget.take(LINE_SCAN_COST):
            return value
        scanned = ScannedText(value) if value.isascii() else None
        for pattern, need in filters:
            if need is not None and scanned is not None and not need.admits_ascii(scanned):
                continue
            if budget is not None and not budget.take(len(value)):
                return value
            masked = sub_lines(pattern, value)
            if masked != value:
                value = masked
                scanned = ScannedText(value) if value.isascii() else None
        return value
    if isinstance(value, dict):
        out: dict[Any, Any] | None = None
        for k, v in value.items():
            new = mask_filtered(v, filters, budget)
            if new is not v:
                if out is None:
                    out = dict(value)
                out[k] = new
        return value if out is None else out
    if isinstance(value, list):
        changed: list[Any] | None = None
        for i, v in enumerate(value):
            new = mask_filtered(v, filters, budget)
            if new is not v:
                if changed is None:
                    changed = list(value)
                changed[i] = new
        return value if changed is None else changed
    return value


def _strings_of(value: Any, out: list[str]) -> None:
    """Append the string values inside `value` (not its keys) to `out`, in `mask_filtered`'s order."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, dict | list):
                _strings_of(v, out)
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, dict | list):
                _strings_of(v, out)


def _count_strings(value: Any) -> int:
    """How many strings `_strings_of(value, out)` appends (exact types tested first: the
    values of a parsed body)."""
    kind = type(value)
    if kind is str:
        return 1
    if kind is dict:
        items: Any = value.values()
    elif kind is list:
        items = value
    else:
        return _count_any(value)
    count = 0
    for v in items:
        kind = type(v)
        if kind is str:
            count += 1
        elif kind is dict or kind is list:
            count += _count_strings(v)
        elif isinstance(v, str | dict | list):
            count += _count_any(v)
    return count


def _count_any(value: Any) -> int:
    """`_count_strings` for any type (subclasses of `str`, `dict`, `list` included)."""
    if isinstance(value, str):
        return 1
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, list):
        return 0
    count = 0
    for v in value:
        if isinstance(v, str):
            count += 1
        elif isinstance(v, dict | list):
            count += _count_any(v)
    return count


def _charge_looks(budget: Budget, strings: int) -> None:
    """Charge `LINE_SCAN_COST` for each of `strings` strings looked at, stopping at the first
    the budget does not cover (as `mask_filtered`'s walk does when no pattern runs)."""
    if budget.is_spent:
        return
    affordable = budget.left // LINE_SCAN_COST
    if strings <= affordable:
        budget.left -= strings * LINE_SCAN_COST
    else:
        budget.take(LINE_SCAN_COST * (affordable + 1))  # sets `is_spent`
        budget.left -= affordable * LINE_SCAN_COST


def may_mask(filters: Sequence[tuple[re.Pattern[str], Needs | None]], strings: Sequence[str]) -> bool:
    """False only when `mask_filtered` with `filters` changes none of `strings` (a value's string
    values): no filter's `Needs` admit the strings joined by newlines, checked once for the
    whole value instead of per string and pattern. Sound: a literal a string holds, the joined
    text holds, a digit too (a literal spanning two joined strings only admits more); and while
    no pattern changes a string, each later one sees the original text. Non-ASCII text, or a
    filter without conditions, may mask."""
    if not strings:
        return False
    joined = "\n".join(strings)
    if not joined.isascii():
        return True
    scanned = ScannedText(joined)
    return any(need is None or need.admits_ascii(scanned) for _, need in filters)


class Masker:
    """Masked canonical digests (16 bytes) of messages and blocks: markers removed, string
    content as its text block (`canonical_value`), text that a volatile pattern matches
    masked, keys sorted.

    Memoised by the digest of the exact (unmasked, sorted) bytes, at most `memo_size` entries
    (LRU), and seeded from stored sidecars (`seed`): each turn only new or edited messages are
    walked, also after a restart or on another replica (the packaged rules scan about 6 MB/s
    with Python's `re`; `proxy.pipeline.prefilter` skips a pattern on strings that cannot
    hold a match of it). A second memo (also LRU, `memo_size`) maps the xxh3-128 of a value's
    marker-free, unsorted orjson bytes to its exact digest, so a value seen recently costs one
    unsorted dump and no sorted one. The memos map digests to digests and hold no content.
    """

    def __init__(
        self,
        patterns: Patterns = (),
        memo_size: int = MEMO_SIZE,
        system_text: Callable[[str, Budget | None], str] | None = None,
        max_parsed_bytes: int = rawprefix.MAX_PARSED_BYTES,
    ) -> None:
        """`max_parsed_bytes`: raw bytes of the newest bodies `raw_index` keeps parsed
        (`proxy.memory_budget.MemoryBudget.parsed_bytes`)."""
        self.spans = tuple(span_pattern(p) for p in patterns)
        self.system_text = system_text
        """System-prompt text as identity sees it (`head_form`), given the request's segment
        budget: the session stage passes the text without its volatile segments
        (`segments.without_volatile`); `None` keeps it whole."""
        self.segment_budget: Budget | None = None
        """The current request's segment classification budget (`Exchange.scan_budget`, set
        by the session stage around `view_messages`); `None`: unlimited."""
        self.filters = tuple((span, needs(span)) for span in self.spans)
        self.gate = LiteralGate([need for _, need in self.filters])
        """All filters' literals looked for in one pass over the values a request masks."""
        self.memo_size = memo_size
        self.budget: Budget | None = None
        """The current request's scan budget (`begin`); `None`: unlimited."""
        self._memo: OrderedDict[bytes, bytes] = OrderedDict()
        self._exact: OrderedDict[bytes, bytes] = OrderedDict()
        self.raw_index = rawprefix.RawPrefixIndex(max_parsed_bytes=max_parsed_bytes)
        """Recent raw bodies' element results (`view_messages` with `raw`): digests, no content."""

    def digests(self, value: Any) -> tuple[bytes, bytes]:
        """`(exact, masked)` digests of `value` (16 bytes each; equal without patterns)."""
        exact, masked, _ = self.examine(value)
        return exact, masked

    def examine(self, value: Any) -> tuple[bytes, bytes, bytes]:
        """`(exact, masked, key)`: the digests of `value` and the xxh3-128 of
        `stripped_bytes(value)`."""
        exact, masked, keys = self.examine_all((value,))
        return exact[0], masked[0], keys[0]

    def examine_all(
        self,
        values: Sequence[Any],
        optional: Mapping[str, frozenset[str]] | None = None,
        known: tuple[Sequence[bytes], Sequence[bytes], Sequence[bytes]] | None = None,
        dumped: list[bytes] | None = None,
        stripped_out: list[bytes | None] | None = None,
        nulls: NullAbsent | None = None,
    ) -> tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...]]:
        """`examine` of each of `values`, as three tuples (exact, masked, key); one loop,
        since a long conversation has hundreds of messages. `optional` (role -> keys:
        `ProviderAdapter.identity_optional`) leaves those keys of a message of that role out
        of its masked digest only: a message re-sent without them is "the same" message.
        `known`: the three results of the first `len(known[0])` values, computed before on
        the same bytes (`proxy.pipeline.rawprefix`); those values are not walked. `dumped`
        gets the compact orjson bytes of each value walked, markers included; `stripped_out`
        gets `compact(stripped_bytes(value))` of each value walked (the bytes its key digests:
        what its sidecar stores, so the record builder does not serialise it again). `nulls`
        (`ProviderAdapter.identity_nulls`) leaves the null-valued keys of a message and of its
        blocks out of its masked digest too (`proxy.nulls`: the API reads them as absent); its
        exact digest and key stay those of its bytes."""
        dumps, digest, sort_keys = orjson.dumps, xxhash.xxh3_128_digest, orjson.OPT_SORT_KEYS
        exact_memo, masked_memo, size, spans = self._exact, self._memo, self.memo_size, self.spans
        exacts: list[bytes] = []
        maskeds: list[bytes] = []
        keys: list[bytes] = []
        if known is not None and known[0]:
            exacts.extend(known[0])
            maskeds.extend(known[1])
            keys.extend(known[2])
            values = values[len(known[0]) :]
        # masked digests are worked out after the loop, in order (the budget is charged in
        # element order), with one `LiteralGate` pass over the bytes of the values to mask
        pending: list[tuple[int, bytes, Any, bytes | None]] = []
        for value in values:
            data = dumps(value)
            if dumped is not None:
                dumped.append(data)
            # a quoted marker name in the bytes first (C speed): most messages hold none
            if has_markers_in(value, data):
                stripped = strip_markers(value)
                data = dumps(stripped)
            else:
                stripped = value
            if stripped_out is not None:
                stripped_out.append(bytes(memoryview(data)))  # `compact`
            key = digest(data)
            exact = exact_memo.get(key)
            if exact is None:
                exact = exact_memo[key] = digest(dumps(canonical_value(stripped), option=sort_keys))
                if len(exact_memo) > size:
                    exact_memo.popitem(last=False)
            else:
                exact_memo.move_to_end(key)
            exacts.append(exact)
            keys.append(key)
            left_out: bytes = b""
            """Which projection the masked digest is of: `o` identity-optional keys, `n` nulls."""
            drop = None
            if optional and type(stripped) is dict:
                role = stripped.get("role")
                if type(role) is str or role is None:
                    dropped = optional.get(role)  # type: ignore[arg-type]
                else:  # a non-string role: no identity-optional fields (proxy.malformed)
                    skipped("role")
                    dropped = None
                if dropped and not dropped.isdisjoint(stripped):
                    drop, left_out = dropped, b"o"
            if nulls is not None and has_nulls(stripped, nulls):
                left_out += b"n"
            if left_out:  # projected in `_projected`, only when its memo does not know it
                parts = (stripped, drop, nulls if left_out[-1:] == b"n" else None)
                pending.append((len(maskeds), exact + left_out, parts, None))
                maskeds.append(exact)  # placeholder
                continue
            if not spans:
                maskeds.append(exact)
                continue
            pending.append((len(maskeds), exact, stripped, data))
            maskeds.append(exact)  # placeholder
        if pending:
            gate = self.gate
            gated = [(p[0], p[3]) for p in pending if p[3] is not None and p[1] not in masked_memo]
            rejected: set[int] = set()
            if gated and gate.is_active:
                verdicts = gate.rejects([bytes_ for _, bytes_ in gated])
                rejected = {position for (position, _), no in zip(gated, verdicts, strict=True) if no}
            for position, of, value, bytes_or_none in pending:
                if bytes_or_none is None:  # a projection (identity-optional keys, nulls left out)
                    maskeds[position] = self._projected(of, value)
                    continue
                known_mask = masked_memo.get(of)
                if known_mask is None:
                    known_mask = self._masked(of, value, is_rejected=position in rejected)
                else:
                    masked_memo.move_to_end(of)
                maskeds[position] = known_mask
        return tuple(exacts), tuple(maskeds), tuple(keys)

    def _projected(self, of: bytes, parts: tuple[JSONObject, frozenset[str] | None, NullAbsent | None]) -> bytes:
        """The masked digest of message `parts[0]` without the keys `parts[1]` (identity-optional)
        and, with `parts[2]`, without the nulls that rule leaves out (`proxy.nulls`): what the
        message without them digests to, memoised under a key derived from `of` (its exact digest
        and which of the two were left out, so adapters with other rules never share an entry);
        the projection is made only when the memo does not know it."""
        key = xxhash.xxh3_128_digest(of + b"\x00projected")
        masked = self._memo.get(key)
        if masked is not None:
            self._memo.move_to_end(key)
            return masked
        projection = _projection(*parts)
        if self.spans:
            return self._masked(key, projection, is_exact_digest=False)
        masked = xxhash.xxh3_128_digest(orjson.dumps(projection, option=orjson.OPT_SORT_KEYS))
        self._remember(key, masked)
        return masked

    def begin(self, chars: int | None) -> Budget | None:
        """Start a request: the rules may scan `chars` characters for it (`None`: no limit)."""
        self.budget = Budget(chars) if chars is not None else None
        return self.budget

    def _masked(self, exact: bytes, stripped: Any, is_exact_digest: bool = True, is_rejected: bool = False) -> bytes:
        """The masked digest of `stripped`; `exact` is its memo key, and (`is_exact_digest`)
        the digest of its own canonical bytes: when no pattern changes a string, the masked
        bytes are those very bytes, so the masked digest is `exact` (no second sorted dump).
        `is_rejected`: the `LiteralGate` found that no filter admits its strings (`may_mask`
        would say False): only the budget is charged for looking at them."""
        masked = self._memo.get(exact)
        if masked is not None:
            self._memo.move_to_end(exact)
            return masked
        budget = self.budget
        canonical = canonical_value(stripped)
        if is_rejected:  # nothing can change (`LiteralGate`): charge what looking costs
            value = canonical
            if budget is not None:
                _charge_looks(budget, _count_strings(canonical))
        else:
            strings: list[str] = []
            _strings_of(canonical, strings)
            if may_mask(self.filters, strings):
                value = mask_filtered(canonical, self.filters, budget)
            else:  # nothing can change: charge what `mask_filtered` charges for looking at each string
                value = canonical
                if budget is not None:
                    _charge_looks(budget, len(strings))
        if value is canonical and is_exact_digest:
            masked = exact
        else:
            masked = xxhash.xxh3_128_digest(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
        if budget is None or not budget.is_spent:
            self._remember(exact, masked)  # a partly masked digest is never remembered
        return masked

    def digest(self, value: Any) -> bytes:
        """The masked digest of `value`."""
        return self.digests(value)[1]

    def head_digest(self, value: Any) -> bytes:
        """The masked digest of a system-prompt value (a string, a block, a system message) in
        its `head_form`: what is left of it for session identity."""
        system_text, budget = self.system_text, self.segment_budget
        if system_text is None:
            return self.digest(value)
        return self.digest(head_form(value, lambda text: system_text(text, budget)))

    def seed(self, sidecars: Sequence[Sidecar]) -> None:
        """Remember the `(exact, masked)` pairs of stored sidecars (computed when they were sent).
        A pair describes one exact message, so it is valid for any session holding it."""
        if not self.spans:
            return
        for sidecar in sidecars:
            if sidecar.exact and sidecar.exact not in self._memo:
                self._remember(sidecar.exact, sidecar.digest)

    def _remember(self, exact: bytes, masked: bytes) -> None:
        self._memo[exact] = masked
        if len(self._memo) > self.memo_size:
            self._memo.popitem(last=False)


@fast_init
@dataclass(frozen=True, slots=True)
class MessageView:
    """Masked digests of one request as the client sent it."""

    array_key: str | None
    """Body key of the message array (`messages`, `input`), `None` without messages."""
    head: bytes
    """Digest of the tool set (order-insensitive), top-level system and system-section messages
    (16 bytes)."""
    digests: tuple[bytes, ...]
    """Masked digest per element of the message array (one for a string `input`)."""
    exact: tuple[bytes, ...]
    """Unmasked digest per element (stored with sidecars to seed `Masker`)."""
    system_positions: frozenset[int]
    """Array positions in the system section (OpenAI leading system/developer messages)."""
    boundaries: tuple[bytes, ...]
    """Identity chain digest after each element (see module docstring)."""
    is_list: bool = True
    """False when the array is a single string (`input: "..."`): nothing to replay."""
    items: Sequence[Any] = ()
    """The elements digested (the client's objects, for identity checks within this request)."""
    keys: tuple[bytes, ...] = ()
    """xxh3-128 of `stripped_bytes` of each element (what its sidecar's `value` is when it is
    sent as is)."""
    is_budget_spent: bool = False
    """The rules' scan budget ran out: some text was digested unmasked (`Budget`)."""
    stripped: tuple[bytes | None, ...] = ()
    """`compact(stripped_bytes(element))` of each element this view serialised (`None` for the
    leading elements it knew from a recent body's results: their sidecars are the record's;
    and for the trailing ones a kept body's record has sidecars for at the same positions,
    `rawprefix.Kept.sidecars`), so the record builder stores a sidecar without serialising
    its element again."""
    masked: tuple[bytes, ...] | None = None
    """The masked digests when `digests` marks a volatile edit (`with_edits`): what the
    session record keeps, so the edited message is the same message on the next turn."""

    @property
    def recorded(self) -> tuple[bytes, ...]:
        """The masked digest per element, as the session record keeps them."""
        return self.digests if self.masked is None else self.masked

    def key_of(self, position: int, value: Any) -> bytes | None:
        """The xxh3-128 of `stripped_bytes(value)` when `value` is the element digested at
        `position` (the same object), else `None`."""
        if position < len(self.keys) and self.items[position] is value:
            return self.keys[position]
        return None


def view_messages(
    adapter: ProviderAdapter,
    body: JSONObject,
    masker: Masker,
    runs: Sequence[Run] | None = None,
    budget_chars: int | None = None,
    segment_budget: Budget | None = None,
    raw: RawBody | None = None,
) -> MessageView:
    """Compute the `MessageView` of `body` (the client's parsed request); `runs` is
    `adapter.layout(body)` when the caller has it. Classifying the system prompt for its
    identity form costs `segment_budget` (the request's, shared with reorder: a line is paid for
    once). The rules scan at most `budget_chars`
    characters for it (`Budget`; `MessageView.is_budget_spent` says when that cut masking short).
    With `raw` (`body` is exactly `orjson.loads(raw.data)`), the leading elements whose bytes a
    recent request of `raw.scope` held too are not walked again (`Masker.raw_index`,
    `proxy.pipeline.rawprefix`); the view is the same either way."""
    budget = masker.begin(budget_chars)
    masker.segment_budget = segment_budget
    try:
        view = _view_messages(adapter, body, masker, runs, raw)
    finally:
        masker.budget = masker.segment_budget = None
    if budget is not None and budget.is_spent:
        view = replace(view, is_budget_spent=True)
    return view


def _view_messages(
    adapter: ProviderAdapter,
    body: JSONObject,
    masker: Masker,
    runs: Sequence[Run] | None,
    raw: RawBody | None = None,
) -> MessageView:
    head = xxhash.xxh3_128()
    array_key: str | None = None
    system_positions: set[int] = set()
    tools: list[bytes] = []
    for run in adapter.layout(body) if runs is None else runs:
        if run.message is None:
            for value in run.value if run.is_list else (run.value,):
                if run.section == "tools":
                    tools.append(masker.digest(value))
                else:
                    head.update(run.section.encode() + b"\x00" + masker.head_digest(value))
            continue
        if array_key is None:
            first = run.key[0]
            array_key = first if isinstance(first, str) else str(first)
        if run.section == "system":
            system_positions.add(run.message)
    items = body.get(array_key) if array_key is not None else None
    is_list = isinstance(items, list)
    elements: list[Any] = items if isinstance(items, list) else ([] if items is None else [items])
    optional = adapter.identity_optional
    nulls = adapter.identity_nulls
    stripped: list[bytes | None] = []
    reused, match = 0, None
    if raw is not None and is_list and array_key is not None and elements and len(raw.data) >= rawprefix.MIN_BYTES:
        exact, digests, keys, reused, match = _examine_known(
            masker, raw, array_key, elements, optional, stripped, nulls
        )
    else:
        exact, digests, keys = masker.examine_all(elements, optional, stripped_out=stripped, nulls=nulls)
    if system_positions and masker.system_text is not None:
        listed = list(digests)
        for position in system_positions:
            listed[position] = masker.head_digest(elements[position])
        digests = tuple(listed)
    for position in sorted(system_positions):
        head.update(b"system-message\x00" + digests[position])
    for digest in sorted(tools):  # the tool set, not its order: a client that shuffles its tools
        head.update(b"tools\x00" + digest)
    head_digest = head.digest()
    boundaries: list[bytes] = []
    previous = head_digest
    kept = match.kept if match is not None and not system_positions else None
    if reused and kept is not None and kept.boundaries is not None and kept.boundaries[0] == head_digest:
        # the chain over the same head and the same leading digests (`rawprefix`): the recent body's
        boundaries = list(kept.boundaries[1][:reused])
        previous = boundaries[-1] if boundaries else head_digest
    for digest in digests[len(boundaries) :] if boundaries else digests:
        previous = xxhash.xxh3_128_digest(previous + digest)
        boundaries.append(previous)
    fresh = match.fresh if match is not None and not system_positions else None
    if fresh is not None:
        fresh.boundaries = (head_digest, tuple(boundaries[: len(fresh.elements)]))
    return MessageView(
        array_key,
        head_digest,
        digests,
        exact,
        frozenset(system_positions),
        tuple(boundaries),
        is_list,
        tuple(elements),
        keys,
        stripped=(None,) * (len(elements) - len(stripped)) + tuple(stripped) if is_list else (),
    )


@fast_init
@dataclass(frozen=True, slots=True)
class RawBody:
    """The client's raw body for `view_messages`' byte-prefix reuse."""

    data: bytes
    """The bytes the parsed body was read from, exactly."""
    scope: str
    """Whose recent requests it may be compared with (the session stage: tenant and path)."""
    match: rawprefix.RawMatch | None = None
    """`data` against the index, when the pipeline made the comparison already (before parsing:
    `proxy.pipeline.session.raw_match`); used when it was made on this masker's index."""


def _examine_known(
    masker: Masker,
    raw: RawBody,
    array_key: str,
    elements: list[Any],
    optional: Mapping[str, frozenset[str]] | None,
    stripped: list[bytes | None],
    nulls: NullAbsent | None = None,
) -> tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...], int, rawprefix.RawMatch | None]:
    """`masker.examine_all(elements, optional, stripped_out=stripped, nulls=nulls)`, reusing the
    results of the leading elements a recent body of the scope held byte for byte (`rawprefix`),
    and leaving this body's state for the next request; also how many leading elements were
    reused and the match used."""
    data = raw.data
    index = masker.raw_index
    match = raw.match
    if match is None or match.index is not index or match.scope != raw.scope:
        match = rawprefix.match_raw(index, raw.scope, data)
        if match is None:
            return (*masker.examine_all(elements, optional, stripped_out=stripped, nulls=nulls), 0, None)
    chunks, state, shared = match.digests, match.state, match.shared
    # the parse found its sentinel in the body's array (`rawprefix.parse_tail`): no escaped duplicate
    proven = match.head is not None
    k = min(rawprefix.reusable(state, shared, data, array_key, proven), len(elements)) if state is not None else 0
    known = None
    clean: bytes | None = b""
    """Per element so far, 1 when its compact bytes are its stripped bytes (no marker:
    `CLEAN_COLUMN`); `None` once one is not known."""
    if state is not None and k:
        exact_known, masked_known, keys_known = state.columns[:CLEAN_COLUMN]
        known = (exact_known[:k], masked_known[:k], keys_known[:k])
        clean = bytes(state.columns[CLEAN_COLUMN][:k]) if len(state.columns) > CLEAN_COLUMN else None
    suffix, walked = _reused_suffix(match, elements, k), elements
    if suffix is not None:
        walked = elements[: len(elements) - (len(suffix[0].ends) - suffix[1].first)]
    dumped: list[bytes] = []
    exact, digests, keys = masker.examine_all(walked, optional, known, dumped, stripped, nulls)
    if optional:  # the elements not walked count their malformed roles as walking them would
        _count_odd_roles(elements[: len(known[0])] if known else ())
        _count_odd_roles(elements[len(walked) :] if suffix is not None else ())
    if clean is not None:  # a marker stripped makes the bytes shorter
        clean += bytes(map(_same_length, dumped, stripped[len(stripped) - len(dumped) :]))
    suffix_ends: list[int] = []
    if suffix is not None:  # the trailing elements `parse` took from the recent body: its results
        old_ends, found = suffix[0].ends, suffix[1]
        first, delta = found.first, found.delta
        columns = suffix[0].columns
        exact, digests, keys = exact + columns[0][first:], digests + columns[1][first:], keys + columns[2][first:]
        suffix_ends = list(map(delta.__add__, old_ends[first:]))
        flags = bytes(columns[CLEAN_COLUMN][first:]) if len(columns) > CLEAN_COLUMN else None
        donor = match.around.sidecars if match.around is not None else None
        if donor is not None and len(walked) == first and len(donor) == len(elements):
            # at the positions the kept body's record has their sidecars for (`Kept.sidecars`):
            # the record builder takes those (`session.donor_matches`), not these bytes
            stripped.extend([None] * len(suffix_ends))
        else:
            stripped.extend(suffix_parts(data, elements[len(walked) :], found.start, suffix_ends, flags))
        clean = clean + flags if clean is not None and flags is not None else None
    if masker.budget is not None and masker.budget.is_spent:
        return exact, digests, keys, len(known[0]) if known else 0, match  # partly masked: never remembered
    start: int | None
    if state is not None and k:
        start = state.start
        ends = rawprefix.locate(data, dumped, 0, state.ends[:k])
    elif dumped:
        start = rawprefix.top_level_start(data, array_key, dumped[0])
        ends = rawprefix.locate(data, dumped, start) if start is not None else []
    else:  # every element is the recent body's (`parse` found where the array starts)
        start = suffix[1].start if suffix is not None else None
        ends = []
    if suffix is not None and len(ends) == len(walked) and (not ends or ends[-1] + 1 == suffix[1].start):
        ends.extend(suffix_ends)
    if ends:
        m = len(ends)
        tail = data[len(chunks) // 16 * rawprefix.CHUNK :]
        if match.nodes is None or match.values is None:
            match.nodes, match.values, _, _ = rawprefix.chunk_counts(data, state, shared)
        counted = match.counts  # the budget check's, of this very array
        counts = counted[1][:m] if counted is not None and counted[0] is elements else array("q")
        fresh = rawprefix.RawState(
            chunks,
            tail,
            tuple(ends),
            (exact[:m], digests[:m], keys[:m], *((clean[:m],) if clean is not None and len(clean) >= m else ())),
            start if start is not None else -1,
            match.nodes,
            match.values,
            *rawprefix.array_end(data, ends, match.end_digests),
            counts,
            array_key,
        )
        covers = state is not None and k == len(state.ends)
        gap = index.since(state)
        index.remember(raw.scope, fresh, state if covers else None)
        match.fresh = index.keep_parsed(
            fresh, tuple(elements[:m]), array_key, match.head, raw.scope, gap, match.kept is not None
        )
    return exact, digests, keys, len(known[0]) if known else 0, match


_ROLE_TYPES: Final = frozenset({str, type(None)})


def _count_odd_roles(elements: Sequence[Any]) -> None:
    """`skipped("role")` for each element of `elements` whose `role` is neither a string nor
    absent, as `Masker.examine_all` counts it when it walks the element with identity-optional
    keys: the elements whose results are reused count as in a process that reuses nothing.
    The usual array (objects, string roles) is told at C speed (~0.1 us an element)."""
    try:
        if set(map(type, map(dict.get, elements, repeat("role")))) <= _ROLE_TYPES:
            return
    except TypeError:  # an element that is not an object
        pass
    for element in elements:
        if type(element) is dict:
            role = element.get("role")
            if role is not None and type(role) is not str:
                skipped("role")


CLEAN_COLUMN: Final = 3
"""The column of `RawState.columns` (after the exact, masked and key digests) saying, one byte
per element, whether its compact bytes are its stripped bytes (1: it holds no marker, so its
sidecar's value is those bytes as they are; 0: `has_markers_in` was true). The element is the
very object later requests reuse (never edited), so it answers for them too."""


def _same_length(data: bytes, stripped: bytes | None) -> int:
    """1 when `stripped` (`stripped_bytes` of a value) is as long as `data` (its compact bytes):
    nothing was stripped (a marker key removed makes the bytes shorter)."""
    return 1 if stripped is not None and len(stripped) == len(data) else 0


def suffix_parts(
    data: bytes, elements: Sequence[Any], start: int, ends: Sequence[int], clean: bytes | None = None
) -> list[bytes | None]:
    """What `MessageView.stripped` holds for `elements`, whose compact bytes lie back to back in
    `data`, one `,` apart, from offset `start`, ending at `ends` (exclusive; one per element):
    each one's bytes, or `None` when it holds a marker (`has_markers_in`). `clean`: one byte
    per element, 1 when it is known to hold none (`CLEAN_COLUMN`: the very objects a recent
    body held), so no element is looked at; without it each one is."""
    if len(ends) != len(elements) or (clean is not None and len(clean) != len(ends)):
        raise ValueError("one end offset per element")
    begins = [start, *map((1).__add__, ends[:-1])] if ends else []
    sliced: list[bytes] = list(map(data.__getitem__, map(slice, begins, ends)))
    if clean is None:
        return [None if has_markers_in(e, part) else part for e, part in zip(elements, sliced, strict=True)]
    parts: list[bytes | None] = list(sliced)
    if 0 in clean:
        for i in compress(count(), map(not_, clean)):
            parts[i] = None
    return parts


def _reused_suffix(
    match: rawprefix.RawMatch, elements: Sequence[Any], k: int
) -> tuple[rawprefix.RawState, rawprefix.Suffix] | None:
    """`(the kept body's state, RawMatch.suffix)` when the trailing elements of `elements` are
    that body's very objects from `suffix.first` on (`parse` reused them:
    `rawprefix.parse_around`), after the `k` leading ones reused by prefix; else `None`."""
    found, kept = match.suffix, match.around
    if found is None or kept is None:
        return None
    state = kept.state
    old = kept.elements[found.first :]
    n = len(old)
    if not n or len(elements) - n < k or len(state.ends) != len(kept.elements):
        return None
    if not all(map(is_, elements[len(elements) - n :], old)):
        return None
    return state, found


@dataclass(frozen=True, slots=True)
class StoredColumns:
    """The previous record's sidecars as columns, made once per request (`stored_columns`) and
    read by `first_mismatch`, `tail_rewritten`, `splice` and `proxy.measure.reuse_for`: when
    the sidecars hold exactly positions `0..n-1` in order (no system-section positions: the
    usual Anthropic and Responses history) those compare whole columns at memory speed and
    walk elements one by one only where a column differs."""

    sidecars: Sequence[Sidecar]
    """The sidecars the columns were made from (the functions check it is theirs)."""
    digests: tuple[bytes, ...] | None
    """`Sidecar.digest` by position; `None` when the positions are not exactly `0..n-1`."""
    exact_column: tuple[bytes, ...] | None = None
    """`Sidecar.exact` by position, made with `digests` (read by the session stage's edit check
    and the record builder: once per request)."""

    def of(self, sidecars: Sequence[Sidecar], skip: frozenset[int]) -> tuple[bytes, ...] | None:
        """`digests` when they describe `sidecars` and no position is skipped, else `None`."""
        return self.digests if self.sidecars is sidecars and not skip else None

    def exacts(self, stop: int) -> tuple[bytes, ...]:
        """`Sidecar.exact` of the first `stop` sidecars."""
        if self.exact_column is not None:
            return self.exact_column[:stop]
        return tuple(map(_EXACT_OF, self.sidecars[:stop]))

    def sent(self, stop: int) -> tuple[bytes, ...]:
        """`Sidecar.sent_digest()` of the first `stop` sidecars."""
        found = tuple(map(_VALUE_DIGEST, self.sidecars[:stop]))
        if b"" in found:
            found = tuple(s.sent_digest() for s in self.sidecars[:stop])
        return found


_POSITION: Final = attrgetter("position")
_DIGEST_OF: Final = attrgetter("digest")
_VALUE_DIGEST: Final = attrgetter("value_digest")
_EXACT_OF: Final = attrgetter("exact")


def stored_columns(sidecars: Sequence[Sidecar]) -> StoredColumns:
    """The `StoredColumns` of `sidecars` (C-speed passes, no per-element Python code)."""
    positions = list(map(_POSITION, sidecars))
    if positions != list(range(len(positions))):
        return StoredColumns(sidecars, None)
    return StoredColumns(sidecars, tuple(map(_DIGEST_OF, sidecars)), tuple(map(_EXACT_OF, sidecars)))


def first_difference(a: Sequence[bytes], b: Sequence[bytes], stop: int) -> int:
    """The first index below `stop` where `a` and `b` differ, else `stop` (both long enough)."""
    if tuple(a[:stop]) == tuple(b[:stop]):
        return stop
    return next(i for i in range(stop) if a[i] != b[i])


def first_mismatch(
    digests: Sequence[bytes],
    sidecars: Sequence[Sidecar],
    skip: frozenset[int],
    columns: StoredColumns | None = None,
) -> int | None:
    """First earlier position (never the last element) whose digest differs from its sidecar's;
    positions in `skip` (system section) and past the stored history are not compared.
    `columns`: `stored_columns(sidecars)` when the caller has it (the same answer, faster)."""
    stored_digests = columns.of(sidecars, skip) if columns is not None else None
    if stored_digests is not None:
        stop = min(len(digests) - 1, len(stored_digests))
        if stop <= 0:
            return None
        found = first_difference(digests, stored_digests, stop)
        return found if found < stop else None
    stored = {s.position: s.digest for s in sidecars}
    for i in range(len(digests) - 1):
        if i in skip:
            continue
        digest = stored.get(i)
        if digest is None:
            return None
        if digest != digests[i]:
            return i
    return None


def comparable(message: Any, optional: Mapping[str, frozenset[str]] | None, nulls: NullAbsent | None = None) -> Any:
    """`message` as its masked digest sees it, before masking: markers stripped, string content
    as its text block (`canonical_value`), the identity-optional keys of its role and (`nulls`)
    the null-valued keys the API reads as absent left out."""
    value = strip_markers(message)
    dropped = None
    if optional and type(value) is dict:
        role = value.get("role")
        dropped = optional.get(role) if type(role) is str else None
    return _projection(value, dropped, nulls)


def _projection(stripped: Any, dropped: frozenset[str] | None, nulls: NullAbsent | None) -> Any:
    """`stripped` (a message without markers) in its canonical form (`canonical_value`), then
    without the keys `dropped` (identity-optional) and the nulls `nulls` leaves out: what the
    masked digest of a projected message covers (`Masker._projected`, `comparable`). The
    canonical form comes first: the exact digest the memo keys on is of the canonical form, so
    the projection must be a function of it (a `"role": null` message's string content and its
    one text block are one exact digest; attack pass, session 16)."""
    value = canonical_value(stripped)
    if dropped and type(value) is dict and not dropped.isdisjoint(value):
        value = {k: v for k, v in value.items() if k not in dropped}
    return without_nulls(value, nulls) if nulls is not None else value


EDIT_MARK: Final = b"volatile-edit\x00"


@dataclass(frozen=True, slots=True)
class VolatileEdit:
    """A message edited in a volatile value (`first_volatile_edit`)."""

    position: int
    """Its position in the message array."""
    values: tuple[str, ...]
    """What names the edit (`proxy.rerender.edits`: the edited tokens, without the moments
    around them that moved forward)."""

    def digest(self, view: MessageView) -> bytes:
        """The digest the message compares as (`with_edits`): of its masked digest and the
        edited values, so the same edit gives the same digest whatever the client re-renders
        around it on later turns, and another edit another digest (16 bytes)."""
        data = EDIT_MARK + view.recorded[self.position] + "\x00".join(self.values).encode("utf-8", "surrogatepass")
        return xxhash.xxh3_128_digest(data)


def with_edits(view: MessageView, compared: VolatileEdit | None, chained: Iterable[VolatileEdit]) -> MessageView:
    """`view` with the message of `compared` compared as a changed message (its digest replaced
    by `VolatileEdit.digest`), and its identity chain following that digest at each edit of
    `chained` (the edits found against each record session inference tried; the first one per
    position counts), so neither replay nor inference takes an edited message for the stored
    one it only masks equal to. `MessageView.recorded` keeps the masked digests for the session
    record."""
    marks: dict[int, bytes] = {}
    for edit in chained:
        marks.setdefault(edit.position, edit.digest(view))
    if compared is None and not marks:
        return view
    base = view.recorded
    digests = list(base)
    if compared is not None:
        digests[compared.position] = compared.digest(view)
    boundaries: tuple[bytes, ...] = view.boundaries
    if marks:
        linked = list(base)
        for position, digest in marks.items():
            linked[position] = digest
        start = min(marks)
        out = list(view.boundaries[:start])
        chain = out[-1] if out else view.head
        for digest in linked[start:]:
            chain = xxhash.xxh3_128_digest(chain + digest)
            out.append(chain)
        boundaries = tuple(out)
    return replace(view, digests=tuple(digests), boundaries=boundaries, masked=base)


def first_volatile_edit(
    view: MessageView,
    sidecars: Sequence[Sidecar],
    elapsed: float,
    optional: Mapping[str, frozenset[str]] | None = None,
    columns: StoredColumns | None = None,
    allowance: Allowance | None = None,
    nulls: NullAbsent | None = None,
) -> VolatileEdit | None:
    """The first position whose masked digest equals its sidecar's while its exact digest does
    not, and whose change is not a re-render (`proxy.rerender.edits` of the stored value
    and the client's element, `elapsed` seconds into the session): a person's edit of a
    volatile value, which replay must not undo, or another conversation that differs only
    there, which inference must not join. Only positions before the first masked mismatch
    are looked at (the newest element too: a retried last prompt), and only those with a stored
    exact digest. `None` when there is none. `view` is the client's (unmarked:
    `MessageView.recorded` is compared); `allowance`: the request's (`proxy.rerender.Allowance`,
    shared by every record it is compared with), a fresh one when `None`; `nulls`: the
    adapter's `identity_nulls` (as the masked digests were made with)."""
    digests = view.recorded
    n = len(digests)
    stored_digests = columns.of(sidecars, view.system_positions) if columns is not None else None
    candidates: list[Sidecar] = []
    if stored_digests is not None and columns is not None:
        stop = min(n, len(stored_digests), len(view.exact))
        stop = first_difference(digests, stored_digests, stop) if stop > 0 else 0
        if stop <= 0 or view.exact[:stop] == columns.exacts(stop):
            return None
        candidates = [sidecars[i] for i in range(stop) if view.exact[i] != sidecars[i].exact]
    else:
        positions = list(map(_POSITION, sidecars))
        if (
            positions
            and max(positions) < len(view.exact)
            and list(map(view.exact.__getitem__, positions)) == list(map(_EXACT_OF, sidecars))
        ):
            return None  # no stored message changed at all (C speed: the usual turn)
        stored = {s.position: s for s in sidecars}
        for i in range(min(n, len(view.exact))):
            if i in view.system_positions:
                continue
            sidecar = stored.get(i)
            if sidecar is None or sidecar.digest != digests[i]:
                break
            if sidecar.exact != view.exact[i]:
                candidates.append(sidecar)
    if allowance is None:
        allowance = Allowance()
    for sidecar in candidates:
        if not sidecar.exact:  # written before exact digests were kept: nothing to tell by
            continue
        new = comparable(view.items[sidecar.position], optional, nulls)
        try:
            old = comparable(orjson.loads(sidecar.value), optional, nulls)
        except orjson.JSONDecodeError:
            return VolatileEdit(sidecar.position, ("\x00unreadable stored value",))
        found = edits(old, new, elapsed, allowance)
        if found:
            return VolatileEdit(sidecar.position, found)
    return None


def tail_rewritten(
    digests: Sequence[bytes],
    sidecars: Sequence[Sidecar],
    skip: frozenset[int],
    columns: StoredColumns | None = None,
) -> bool:
    """Whether this request rewrote the previous request's newest message (its last sidecar)
    and nothing before it: the client re-sends its newest message changed every turn (aider
    drops the reminder it appended), so a cache write on that message is never read
    (docs/provider-rules.md 1.5: a read needs the prefix byte for byte up to the marked block).

    False without sidecars, when the request holds fewer messages (a fork or a truncation: not
    this pattern), or when an earlier message changed first (compaction, an edit)."""
    if not sidecars:
        return False
    stored_digests = columns.of(sidecars, skip) if columns is not None else None
    if stored_digests is not None:  # positions 0..n-1: the last is n-1
        last = len(stored_digests) - 1
        if last >= len(digests) or first_difference(digests, stored_digests, last) < last:
            return False
        return stored_digests[last] != digests[last]
    last = max(s.position for s in sidecars)
    if last >= len(digests):
        return False
    stored = {s.position: s.digest for s in sidecars}
    for i in range(last):
        if i not in skip and stored.get(i, digests[i]) != digests[i]:
            return False
    return stored[last] != digests[last]


@dataclass(frozen=True, slots=True)
class SpliceResult:
    items: list[Any] | None
    """The new message array, `None` when nothing changed."""
    replayed: int
    """Messages replaced by their stored value."""
    positions: tuple[int, ...] = ()
    """Their positions."""


def splice(
    items: Sequence[Any],
    digests: Sequence[bytes],
    sidecars: Sequence[Sidecar],
    skip: frozenset[int],
    limit: int | None = None,
    view: MessageView | None = None,
    columns: StoredColumns | None = None,
) -> SpliceResult:
    """Replay matching earlier messages (module docstring); positions `>= limit` are left alone.

    `digests` are the client's masked digests, aligned with `items`. `view` (optional) knows
    the stripped bytes' digest of the elements it digested (`MessageView.key_of`). `columns`
    (`stored_columns(sidecars)`): when every element up to the first differing digest is the
    object `view` digested and its bytes' digest is its sidecar's (nothing to replay: the
    usual appended turn), that is found by comparing columns, not element by element.
    """
    end = len(items) - 1 if limit is None else min(limit, len(items) - 1)
    stored_digests = columns.of(sidecars, skip) if columns is not None and view is not None else None
    if stored_digests is not None and view is not None and columns is not None:
        stop = min(end, len(stored_digests))
        same = first_difference(digests, stored_digests, stop) if stop > 0 else 0
        if (
            len(view.items) >= same
            and len(view.keys) >= same
            and all(map(is_, items[:same], view.items[:same]))
            and view.keys[:same] == columns.sent(same)
        ):
            return SpliceResult(None, 0, ())
    stored = {s.position: s for s in sidecars}
    out: list[Any] | None = None
    positions: list[int] = []
    for i in range(end):
        if i in skip:
            continue
        sidecar = stored.get(i)
        if sidecar is None or sidecar.digest != digests[i]:
            break
        item = items[i]
        key = view.key_of(i, item) if view is not None else None
        if key is not None:
            if key == sidecar.sent_digest():
                continue
        elif stripped_bytes(item) == sidecar.value:
            continue
        if out is None:
            out = list(items)
        out[i] = orjson.loads(sidecar.value)
        positions.append(i)
    return SpliceResult(out, len(positions), tuple(positions))


def aligned_items(items: Sequence[Any], view: MessageView, dropped: int) -> list[Any] | None:
    """The sent message array `items` lined up with the client's (`view`): itself when as long;
    when reorder dropped `dropped` leading system-section messages (`Exchange.head_dropped`),
    `None` in place of the client's whole head (positions `0..h-1`, all system positions, which
    replay and the sidecars skip) followed by the sent elements after the sent head. `None`
    when they cannot be lined up (another length, a head that is not all system positions)."""
    n = len(view.digests)
    if len(items) == n:
        return list(items)
    skip = view.system_positions
    if dropped <= 0 or len(items) + dropped != n or not skip:
        return None
    head = max(skip) + 1
    if len(skip) != head or dropped > head:
        return None
    return [None] * head + list(items[head - dropped :])


def unaligned(aligned: Sequence[Any], items: Sequence[Any], view: MessageView, dropped: int) -> list[Any]:
    """`aligned` (from `aligned_items(items, view, dropped)`, possibly edited) as a sent array
    again: the sent head of `items`, then `aligned` after the client's head."""
    if len(items) == len(aligned):
        return list(aligned)
    head = max(view.system_positions) + 1
    return [*items[: head - dropped], *aligned[head:]]


class ReplayStage:
    name: Final = "replay"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        record = exchange.previous
        view = exchange.message_view
        body = exchange.body
        if record is None or not record.sidecars or view is None or body is None:
            return
        if view.array_key is None or not view.is_list:
            return
        items = body.get(view.array_key)
        if not isinstance(items, list):
            return
        dropped = exchange.head_dropped
        aligned = aligned_items(items, view, dropped)
        if aligned is None:
            return
        result = splice(
            aligned,
            view.digests,
            record.sidecars,
            view.system_positions,
            exchange.history_rewritten,
            view,
            exchange.stored_columns,
        )
        exchange.replayed = result.replayed
        if result.items is None:
            return
        stored = {s.position: s.value for s in record.sidecars}
        exchange.replayed_bytes = {i: (result.items[i], stored[i]) for i in result.positions}
        exchange.replace_body({**body, view.array_key: unaligned(result.items, items, view, dropped)})
        services.metrics.by_provider[exchange.provider].replayed_messages.inc(result.replayed)


STAGE: Final = ReplayStage()
