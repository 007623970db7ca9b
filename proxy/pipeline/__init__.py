"""The request pipeline: stages in one order, written once, each failing open.

Order (data, not control flow): `REQUEST_STAGES`. `forward` (proxy.forward) is the terminal
step and `observe` runs on the response path.

Stage contract:
1. A stage only mutates the `Exchange` (copy-on-write on `exchange.body`: never edit the
   client's parsed objects in place after `parse`).
2. Stages do no network I/O, except `session` (one bounded store read), `forward` and
   `observe`.
3. An exception in a stage is logged (without request content) and counted in
   `promptcache_stage_errors_total{stage}`; the remaining stages are skipped and the client's
   original bytes go upstream unchanged.
4. Only `forward` produces a local reply.

With tracing on (`proxy/tracing.py`), each stage that runs gets a `promptcache.stage.<name>`
span under the request's span.

A body over the pipeline budget (`proxy.pipeline.budget`) goes upstream as sent: over
`pipeline_budget_bytes`, `pipeline_budget_nodes` or `pipeline_budget_values` (raw-byte checks) no stage runs, over
`pipeline_budget_blocks` only `parse`; the response side then counts its usage only.

In `observe` mode, and for a signed request (`exchange.is_signed`: SigV4 covers the body), only
the measuring stages run (`Stage.rewrites` false) and the bytes sent are
the client's.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final, Protocol

import orjson

from proxy import malformed
from proxy.exchange import Exchange
from proxy.pipeline import (
    breakpoints,
    canonicalise,
    diagnostics,
    parse,
    pins,
    platform,
    rawprefix,
    reorder,
    replay,
    serialise,
    session,
)
from proxy.pipeline.budget import blocks_over_budget, counted_blocks, raw_over_budget
from proxy.providers.base import JSONObject
from proxy.services import Services
from proxy.tracing import CURRENT as CURRENT_TRACE

_log = logging.getLogger("promptcache.pipeline")


class Stage(Protocol):
    @property
    def name(self) -> str:
        """Metric label; one of `proxy.metrics.STAGES`."""
        ...

    @property
    def rewrites(self) -> bool:
        """True when the stage changes what goes upstream (skipped in `observe` mode)."""
        ...

    async def run(self, exchange: Exchange, services: Services) -> None: ...


REQUEST_STAGES: Final[tuple[Stage, ...]] = (
    parse.STAGE,
    session.STAGE,
    canonicalise.STAGE,
    reorder.STAGE,
    pins.STAGE,
    replay.STAGE,
    diagnostics.STAGE,
    breakpoints.STAGE,
    platform.STAGE,
    serialise.STAGE,
)


def _client_body(raw: bytes) -> JSONObject | None:
    """The client's body as parsed JSON, so measurement sees what is really sent after a fail-open."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


async def run_request_stages(
    exchange: Exchange, services: Services, stages: tuple[Stage, ...] = REQUEST_STAGES
) -> None:
    """Run `stages` in order on `exchange`; never raises (fail open). Malformed parts the
    stages skip are counted (`proxy.malformed`)."""
    # No credential, no state (`Exchange.is_anonymous`): forwarded as sent, the upstream
    # answers 401 as it would, and the session stage neither reads nor writes the store.
    is_observe = services.settings.mode == "observe" or exchange.is_signed or exchange.is_anonymous
    trace = CURRENT_TRACE.get()
    tally = malformed.Tally()
    token = malformed.CURRENT.set(tally)
    try:
        await _run(exchange, services, stages, is_observe, trace, tally)
    finally:
        malformed.CURRENT.reset(token)
        for (stage_name, kind), count in tally.counts.items():
            services.metrics.malformed_parts.labels(stage_name, kind).inc(count)


def _skip_over_budget(exchange: Exchange, services: Services, kind: str, reason: str) -> None:
    """Forward the client's bytes without any further stage (`proxy.pipeline.budget`); counted,
    and the reason kept for the exchange and the caller's `/debug/tenants`."""
    exchange.over_budget = reason
    exchange.upstream_body = None
    exchange.header_overrides = {}
    services.metrics.pipeline_budget_exceeded.labels(kind).inc()
    if not exchange.is_anonymous:
        from proxy.ledger import note_over_budget

        note_over_budget(exchange, services, reason)
    _log.info("request over the pipeline budget (%s): forwarded as sent, not optimised", kind)


def _count_blocks(raw: bytes, body: JSONObject, match: rawprefix.RawMatch | None) -> int | None:
    """`budget.count_blocks(body)` for an indexed body (`None` otherwise: counted the plain way),
    leaving the message array's counts on `match` for the next request; the leading elements
    whose bytes the matched recent body held (`rawprefix.known_counts`) are counted from that
    body's counts, whether or not its parsed elements are still kept."""
    if match is None:
        return None
    array_key: str | None
    array_key, known = rawprefix.known_counts(raw, match.state, match.shared, match.head is not None)
    if known:
        blocks, counts = counted_blocks(body, array_key, known, len(known))
    else:
        kept = match.kept
        array_key = (kept.array_key if kept is not None else None) or _array_key(body)
        blocks, counts = counted_blocks(body, array_key)
    items = body.get(array_key) if array_key is not None else None
    match.counts = (items, counts) if isinstance(items, list) and counts is not None else None
    return blocks


def _array_key(body: JSONObject) -> str | None:
    """The last top-level list of `body` (where the message array is: `messages`, `input`)."""
    for key in reversed(body):
        if isinstance(body[key], list):
            return key
    return None


async def _run(
    exchange: Exchange,
    services: Services,
    stages: tuple[Stage, ...],
    is_observe: bool,
    trace: Any,
    tally: malformed.Tally,
) -> None:
    timers = services.metrics.stage_timers
    settings = services.settings
    match = session.raw_match(exchange, services) if len(exchange.raw) <= settings.pipeline_budget_bytes else None
    counted = None
    if match is not None:  # the shared chunks' counts are the earlier body's
        match.nodes, match.values, nodes, values = rawprefix.chunk_counts(exchange.raw, match.state, match.shared)
        counted = (nodes, values)
    found = raw_over_budget(
        exchange.raw,
        settings.pipeline_budget_bytes,
        settings.pipeline_budget_nodes,
        settings.pipeline_budget_values,
        counted,
    )
    if found is not None:  # not even parsed
        _skip_over_budget(exchange, services, *found)
        return
    exchange.raw_match = match
    is_budget_checked = False
    for stage in stages:
        if not is_budget_checked and stage is not parse.STAGE and exchange.body is not None:
            # once, on the parsed client body: counting its blocks walks every message
            is_budget_checked = True
            blocks = _count_blocks(exchange.raw, exchange.body, match)
            found = blocks_over_budget(exchange.body, settings.pipeline_budget_blocks, blocks)
            if found is not None:
                _skip_over_budget(exchange, services, *found)
                return
        if is_observe and stage.rewrites:
            continue
        tally.stage = stage.name
        started = time.perf_counter()
        span = trace.stage(stage.name) if trace is not None else None
        try:
            await stage.run(exchange, services)
        except Exception as exc:  # noqa: BLE001 - fail open is the contract
            if span is not None:
                span.fail(exc)
            exchange.failed_stage = stage.name
            exchange.upstream_body = None
            exchange.header_overrides = {}
            exchange.body = _client_body(exchange.raw)
            if malformed.is_too_deep(exc):
                malformed.skipped("too_deep")
                _log.info("stage %s: body nested too deeply to rewrite; forwarded as sent", stage.name)
                return
            services.metrics.stage_error_counters[stage.name].inc()
            _log.warning(
                "stage %s failed (%s); forwarding the client's original bytes",
                stage.name,
                type(exc).__name__,
            )
            return
        finally:
            timers[stage.name].observe(time.perf_counter() - started)
            if span is not None:
                span.end()
