"""divergence: where and why a request stops sharing the previous request's prefix, and what the
provider's cache should read from it. The one pure core of live measurement (`proxy.measure`),
`promptcache explain` (`proxy.forensics`) and the replay's cause counts
(`proxy.workloads.causes`).

Inputs are plain data: the previous request as recorded (`PreviousRequest`: chain digests, byte
offsets, model, parameter digest, marker positions), the current request's `Prompt` (its chain,
blocks, kinds, marker positions, model and parameter digest) and the provider's `ReadRules`
(built from the adapter: `read_rules`). No I/O, no metrics, no settings; inputs are never
modified. `compare(...)` returns a `Comparison`:

- the `Divergence` (`find_divergence`): the first block the current request does not share,
  as block index, byte offset in the canonical stream and estimated tokens before it, with the
  section it lies in and one cause from `proxy.metrics.CAUSES`. Precedence follows the
  provider's render order (the earliest change wins, as in Anthropic's cache diagnostics):
  `model_changed`, then a change in `tools`, then `params_changed`, then `system`
  (`system_volatile_text` when the changed block matched a volatile rule) and `messages`
  (`history_rewritten` when an earlier message's real content changed: the session stage's
  verdict live, `previous_messages` offline). A model or params change invalidates the whole
  cache, so its divergence is block 0. A request that shares all of the previous one (append,
  identical retry or a shorter fork) has cause `none` and ratio 1;
- the first divergent block's body path and kind;
- the predicted read (`predict`): the adapter's own rule when it has one (`ReadPredictor`,
  OpenAI's prefix caching: docs/provider-rules.md 2.1 and 2.3, no block lookback), else the
  furthest previous marker inside the shared prefix that a current marker reaches within the
  adapter's lookback (`ReadRules.lookback`: 20 positions for Anthropic, a run of `tool_use` or
  of `tool_result` blocks counting as one, docs/provider-rules.md 1.5; `None` = no limit).
  TTLs are deliberately ignored: a predicted read that comes back as a write is `expired`;
- the final cause: `expired` when a write happened and less than `EXPIRED_READ_SHARE` of the
  predicted read came back as a read (`is_expired`; the share absorbs the bytes/4 estimate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

import orjson
import xxhash

from proxy.frozen import fast_init
from proxy.prefix import PrefixChain, chain_blocks, estimate_tokens, shared_blocks
from proxy.providers.base import Block, JSONObject, ProviderAdapter, Usage

EXPIRED_READ_SHARE: Final = 0.5
"""A read below this share of the predicted read, with a write, counts as `expired`."""
_SECTION_CAUSE: Final = {"tools": "tools_changed", "system": "system_changed", "messages": "messages_changed"}
_WHOLE_CACHE: Final = frozenset({"model_changed", "params_changed"})
"""Causes that invalidate every entry: nothing is predicted to be read."""


class PreviousRequest(Protocol):
    """What the comparison reads from the previous request (`proxy.store.codec.SessionRecord`)."""

    @property
    def chain(self) -> bytes: ...
    @property
    def ends(self) -> tuple[int, ...]: ...
    @property
    def model(self) -> str: ...
    @property
    def params_digest(self) -> bytes: ...
    @property
    def breakpoints(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class Reference:
    """A `PreviousRequest` built offline from a body (`reference_of`)."""

    chain: bytes
    ends: tuple[int, ...]
    model: str
    params_digest: bytes
    breakpoints: tuple[int, ...]


@fast_init
@dataclass(frozen=True, slots=True)
class Divergence:
    """Where and why the current request stops sharing the previous request's prefix."""

    cause: str
    """One of `proxy.metrics.CAUSES` (never `expired`: that needs the response)."""
    section: str
    """`tools`, `system`, `messages`, or `none` when no block changed."""
    block_index: int
    """First block not shared (prefix-block index); the previous length for an append."""
    byte_offset: int
    """Canonical bytes before that block."""
    tokens: int
    """Estimated tokens before that block (`estimate_tokens(byte_offset)`)."""
    ratio: float
    """`byte_offset` / the current prompt's bytes; 1 when nothing changed, 0 on a first request."""
    shared_blocks: int
    """Leading blocks whose chain digests equal the previous request's."""


@fast_init
@dataclass(frozen=True, slots=True)
class ReadRules:
    """The provider's cache-read rules for one request (from its adapter: `read_rules`)."""

    marker_key: str
    """Block key of a marker (`cache_control`, `prompt_cache_breakpoint`)."""
    top_level_key: str | None
    """Top-level key of an automatic marker that marks the last block (Anthropic), if any."""
    lookback: int | None
    """Positions a read walks back from a marker, counting itself; `None` = no limit."""
    run_kinds: frozenset[str]
    """Kinds of which a run of consecutive blocks counts as one lookback position."""
    min_tokens: int = 0
    """The model's minimum cacheable prefix (tokens): nothing shorter is written or read."""


ReadPredictor = Callable[[int, PreviousRequest], "tuple[int | None, int] | None"]
"""`(shared blocks, previous request) -> (block, tokens)` of the read due by the provider's own
rule, or `None` when the rule does not cover the body (the marker rule of `ReadRules` applies)."""


@fast_init
@dataclass(frozen=True, slots=True)
class Prompt:
    """One request as the comparison reads it (the body as sent)."""

    chain: PrefixChain
    blocks: Sequence[Block]
    """Its prefix blocks (a lazy `RunBlocks` is fine: only the divergent one is read)."""
    kinds: Sequence[str]
    """`blocks[i].kind`, without building the blocks."""
    markers: tuple[int, ...]
    """Blocks carrying a marker (`marker_positions`)."""
    model: str
    params: bytes
    """`params_digest` of the body."""


@fast_init
@dataclass(frozen=True, slots=True)
class Comparison:
    """Everything `compare` finds (module docstring)."""

    divergence: Divergence
    block_path: str | None
    """Body path of the first divergent block of the current request (`system[2]`)."""
    block_kind: str | None
    """Its kind (`text`, `tool_result` ...)."""
    predicted_breakpoint: int | None
    """The previous marker (block index) predicted to be read."""
    predicted_read_tokens: int
    """Estimated tokens the previous request's entries let this one read."""
    cause: str
    """The divergence's cause, or `expired` when a predicted read came back as a write."""


# --- the parts ---------------------------------------------------------------------------------


def request_model(body: JSONObject) -> str:
    """The request's `model`, or `""` when absent or not a string."""
    model = body.get("model")
    return model if isinstance(model, str) else ""


def params_digest(adapter: ProviderAdapter, body: JSONObject) -> bytes:
    """xxh3-128 of the prompt-affecting parameters outside the blocks (16 bytes)."""
    fingerprint = adapter.params_fingerprint(body)
    return xxhash.xxh3_128_digest(orjson.dumps(fingerprint, option=orjson.OPT_SORT_KEYS))


def read_rules(adapter: ProviderAdapter, body: JSONObject, min_tokens: int = 0) -> ReadRules:
    """The adapter's read rules for `body` (its `MarkerPolicy`: per request, OpenAI's depends on
    the model and on the gateway's profile)."""
    policy = adapter.marker_policy(body)
    return ReadRules(policy.key, policy.top_level_key, policy.lookback, policy.run_kinds, min_tokens)


def read_predictor(
    adapter: ProviderAdapter,
    body: JSONObject,
    n_blocks: int,
    min_tokens: int,
    count: Callable[[str], int] | None = None,
) -> ReadPredictor:
    """`ReadPredictor` of the adapter's own rule (`ProviderAdapter.predict_read_tokens`) for
    `body` with `n_blocks` prefix blocks; `count` counts a text's tokens (`None`: the adapter's
    estimate)."""

    def predict(shared: int, previous: PreviousRequest) -> tuple[int | None, int] | None:
        return adapter.predict_read_tokens(
            body, count, n_blocks, shared, len(previous.ends), previous.breakpoints, min_tokens
        )

    return predict


def marker_positions(values: Sequence[Any], body: JSONObject, rules: ReadRules) -> tuple[int, ...]:
    """Indices of the block values that carry a marker (`rules.marker_key`, non-null) in `body`
    as sent; a top-level marker (`rules.top_level_key`, Anthropic automatic caching) marks the
    last block."""
    key = rules.marker_key
    found = [i for i, value in enumerate(values) if isinstance(value, dict) and value.get(key) is not None]
    return with_top_marker(found, len(values), body, rules)


def marked_positions(
    candidates: Sequence[int], values: Sequence[Any], body: JSONObject, rules: ReadRules
) -> tuple[int, ...]:
    """`marker_positions`, given `candidates` that include every marked block (a scan's
    `PromptScan.marked`: blocks with any marker key)."""
    key = rules.marker_key
    found = [i for i in candidates if isinstance(values[i], dict) and values[i].get(key) is not None]
    return with_top_marker(found, len(values), body, rules)


def with_top_marker(found: Sequence[int], n_blocks: int, body: JSONObject, rules: ReadRules) -> tuple[int, ...]:
    """`found` (blocks carrying their own marker) plus the last block when `body` has a
    top-level marker (`rules.top_level_key`)."""
    top = rules.top_level_key
    if n_blocks and top is not None and body.get(top) is not None and (not found or found[-1] != n_blocks - 1):
        return (*found, n_blocks - 1)
    return tuple(found)


def kind_positions(kinds: Sequence[str], run_kinds: frozenset[str]) -> list[int]:
    """Lookback position of each block kind: consecutive blocks of one of `run_kinds` share one."""
    positions: list[int] = []
    position = -1
    previous_kind = ""
    for kind in kinds:
        if not (kind == previous_kind and kind in run_kinds):
            position += 1
        positions.append(position)
        previous_kind = kind
    return positions


def lookback_positions(blocks: Sequence[Block], run_kinds: frozenset[str]) -> list[int]:
    """`kind_positions` of `blocks`."""
    return kind_positions([block.kind for block in blocks], run_kinds)


def find_divergence(
    previous: PreviousRequest | None,
    current: PrefixChain,
    blocks: Sequence[Block],
    model: str,
    params: bytes,
    *,
    history_rewritten: bool = False,
    is_volatile: Callable[[Block], bool] | None = None,
) -> Divergence:
    """Compare the current request (`current` chain of `blocks`) with `previous`.

    `model` and `params` (`params_digest`) are the current request's. `history_rewritten` says
    an earlier message's real content changed; `is_volatile` whether a system block matched a
    volatile rule.
    """
    total = current.total_bytes
    if previous is None:
        return Divergence("first_request", "none", 0, 0, 0, 0.0, 0)
    before = PrefixChain(previous.chain, tuple(previous.ends))
    shared = shared_blocks(before, current)
    if previous.model != model:
        return Divergence("model_changed", "none", 0, 0, 0, 0.0, shared)
    changed = shared < len(current) and shared < len(before)
    section = blocks[shared].section if changed else "none"
    if section == "tools":
        cause = "tools_changed"
    elif previous.params_digest != params:
        return Divergence("params_changed", "none", 0, 0, 0, 0.0, shared)
    elif section == "none":
        offset = current.bytes_before(min(shared, len(before)))
        index = min(len(before), len(current))
        return Divergence("none", "none", index, offset, estimate_tokens(offset), 1.0, shared)
    elif section == "system" and is_volatile is not None and is_volatile(blocks[shared]):
        cause = "system_volatile_text"
    elif section == "messages" and history_rewritten:
        cause = "history_rewritten"
    else:
        cause = _SECTION_CAUSE[section]
    offset = current.bytes_before(shared)
    ratio = offset / total if total else 0.0
    return Divergence(cause, section, shared, offset, estimate_tokens(offset), ratio, shared)


def is_rewrite(previous_messages: Sequence[int | None], index: int) -> bool:
    """Offline `history_rewritten`: the previous request's block `index` belongs to an earlier
    message than its last one. `previous_messages[i]` is the message index of its block `i`
    (`None` outside the `messages` section)."""
    if index >= len(previous_messages):
        return False
    last = max((m for m in previous_messages if m is not None), default=-1)
    return (previous_messages[index] or 0) < last


def lookback_distance(kinds: Sequence[str], run_kinds: frozenset[str], start: int, stop: int, limit: int) -> int:
    """`kind_positions(kinds, run_kinds)[stop] - ...[start]` for `start <= stop`, counted only
    up to `limit` (a larger distance is returned as `limit`): walks `kinds[start + 1 : stop + 1]`
    and stops at `limit`, so a marker near the end of a long prompt costs the lookback, not
    the prompt."""
    distance = 0
    before = kinds[start]
    for i in range(start + 1, stop + 1):
        kind = kinds[i]
        if not (kind == before and kind in run_kinds):
            distance += 1
            if distance >= limit:
                return limit
        before = kind
    return distance


def predict_read(
    previous_breakpoints: Sequence[int],
    previous_ends: Sequence[int],
    shared: int,
    current_breakpoints: Sequence[int],
    positions: Sequence[int] | None,
    *,
    lookback: int | None,
    min_tokens: int = 0,
    kinds: Sequence[str] = (),
    run_kinds: frozenset[str] = frozenset(),
) -> tuple[int | None, int]:
    """`(breakpoint, tokens)`: the previous marker the current request should read by the marker
    rule, and the estimated tokens up to and including it; `(None, 0)` when none is reachable.

    A previous marker `b` is readable when it lies in the shared prefix (`b < shared`), its
    prefix reaches `min_tokens`, and some current marker `p >= b` has
    `positions[p] - positions[b] < lookback` (any `p >= b` when `lookback` is `None`).
    `positions` `None`: the current blocks' `kinds` instead, whose positions
    (`kind_positions(kinds, run_kinds)`) are walked only between the markers compared
    (`lookback_distance`); the same answer.
    """
    best: int | None = None
    size = len(positions) if positions is not None else len(kinds)
    for b in previous_breakpoints:
        if not 0 <= b < shared or b >= len(previous_ends) or b >= size:
            continue
        if best is not None and b <= best:
            continue
        if estimate_tokens(previous_ends[b]) < min_tokens:
            continue
        if any(
            b <= p < size
            and (
                lookback is None
                or (
                    positions[p] - positions[b] < lookback
                    if positions is not None
                    else lookback_distance(kinds, run_kinds, b, p, lookback) < lookback
                )
            )
            for p in current_breakpoints
        ):
            best = b
    if best is None:
        return None, 0
    return best, estimate_tokens(previous_ends[best])


def predict(
    previous: PreviousRequest,
    current: Prompt,
    shared: int,
    rules: ReadRules,
    predictor: ReadPredictor | None = None,
) -> tuple[int | None, int]:
    """The read due (module docstring): the adapter's own rule when it covers the body, else the
    marker rule."""
    if predictor is not None:
        found = predictor(shared, previous)
        if found is not None:
            return found
    return predict_read(
        previous.breakpoints,
        previous.ends,
        shared,
        current.markers,
        None,
        lookback=rules.lookback,
        min_tokens=rules.min_tokens,
        kinds=current.kinds,
        run_kinds=rules.run_kinds,
    )


def is_expired(predicted_tokens: int, usage: Usage | None) -> bool:
    """A predicted read came back (mostly) as a write: TTL ran out or the entry was evicted."""
    if usage is None or predicted_tokens <= 0 or usage.cache_write <= 0:
        return False
    return usage.cache_read < predicted_tokens * EXPIRED_READ_SHARE


# --- the core ----------------------------------------------------------------------------------


def compare(
    previous: PreviousRequest | None,
    current: Prompt,
    rules: ReadRules,
    *,
    history_rewritten: bool = False,
    previous_messages: Sequence[int | None] | None = None,
    is_volatile: Callable[[Block], bool] | None = None,
    usage: Usage | None = None,
    predictor: ReadPredictor | None = None,
) -> Comparison:
    """Compare `current` with `previous` under the provider's `rules` (module docstring).

    `history_rewritten` is a known verdict (the session stage's); `previous_messages` (the
    previous request's message index per block, `is_rewrite`) derives it offline instead.
    `usage` is the current response's (enables `expired`); `predictor` the adapter's own read
    rule (`read_predictor`)."""
    divergence = find_divergence(
        previous,
        current.chain,
        current.blocks,
        current.model,
        current.params,
        history_rewritten=history_rewritten,
        is_volatile=is_volatile,
    )
    if (
        previous_messages is not None
        and divergence.cause == "messages_changed"
        and is_rewrite(previous_messages, divergence.block_index)
    ):
        divergence = replace(divergence, cause="history_rewritten")
    block_path = block_kind = None
    if divergence.section != "none" and divergence.block_index < len(current.blocks):
        block = current.blocks[divergence.block_index]
        block_path, block_kind = block.path, block.kind
    predicted_at, predicted = None, 0
    if previous is not None and divergence.cause not in _WHOLE_CACHE:
        predicted_at, predicted = predict(previous, current, divergence.shared_blocks, rules, predictor)
    cause = "expired" if is_expired(predicted, usage) else divergence.cause
    return Comparison(divergence, block_path, block_kind, predicted_at, predicted, cause)


def prompt_of(
    adapter: ProviderAdapter, body: JSONObject, rules: ReadRules, chain: PrefixChain | None = None
) -> Prompt:
    """The `Prompt` of a whole body, built from its `prefix_blocks` (offline callers; the live
    path builds it from its scan, `proxy.measure`). `chain` when the caller digested it."""
    blocks = adapter.prefix_blocks(body)
    return Prompt(
        chain if chain is not None else chain_blocks(blocks),
        blocks,
        [block.kind for block in blocks],
        marker_positions([block.value for block in blocks], body, rules),
        request_model(body),
        params_digest(adapter, body),
    )


def reference_of(prompt: Prompt) -> Reference:
    """`prompt` as the reference of the next comparison (what a session record keeps of it)."""
    return Reference(prompt.chain.chain, prompt.chain.ends, prompt.model, prompt.params, prompt.markers)
