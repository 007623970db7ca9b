"""measure: per request, where the prefix diverged from the session's previous request, why, what
the cache should have read, what it did read, and what that cost.

The comparison itself (divergence position and cause, predicted read, `expired`) is the pure
core `proxy.divergence` (`compare`), shared with `promptcache explain` and the replay's cause
counts; the provider's rules (marker key, lookback, minimum, its own read rule such as OpenAI's
prefix caching in `o200k_base` tokens) come from the request's adapter (`read_rules`,
`read_predictor`). Claude's tokenizer is not public, so Anthropic keeps bytes/4. Also pure here:
`agreement` (the upstream's diagnosis against promptcache's cause) and `upstream_reason_label`.

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
from operator import is_
from typing import Any, Final

import orjson
import xxhash

from proxy.divergence import (
    Divergence,
    Prompt,
    ReadRules,
    compare,
    marked_positions,
    params_digest,
    read_predictor,
    read_rules,
    request_model,
)
from proxy.exchange import Exchange
from proxy.frozen import fast_init
from proxy.ledger import attribute_cost
from proxy.metrics import UPSTREAM_MISS_REASONS
from proxy.prefix import MARKER_KEYS, PrefixChain, PromptScan, Reuse, resumes, scan_prompt
from proxy.providers.base import Block, JSONObject, Usage
from proxy.rules import LINE_SCAN_COST, MAX_RULE_LINE_CHARS, volatile_patterns
from proxy.services import Services

_log = logging.getLogger("promptcache.measure")

VOLATILE_SCAN_CHARS: Final = 512 * 1024
"""Characters of a changed system block the volatile check scans (each line costs its length
plus `LINE_SCAN_COST`); the rest reads as not volatile (the divergence is then reported as a
plain system change)."""


@fast_init
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
    block_kind: str | None = None
    """Kind of the first divergent block (`text`, `tool_result` ...)."""

    @property
    def savings_usd(self) -> float | None:
        """`uncached_cost_usd - cost_usd`; negative when writes cost more than they saved."""
        if self.cost_usd is None or self.uncached_cost_usd is None:
            return None
        return self.uncached_cost_usd - self.cost_usd


# --- pure core ---------------------------------------------------------------------------------


def sent_params_digest(exchange: Exchange, body: JSONObject) -> bytes:
    """`params_digest` of `body` (the body sent), once per request (`Exchange.sent_params`)."""
    found = exchange.sent_params
    if found is not None and found[0] is body:
        return found[1]
    digest = params_digest(exchange.adapter, body)
    exchange.sent_params = (body, digest)
    return digest


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
    unchanged key is the same object) or a rewriting stage scanned last (`Exchange.layout_cache`)
    reuses those runs; a key the stages changed is laid out by `adapter.relayout` from the
    client's runs (the runs of its unchanged messages reused) when the adapter can. The runs it
    shares with the scan of the tenant's recent body (`proxy.pipeline.rawprefix.Kept.scan`: the
    same run objects) are not walked again, nor (chained only) the blocks of the elements
    `parse` took from a kept body around an edit (`RawMatch.around`).
    """
    found = exchange.sent_prompt
    if found is not None and found[0] is body:
        return found[1]
    adapter = exchange.adapter
    known = exchange.client_runs or {}
    cache = exchange.layout_cache
    runs: list[Any] = []
    for key in adapter.prefix_keys:
        if key not in body:
            continue
        value = body[key]
        hit = known.get(key)
        if hit is not None and hit[0] is value:
            runs.extend(hit[1])
            continue
        scanned = cache.runs_of(key, value) if cache is not None else None
        if scanned is not None:
            runs.extend(scanned)
            continue
        redone = adapter.relayout(key, value, hit[0], hit[1]) if hit is not None else None
        runs.extend(redone[0] if redone is not None else adapter.layout({key: value}))
    match = exchange.raw_match
    kept = match.kept if match is not None else None
    earlier = kept.scan if kept is not None else None
    # a scan resumed from the recent body's copies its runs: the record's sidecars are not needed
    reuse = reuse_for(exchange, body) if earlier is None or not resumes(earlier, runs) else None
    # the kept body `parse` took trailing elements from (`rawprefix.parse_around`): their blocks
    around = match.around.scan if match is not None and match.around is not None else None
    prompt = scan_prompt(runs, reuse, earlier, around)
    exchange.sent_prompt = (body, prompt)
    if match is not None and match.fresh is not None:
        match.fresh.scan = prompt  # the next request copies what its runs share with these
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
    seen, keys = view.items, view.keys  # `view.key_of`, inlined: one pass over long histories
    known = min(len(seen), len(keys))
    columns = exchange.stored_columns
    if columns is not None and columns.of(sidecars, frozenset()) is not None:
        # positions 0..n-1: the leading elements that are the client's objects, sent as digested
        stop = min(len(items), len(sidecars), known)
        if all(map(is_, items[:stop], seen[:stop])) and keys[:stop] == columns.sent(stop):
            same = stop
    for i, (item, sidecar) in enumerate(zip(items[same:], sidecars[same:], strict=False), same):
        if sidecar.position != i:
            break
        if i < known and seen[i] is item:
            key = keys[i]
        else:
            hit = replayed.get(i)
            if hit is None or hit[0] is not item:
                break
            key = xxhash.xxh3_128_digest(hit[1])
        if key != (sidecar.value_digest or sidecar.sent_digest()):
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
    `VOLATILE_SCAN_CHARS` of the block); `None` without rules or volatile rules. Volatile as
    replay masks it (`proxy.rules.volatile_patterns`): the `volatile` rules and the pinned ones
    whose changes move to the user message (Claude Code's billing header)."""
    patterns = volatile_patterns(rules) if hasattr(rules, "rules") else ()
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


def sent_marker_positions(exchange: Exchange, body: JSONObject, prompt: PromptScan) -> tuple[int, ...]:
    """The blocks of the body as sent (`body`, scanned as `prompt`) that carry a marker by its
    adapter's rules (`proxy.divergence.marked_positions`): what measurement compares and the
    session record keeps."""
    return _markers(body, prompt, read_rules(exchange.adapter, body))


def _markers(body: JSONObject, prompt: PromptScan, rules: ReadRules) -> tuple[int, ...]:
    values = prompt.values
    candidates: Sequence[int] = prompt.marked if rules.marker_key in MARKER_KEYS else range(len(values))
    return marked_positions(candidates, values, body, rules)


def _current(exchange: Exchange, body: JSONObject, prompt: PromptScan, rules: ReadRules) -> Prompt:
    """The sent body as `proxy.divergence` compares it, from its scan."""
    return Prompt(
        prompt.chain,
        prompt.blocks,
        prompt.kinds,
        _markers(body, prompt, rules),
        request_model(body),
        sent_params_digest(exchange, body),
    )


def measure(exchange: Exchange, services: Services) -> None:
    """Measure one finished exchange (see the module docstring); 2xx JSON requests only. A
    request over the pipeline budget gets its cost only (`proxy.pipeline.budget`)."""
    if exchange.body is None or not 200 <= exchange.status < 300:
        return
    if exchange.over_budget is not None:
        _count_cost(exchange, services)
        return
    body = sent_body(exchange)
    if body is None:
        return
    prompt = sent_prompt(exchange, body)
    exchange.sent_chain = prompt.chain
    adapter = exchange.adapter
    min_tokens = _request_min_tokens(services, exchange)
    rules = read_rules(adapter, body, min_tokens)
    counter = services.tokens
    usage = exchange.usage
    found = compare(
        exchange.previous,
        _current(exchange, body, prompt, rules),
        rules,
        history_rewritten=exchange.history_rewritten is not None,
        is_volatile=_checker(_rules(services)),
        usage=usage,
        predictor=read_predictor(
            adapter, body, len(prompt.blocks), min_tokens, counter.count if counter is not None else None
        ),
    )
    divergence, cause, predicted = found.divergence, found.cause, found.predicted_read_tokens
    family, prices = services.pricing.lookup(exchange.provider, request_model(body))
    cost = uncached = None
    if usage is not None and prices is not None:
        cost, uncached = prices.cost(usage), prices.uncached_cost(usage)
    requested = exchange.is_diagnostics_requested
    result = Measurement(
        provider=exchange.provider,
        family=family,
        divergence=divergence,
        block_path=found.block_path,
        prompt_blocks=len(prompt.blocks),
        prompt_bytes=prompt.chain.total_bytes,
        predicted_read_tokens=predicted,
        predicted_breakpoint=found.predicted_breakpoint,
        cause=cause,
        usage=usage,
        cost_usd=cost,
        uncached_cost_usd=uncached,
        upstream_reason=(usage.cache_miss_reason if usage is not None else None) if requested else None,
        diagnosis=agreement(adapter.diagnostic_causes, usage.cache_miss_reason, cause)
        if requested and usage is not None
        else None,
        block_kind=found.block_kind,
    )
    exchange.measurement = result
    _record(result, services, requested)
    if cost is not None and uncached is not None:
        attribute_cost(exchange, services, cost, uncached)
    if not _log.isEnabledFor(logging.DEBUG):
        return
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


_MIN_TOKENS: list[Callable[[Services, Exchange], int]] = []
"""`proxy.pipeline.support.request_min_tokens` once imported (the pipeline imports this module)."""


def _request_min_tokens(services: Services, exchange: Exchange) -> int:
    """`proxy.pipeline.support.request_min_tokens`, imported on first use and kept, so a request
    does not pay for an import statement."""
    if not _MIN_TOKENS:
        from proxy.pipeline.support import request_min_tokens

        _MIN_TOKENS.append(request_min_tokens)
    return _MIN_TOKENS[0](services, exchange)


def _count_cost(exchange: Exchange, services: Services) -> None:
    """The cost and counterfactual cost of the usage alone (no prompt scan, no divergence)."""
    usage, body = exchange.usage, exchange.body
    if usage is None or body is None:
        return
    family, prices = services.pricing.lookup(exchange.provider, request_model(body))
    if prices is None:
        return
    cost, uncached = prices.cost(usage), prices.uncached_cost(usage)
    cost_counter, uncached_counter = services.metrics.measure[exchange.provider].family_cost(family)
    cost_counter.inc(cost)
    uncached_counter.inc(uncached)
    attribute_cost(exchange, services, cost, uncached)


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
