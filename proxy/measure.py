"""measure: per request, where the prefix diverged from the session's previous request, why, what
the cache should have read, what it did read, and what that cost.

Pure core (plain data in, plain data out, no I/O), used by `measure()` and by `proxy.explain`:
- `find_divergence(previous, current, ...)` compares chain digests (`proxy.prefix`) and returns
  a `Divergence`: the first block the current request does not share with the previous one, as
  block index, byte offset in the canonical stream and estimated tokens before it, with the
  section it lies in and one cause from `proxy.metrics.CAUSES`. Precedence follows the provider's render order
  (the earliest change wins, as in Anthropic's cache diagnostics): `model_changed`, then a
  change in `tools`, then `params_changed`, then `system` (`system_volatile_text` when the
  changed block matched a volatile rule) and `messages` (`history_rewritten` when the session
  stage saw an earlier message's real content change). A model or params change invalidates
  the whole cache, so its divergence is block 0. A request that shares all of the previous one
  (append, identical retry or a shorter fork) has cause `none` and ratio 1.
- `predict_read(...)` is the expected cache read in estimated tokens: the furthest previous
  breakpoint inside the shared prefix that one of the current breakpoints reaches within the
  lookback window (20 positions counting itself; a run of `tool_use` or of `tool_result` blocks
  is one position: docs/provider-rules.md 1.5, platform.claude.com/docs/en/build-with-claude/prompt-caching).
  TTLs are deliberately ignored: a predicted read that comes back as a write is `expired`.
  An adapter that can count its provider's tokens offline replaces the estimate with its own
  rule (`predict_read_tokens`: OpenAI in `o200k_base`, `proxy.providers.openai_tokens`, so the
  prediction equals what the cache reads); Claude's tokenizer is not public, so Anthropic keeps
  bytes/4.
- `is_expired(predicted, usage)`: a write happened and less than `EXPIRED_READ_SHARE` of the
  predicted read came back as a read (the share absorbs the bytes/4 token estimate).

`measure(exchange, services)` is the thin wrapper the response side calls once per pipeline
request, after the last byte went to the client: 2xx responses with a JSON body only. It
digests what was SENT once (`sent_prompt`: `proxy.prefix.scan_prompt` over the adapter's
layout, shared with the session record through `Exchange.sent_prompt`; the chain also in
`Exchange.sent_chain`), reads
`Exchange.previous` (the session's previous `SessionRecord`, or `None`) and
`Exchange.history_rewritten`, writes `Exchange.measurement` (a `Measurement`), and updates the
metrics. Invariant: it never changes what was sent or answered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson
import xxhash

from proxy.exchange import Exchange
from proxy.ledger import attribute_cost
from proxy.metrics import UPSTREAM_MISS_REASONS
from proxy.prefix import MARKER_KEYS, PrefixChain, PromptScan, Reuse, estimate_tokens, scan_prompt, shared_blocks
from proxy.providers.base import Block, JSONObject, ProviderAdapter, Usage
from proxy.rules import LINE_SCAN_COST, MAX_RULE_LINE_CHARS
from proxy.services import Services

_log = logging.getLogger("promptcache.measure")

VOLATILE_SCAN_CHARS: Final = 512 * 1024
"""Characters of a changed system block the volatile check scans (each line costs its length
plus `LINE_SCAN_COST`); the rest reads as not volatile (the divergence is then reported as a
plain system change)."""


LOOKBACK_POSITIONS: Final = 20
"""Positions a breakpoint checks for an earlier entry, counting itself (docs/provider-rules.md 1.5)."""
RUN_KINDS: Final = frozenset({"tool_use", "tool_result"})
"""Block kinds whose consecutive runs count as one lookback position (docs/provider-rules.md 1.5)."""
EXPIRED_READ_SHARE: Final = 0.5
"""A read below this share of the predicted read, with a write, counts as `expired`."""
_SECTION_CAUSE: Final = {"tools": "tools_changed", "system": "system_changed", "messages": "messages_changed"}


class PreviousRequest(Protocol):
    """What measurement reads from the session's previous `SessionRecord` (proxy.store.codec)."""

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
class Divergence:
    """Where and why the current request stops sharing the previous request's prefix."""

    cause: str
    """One of `proxy.metrics.CAUSES` (never `expired`: that needs the response)."""
    section: str
    """`tools`, `system`, `messages`, or `none` when no block changed."""
    block_index: int
    """First block not shared (`prefix_blocks` index); the previous length for an append."""
    byte_offset: int
    """Canonical bytes before that block."""
    tokens: int
    """Estimated tokens before that block (`estimate_tokens(byte_offset)`)."""
    ratio: float
    """`byte_offset` / the current prompt's bytes; 1 when nothing changed, 0 on a first request."""
    shared_blocks: int
    """Leading blocks whose chain digests equal the previous request's."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """Everything measured about one request (debug endpoint, logs, `Exchange.measurement`)."""

    provider: str
    family: str
    """Pricing family of the request's model, or `other`."""
    divergence: Divergence
    block_path: str | None
    """Body path of the first divergent block of the current request (`system[2]`)."""
    prompt_blocks: int
    prompt_bytes: int
    """Canonical bytes of the prompt sent."""
    predicted_read_tokens: int
    """Estimated tokens the previous request's breakpoints should let this one read."""
    predicted_breakpoint: int | None
    """The previous breakpoint (block index) predicted to be read."""
    cause: str
    """Final cause: the divergence's, or `expired` when a predicted read came back as a write."""
    usage: Usage | None
    cost_usd: float | None
    """List-price cost of `usage` (USD)."""
    uncached_cost_usd: float | None
    """Cost of `usage` had nothing been cached (USD)."""
    upstream_reason: str | None
    """The upstream's own cache-miss reason, when cache diagnostics were requested."""
    diagnosis: str | None = None
    """`agree`, `disagree` or `unknown` (`agreement`), when cache diagnostics were requested."""

    @property
    def savings_usd(self) -> float | None:
        """`uncached_cost_usd - cost_usd`; negative when writes cost more than they saved."""
        if self.cost_usd is None or self.uncached_cost_usd is None:
            return None
        return self.uncached_cost_usd - self.cost_usd


# --- pure core ---------------------------------------------------------------------------------


def params_digest(adapter: ProviderAdapter, path: str, body: JSONObject) -> bytes:
    """xxh3-128 of the prompt-affecting parameters outside the blocks (16 bytes)."""
    fingerprint = adapter.params_fingerprint(path, body)
    return xxhash.xxh3_128_digest(orjson.dumps(fingerprint, option=orjson.OPT_SORT_KEYS))


def sent_params_digest(exchange: Exchange, body: JSONObject) -> bytes:
    """`params_digest` of `body` (the body sent), once per request (`Exchange.sent_params`)."""
    found = exchange.sent_params
    if found is not None and found[0] is body:
        return found[1]
    digest = params_digest(exchange.adapter, exchange.path, body)
    exchange.sent_params = (body, digest)
    return digest


def request_model(body: JSONObject) -> str:
    """The request's `model`, or `""` when absent or not a string."""
    model = body.get("model")
    return model if isinstance(model, str) else ""


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

    `model` and `params` (`params_digest`) are the current request's. `history_rewritten` is
    the session stage's verdict that an earlier message's real content changed; `is_volatile`
    says whether a system block matched a volatile rule.
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


def lookback_positions(blocks: Sequence[Block]) -> list[int]:
    """Lookback position of each block: consecutive `tool_use` (or `tool_result`) blocks share one."""
    return kind_positions([block.kind for block in blocks])


def kind_positions(kinds: Sequence[str]) -> list[int]:
    """`lookback_positions` of blocks of these kinds."""
    positions: list[int] = []
    position = -1
    previous_kind = ""
    for kind in kinds:
        if not (kind == previous_kind and kind in RUN_KINDS):
            position += 1
        positions.append(position)
        previous_kind = kind
    return positions


def marker_positions(blocks: Sequence[Block], body: JSONObject) -> tuple[int, ...]:
    """Indices of the blocks that carry a cache marker in `body` as sent.

    A marker key (`cache_control`, `prompt_cache_breakpoint`) with a non-null value on the block
    counts; a top-level one (Anthropic automatic caching) marks the last block.
    """
    found = [
        i
        for i, block in enumerate(blocks)
        if isinstance(block.value, dict) and any(block.value.get(k) is not None for k in MARKER_KEYS)
    ]
    return with_top_marker(found, len(blocks), body)


def with_top_marker(found: Sequence[int], n_blocks: int, body: JSONObject) -> tuple[int, ...]:
    """`found` (blocks carrying their own marker) plus the last block when `body` has a top-level
    marker (`marker_positions`)."""
    if n_blocks and any(body.get(k) is not None for k in MARKER_KEYS) and (not found or found[-1] != n_blocks - 1):
        return (*found, n_blocks - 1)
    return tuple(found)


def predict_read(
    previous_breakpoints: Sequence[int],
    previous_ends: Sequence[int],
    shared: int,
    current_breakpoints: Sequence[int],
    positions: Sequence[int],
    *,
    lookback: int = LOOKBACK_POSITIONS,
    min_tokens: int = 0,
) -> tuple[int | None, int]:
    """`(breakpoint, tokens)`: the previous breakpoint the current request should read, and the
    estimated tokens up to and including it; `(None, 0)` when none is reachable.

    A previous breakpoint `b` is readable when it lies in the shared prefix (`b < shared`), its
    prefix reaches `min_tokens`, and some current breakpoint `p >= b` has
    `positions[p] - positions[b] < lookback`.
    """
    best: int | None = None
    for b in previous_breakpoints:
        if not 0 <= b < shared or b >= len(previous_ends) or b >= len(positions):
            continue
        if best is not None and b <= best:
            continue
        if estimate_tokens(previous_ends[b]) < min_tokens:
            continue
        if any(p >= b and p < len(positions) and positions[p] - positions[b] < lookback for p in current_breakpoints):
            best = b
    if best is None:
        return None, 0
    return best, estimate_tokens(previous_ends[best])


def is_expired(predicted_tokens: int, usage: Usage | None) -> bool:
    """A predicted read came back (mostly) as a write: TTL ran out or the entry was evicted."""
    if usage is None or predicted_tokens <= 0 or usage.cache_write <= 0:
        return False
    return usage.cache_read < predicted_tokens * EXPIRED_READ_SHARE


def agreement(causes: Mapping[str | None, frozenset[str]], reason: str | None, cause: str) -> str:
    """Does the upstream's diagnosis `reason` (`None` = no divergence) agree with promptcache's
    `cause`? `causes` is the adapter's `diagnostic_causes` table; a reason it does not list
    (`pending`, not found, unavailable, a new one) and a first request are `unknown`."""
    if cause == "first_request" or reason not in causes:
        return "unknown"
    return "agree" if cause in causes[reason] else "disagree"


def upstream_reason_label(reason: str | None) -> str:
    """Map the upstream's cache-miss reason onto the bounded metric label set."""
    if reason is None:
        return "none"
    return reason if reason in UPSTREAM_MISS_REASONS else "other"


# --- wrapper -----------------------------------------------------------------------------------


def sent_body(exchange: Exchange) -> JSONObject | None:
    """The request body as it went upstream.

    The client's bytes when a stage failed (fail open) or nothing was rewritten, else the
    serialised upstream body: the object `serialise` dumped (`Exchange.serialised`, never
    edited after), else the upstream bytes parsed (once: the result is kept there).
    """
    if exchange.failed_stage is not None:
        source = exchange.raw
    elif exchange.upstream_body is None:
        return exchange.body
    else:
        source = exchange.upstream_body
    known = exchange.serialised
    if known is not None and known[0] is source:
        return known[1]
    body: Any
    try:
        body = orjson.loads(source)
    except orjson.JSONDecodeError:
        body = None
    body = body if isinstance(body, dict) else None
    exchange.serialised = (source, body)
    return body


def sent_prompt(exchange: Exchange, body: JSONObject) -> PromptScan:
    """`scan_prompt` of `body` (the body sent), once per request (`Exchange.sent_prompt`).

    The runs come from the adapter's `layout`, per prefix key; a key whose value is the very
    object the session stage laid out (`Exchange.client_runs`: bodies are copy-on-write, so an
    unchanged key is the same object) reuses those runs.
    """
    found = exchange.sent_prompt
    if found is not None and found[0] is body:
        return found[1]
    adapter, path = exchange.adapter, exchange.path
    known = exchange.client_runs or {}
    runs: list[Any] = []
    for key in adapter.prefix_keys(path):
        if key not in body:
            continue
        value = body[key]
        hit = known.get(key)
        runs.extend(hit[1] if hit is not None and hit[0] is value else adapter.layout(path, {key: value}))
    prompt = scan_prompt(runs, reuse_for(exchange, body))
    exchange.sent_prompt = (body, prompt)
    return prompt


def reuse_for(exchange: Exchange, body: JSONObject) -> Reuse | None:
    """What `scan_prompt` of the sent `body` may copy from the session's previous request
    (`Exchange.previous`, its record): the leading elements of the message array whose
    marker-free bytes as sent equal the ones the record's sidecars hold at the same positions.
    A sent element is known by its digest without serialising it: the client's own object
    (`MessageView.key_of`) or a replayed one (`Exchange.replayed_bytes`). `None` when nothing
    is vouched for."""
    previous = exchange.previous
    view = exchange.message_view
    if previous is None or view is None or view.array_key is None or not view.is_list:
        return None
    items = body.get(view.array_key)
    sidecars = previous.sidecars
    if type(items) is not list or not sidecars:
        return None
    replayed = exchange.replayed_bytes or {}
    same = 0
    for i, item in enumerate(items):
        if i >= len(sidecars) or sidecars[i].position != i:
            break
        key = view.key_of(i, item)
        if key is None:
            hit = replayed.get(i)
            if hit is None or hit[0] is not item:
                break
            key = xxhash.xxh3_128_digest(hit[1])
        if key != sidecars[i].sent_digest():
            break
        same += 1
    if not same:
        return None
    return Reuse(PrefixChain(previous.chain, previous.ends), view.array_key, same)


def block_text(block: Block) -> str:
    """The text a segment rule can match in a block: a string value or a `text` field."""
    value = block.value
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    return ""


def volatile_checker(rules: Any) -> Callable[[Block], bool] | None:
    """`block -> it holds a line a volatile rule matches` for a loaded `RuleSet` (rules are
    matched line by line, on lines up to `MAX_RULE_LINE_CHARS`, proxy.rules, over at most
    `VOLATILE_SCAN_CHARS` of the block); `None` without rules or volatile rules."""
    patterns = tuple(rule.pattern for rule in getattr(rules, "rules", ()) if getattr(rule, "tier", None) == "volatile")
    if not patterns:
        return None

    def is_volatile(block: Block) -> bool:
        left = VOLATILE_SCAN_CHARS
        for line in block_text(block).split("\n"):
            if len(line) > MAX_RULE_LINE_CHARS:
                continue  # content, never scanned (bounded time)
            left -= len(line) + LINE_SCAN_COST
            if left < 0:
                return False  # bounded time: an unclassified rest reads as not volatile
            if any(p.search(line) for p in patterns):
                return True
        return False

    return is_volatile


_CHECKERS: dict[int, tuple[Any, Callable[[Block], bool] | None]] = {}


def _rules(services: Services) -> Any:
    """The app's `RuleSet`, else the configured folder's, loaded once; `None` if unreadable."""
    if services.rules is not None:
        return services.rules
    from proxy.rules import RuleError, cached_rules

    try:
        return cached_rules(services.settings.rules_dir)
    except (RuleError, OSError):
        return None


def _checker(rules: Any) -> Callable[[Block], bool] | None:
    found = _CHECKERS.get(id(rules))
    if found is None or found[0] is not rules:
        found = (rules, volatile_checker(rules))
        _CHECKERS.clear()
        _CHECKERS[id(rules)] = found
    return found[1]


def _min_tokens(rules: Any, model: str) -> int:
    """Minimum cacheable prefix of `model` (tokens) from the rules' model table, else 0."""
    minimum = getattr(rules, "min_tokens", None)
    return int(minimum(model)) if callable(minimum) else 0


def _token_prediction(
    exchange: Exchange,
    services: Services,
    body: JSONObject,
    n_blocks: int,
    divergence: Divergence,
    previous: Any,
    min_tokens: int,
) -> tuple[int | None, int] | None:
    """The adapter's prediction in real tokens (`predict_read_tokens`, OpenAI: `o200k_base`)
    when it has one and the tokenizer is loaded (`services.tokens`), else `None` (bytes/4)."""
    predictor = getattr(exchange.adapter, "predict_read_tokens", None)
    counter = services.tokens
    if predictor is None or counter is None:
        return None
    result: tuple[int | None, int] | None = predictor(
        exchange.path,
        body,
        counter.count,
        n_blocks,
        divergence.shared_blocks,
        len(previous.ends),
        previous.breakpoints,
        min_tokens,
    )
    return result


def measure(exchange: Exchange, services: Services) -> None:
    """Measure one finished exchange (see the module docstring); 2xx JSON requests only."""
    if exchange.body is None or not 200 <= exchange.status < 300:
        return
    body = sent_body(exchange)
    if body is None:
        return
    prompt = sent_prompt(exchange, body)
    blocks = prompt.blocks
    chain = prompt.chain
    exchange.sent_chain = chain
    previous = exchange.previous
    model = request_model(body)
    rules = _rules(services)
    divergence = find_divergence(
        previous,
        chain,
        blocks,
        model,
        sent_params_digest(exchange, body),
        history_rewritten=exchange.history_rewritten is not None,
        is_volatile=_checker(rules),
    )
    predicted_at, predicted = (None, 0)
    if previous is not None and divergence.cause not in ("model_changed", "params_changed"):
        predicted_at, predicted = predict_read(
            previous.breakpoints,
            previous.ends,
            divergence.shared_blocks,
            with_top_marker(prompt.marked, len(blocks), body),
            kind_positions(prompt.kinds),
            min_tokens=_min_tokens(rules, model),
        )
        counted = _token_prediction(
            exchange, services, body, len(blocks), divergence, previous, _min_tokens(rules, model)
        )
        if counted is not None:
            predicted_at, predicted = counted
    usage = exchange.usage
    cause = "expired" if is_expired(predicted, usage) else divergence.cause
    family, prices = services.pricing.lookup(exchange.provider, model)
    cost = uncached = None
    if usage is not None and prices is not None:
        cost, uncached = prices.cost(usage), prices.uncached_cost(usage)
    requested = exchange.is_diagnostics_requested
    result = Measurement(
        provider=exchange.provider,
        family=family,
        divergence=divergence,
        block_path=blocks[divergence.block_index].path
        if divergence.section != "none" and divergence.block_index < len(blocks)
        else None,
        prompt_blocks=len(blocks),
        prompt_bytes=chain.total_bytes,
        predicted_read_tokens=predicted,
        predicted_breakpoint=predicted_at,
        cause=cause,
        usage=usage,
        cost_usd=cost,
        uncached_cost_usd=uncached,
        upstream_reason=(usage.cache_miss_reason if usage is not None else None) if requested else None,
        diagnosis=agreement(getattr(exchange.adapter, "diagnostic_causes", {}), usage.cache_miss_reason, cause)
        if requested and usage is not None
        else None,
    )
    exchange.measurement = result
    _record(result, services, requested)
    if cost is not None and uncached is not None:
        attribute_cost(exchange, services, cost, uncached)
    _log.debug(
        "measured %s: cause=%s section=%s block=%d byte=%d tokens~%d predicted_read~%d",
        result.provider,
        cause,
        divergence.section,
        divergence.block_index,
        divergence.byte_offset,
        divergence.tokens,
        predicted,
    )


def _record(result: Measurement, services: Services, diagnostics_requested: bool) -> None:
    """Update the metrics from one `Measurement`."""
    metrics = services.metrics
    mm = metrics.measure[result.provider]
    divergence = result.divergence
    mm.prompt_bytes.inc(result.prompt_bytes)
    mm.matched_bytes.inc(divergence.byte_offset)
    counter = mm.divergences.get((divergence.section, result.cause))
    if counter is None:
        counter = metrics.divergences.labels(result.provider, divergence.section, result.cause)
    counter.inc()
    if divergence.cause != "first_request":
        mm.divergence_ratio.observe(divergence.ratio)
        mm.divergence_tokens.observe(divergence.tokens)
    mm.predicted_read_tokens.inc(result.predicted_read_tokens)
    if result.cost_usd is not None and result.uncached_cost_usd is not None:
        cost, uncached = mm.family_cost(result.family)
        cost.inc(result.cost_usd)
        uncached.inc(result.uncached_cost_usd)
    if diagnostics_requested and result.usage is not None:
        metrics.upstream_miss_reasons.labels(upstream_reason_label(result.upstream_reason), result.cause).inc()
        if result.diagnosis is not None:
            metrics.diagnostics_agreement.labels(result.provider, result.diagnosis).inc()
