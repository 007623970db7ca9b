"""session: who sent this request, which conversation it continues, and what was sent before.

Stage (`STAGE`, after `parse`, before `canonicalise`; measuring only, so it also runs in
`observe` mode). With `Services.sessions` set (by `proxy.store.store_ctx`) and a JSON body:
1. `exchange.tenant`: keyed hash of the credential and upstream host (`proxy.tenant`);
2. the session (`proxy.session_identity`), `exchange.session_id` and `Exchange.session_inference`
   (`Inference`: kind `explicit` / `append` / `fork` / `new`, parent, shared messages), and
   ONE bounded store read that never fails the request: `Exchange.previous`, the
   `SessionRecord` of the session's last 2xx request (of the parent session for a fork), or
   `None`. An explicit id is read first and its sidecars seed the masking memo; an inferred
   one needs the message view first. A record the request only masks equal to, where a
   message was edited in a volatile value rather than re-rendered, is told apart
   (`told_apart`: the edit compares as changed, and an inferred session diverges there);
3. `Exchange.message_view`: masked digests of the client's messages
   (`proxy.pipeline.replay.view_messages`, volatile patterns of the rules in use), over the
   layout runs the rewriting stages share (`support.layout_cache`); the runs per prefix key
   are left in `Exchange.client_runs` for the response side (`proxy.measure.sent_prompt`).
   Leading messages whose raw bytes a recent request of the tenant held too are not walked
   again (`proxy.pipeline.rawprefix`: an appended turn costs its new bytes);
4. `Exchange.history_rewritten` = the first earlier message whose real content changed
   (absent when none); `Exchange.arrivals` (epoch seconds, this request included);
   `Exchange.tail_misses`: the previous record's count plus one when this request rewrote the
   previous request's newest message first (`proxy.pipeline.replay.tail_rewritten`), or rewrote
   an earlier message (aider rebuilds everything after its few-shot examples: the previous
   tail was not read either), else 0;
5. `Exchange.session_pins` (the previous record's pins: the mapping form of
   `proxy.pipeline.canonicalise.SessionPins`, `None` without one) and `Exchange.plan_context`
   (`proxy.pipeline.breakpoints.PlanContext`: previous marker positions, TTLs from pacing,
   `tail_misses`).

Response side: `after_response(exchange, services)` runs after the last byte went to the
client, for 2xx responses only (a 4xx or 5xx never updates state). It builds the new
`SessionRecord` from what was SENT (chain, markers and their TTLs, model, params, sidecars,
pins: tool pins from the blocks sent, pinned system segments from the pin stage's
`Exchange.pinned_segments`, `tail_misses`), hands it to the store's bounded background writer
(`RecordStore.save_soon`: the handler never waits on the store, and the write survives the
client leaving) and registers the request in the inference index.
It never raises. Nothing is digested twice: the chain and markers come from
`proxy.measure.sent_prompt` (computed once per request), a sidecar's bytes from the message
view (`MessageView.key_of`: its digest) or the replay stage (`Exchange.replayed_bytes`) when the
message sent is the very object they describe, and an unchanged sidecar is the previous
record's own object.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from operator import attrgetter, eq, is_
from typing import Any, Final

import xxhash
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.divergence import request_model
from proxy.exchange import Exchange
from proxy.measure import sent_body, sent_marker_positions, sent_params_digest, sent_prompt
from proxy.memory_budget import MemoryBudget
from proxy.pacing import FIVE_MINUTES, MAX_ARRIVALS, ONE_HOUR, Pacing, forecast
from proxy.pipeline import delivered, rawprefix
from proxy.pipeline.blocks import marker_ttl
from proxy.pipeline.breakpoints import PacingInput, PlanContext
from proxy.pipeline.pins import PINS_KEY
from proxy.pipeline.replay import (
    Masker,
    MessageView,
    RawBody,
    StoredColumns,
    VolatileEdit,
    aligned_items,
    compact,
    first_difference,
    first_mismatch,
    first_volatile_edit,
    stored_columns,
    stripped_bytes,
    tail_rewritten,
    view_messages,
    with_edits,
)
from proxy.pipeline.segments import classifier_for, without_volatile
from proxy.pipeline.support import layout_cache, rules_for, scan_budget
from proxy.prefix import MARKER_KEYS, PrefixChain, PromptScan, shared_blocks
from proxy.providers.base import Block, JSONObject, Run, ToolShape
from proxy.rerender import Allowance
from proxy.rules import RuleSet, volatile_patterns
from proxy.services import Services
from proxy.session_identity import Inference, SessionState, explicit_id, explicit_session, fork_id, root_id
from proxy.store import RecordStore
from proxy.store.codec import SessionRecord, Sidecar

_log = logging.getLogger("promptcache.session")
MAX_PINNED_TOOLS: Final = 512
AGENT_HEADER: Final = "x-claude-code-agent-id"
"""Claude Code names a subagent's requests with this header (docs/provider-rules.md 9)."""


def masker_for(state: SessionState, services: Services) -> Masker:
    """The `Masker` of the rules in use (`support.rules_for`), built once per `RuleSet` (a reload
    swaps the object). Unloadable rules mask nothing (replay then needs identical text)."""
    try:
        rules: RuleSet | None = rules_for(services)
    except ValueError:
        rules = None
    cached = state.masker
    if cached is not None and cached[0] is rules:
        return cached[1]
    budget = MemoryBudget.of_mb(services.settings.memory_budget_mb)
    memo_size, parsed = budget.masker_entries, budget.parsed_bytes
    if rules is None:
        masker = Masker((), memo_size, max_parsed_bytes=parsed)
    else:
        masker = Masker(
            volatile_patterns(rules),
            memo_size,
            system_text=partial(without_volatile, classifier_for(rules)),
            max_parsed_bytes=parsed,
        )
    state.masker = (rules, masker)
    return masker


class SessionStage:
    name: Final = "session"
    rewrites: Final = False

    async def run(self, exchange: Exchange, services: Services) -> None:
        state: SessionState | None = services.sessions
        body = exchange.body
        if state is None or body is None or exchange.is_anonymous:
            return  # no credential, no state: nothing read, nothing stored
        tenant = state.tenant_of(exchange.provider, exchange.headers)
        exchange.tenant = tenant
        now = state.clock()
        masker = masker_for(state, services)
        store = services.store
        explicit = explicit_session(exchange.headers, body, state.header_names, exchange.adapter)
        previous: SessionRecord | None = None
        runs = client_runs(exchange, services, body)
        budget = services.settings.classify_budget_chars
        segment_budget = scan_budget(exchange, services)
        # the body is the parse of these bytes (no stage before this one rewrites it)
        raw = (
            RawBody(exchange.raw, raw_scope(tenant, exchange), exchange.raw_match)
            if exchange.upstream_body is None
            else None
        )
        if explicit is not None:
            sid = explicit_id(explicit[1])
            inference = Inference(sid, "explicit", sid)
            previous = await store.load(tenant, sid) if store is not None else None
            if previous is not None:
                masker.seed(previous.sidecars)
            view = view_messages(exchange.adapter, body, masker, runs, budget, segment_budget, raw)
        else:
            view = view_messages(exchange.adapter, body, masker, runs, budget, segment_budget, raw)
            inference = state.index.infer(tenant, view.boundaries)
            source = inference.parent if inference.kind == "fork" else inference.session_id
            if source is not None and store is not None:
                previous = await store.load(tenant, source)
        if previous is not None:
            found = await told_apart(state, store, tenant, view, inference, previous, exchange, now)
            view, inference, previous = found
        if view.is_budget_spent:
            services.metrics.rules_budget_exceeded.labels("session").inc()
        fresh = raw.match.fresh if raw is not None and raw.match is not None else None
        if fresh is not None:  # the next request of the tenant lays out only its new messages
            fresh.runs = exchange.client_runs
            fresh.scans = raw.match.scans if raw is not None and raw.match is not None else None
        exchange.message_view = view
        exchange.session_inference = inference
        if inference.session_id is None:
            return
        exchange.session_id = inference.session_id
        exchange.previous = previous
        keep_warm = services.keep_warm
        if keep_warm is not None and keep_warm.cancel(tenant, inference.session_id, now):
            exchange.is_kept_warm = True
        arrivals = ((previous.arrivals if previous is not None else ()) + (now,))[-MAX_ARRIVALS:]
        exchange.arrivals = arrivals
        shared_arrivals = state.heads.observe(tenant, view.head, now)
        tail_misses = 0
        if previous is not None:
            columns = exchange.stored_columns = previous_columns(exchange, previous)
            rewritten = first_mismatch(view.digests, previous.sidecars, view.system_positions, columns)
            exchange.history_rewritten = rewritten
            if tail_rewritten(view.digests, previous.sidecars, view.system_positions, columns) or (
                rewritten is not None and rewritten <= newest_position(previous)
            ):
                tail_misses = previous.tail_misses + 1
        exchange.tail_misses = tail_misses
        exchange.session_pins = previous.pins if previous is not None and previous.pins else None
        pacing = await pacing_input(exchange, state, store, previous, now, shared_arrivals)
        exchange.plan_context = make_plan_context(
            previous, "5m", "5m", tail_misses, exchange.history_rewritten, pacing
        )


def previous_columns(exchange: Exchange, previous: SessionRecord) -> StoredColumns:
    """`stored_columns(previous.sidecars)`, made once per request (`told_apart` made them)."""
    known = exchange.stored_columns
    if known is not None and known.sidecars is previous.sidecars:
        return known
    return stored_columns(previous.sidecars)


MAX_RETRIES: Final = 3
"""Records session inference tries for one request when each differs from it in an edited
volatile value (`told_apart`)."""


async def told_apart(
    state: SessionState,
    store: RecordStore | None,
    tenant: str,
    view: MessageView,
    inference: Inference,
    previous: SessionRecord,
    exchange: Exchange,
    now: float,
) -> tuple[MessageView, Inference, SessionRecord | None]:
    """The message view, inference and previous record once the request is told apart from a
    record it only masks equal to (`proxy.pipeline.replay.first_volatile_edit`: a person's edit
    of a date-time, counter or id, not a re-render).

    An explicit session keeps its record; the edited message compares as changed
    (`with_edits`), so replay sends it as the client wrote it. An inferred one diverges there:
    its identity chain follows the edit and inference is asked again (at most `MAX_RETRIES`
    records), so a conversation of the same tenant that differs only in such a value is
    another session, not a fork that would hand this request its messages. When inference
    lands on the same record again, the request is a fork of it at the edit (that record is
    its previous request, compared as changed from the edit on; its own record goes under the
    fork's id, never over the other conversation's). After `MAX_RETRIES` records that each
    differ, the request starts a session of its own (an id of its marked chain) with no
    previous record. `now`: the request's arrival (epoch seconds, `SessionState.clock`)."""
    optional = exchange.adapter.identity_optional
    chained: list[VolatileEdit] = []
    source = inference.parent if inference.kind == "fork" else inference.session_id
    record: SessionRecord | None = previous
    marked = view
    allowance = Allowance()  # one for the request, whichever records it is compared with
    for _ in range(MAX_RETRIES):
        if record is None:
            return marked, inference, None
        elapsed = now - record.started if record.started > 0 else math.inf
        columns = exchange.stored_columns = stored_columns(record.sidecars)
        edit = first_volatile_edit(
            view, record.sidecars, elapsed, optional, columns, allowance, exchange.adapter.identity_nulls
        )
        if edit is None:
            return marked, inference, record
        chained.append(edit)
        if inference.kind == "explicit" or source is None:
            return with_edits(view, edit, chained), inference, record
        marked = with_edits(view, None, chained)
        again = state.index.infer(tenant, marked.boundaries)
        again_source = again.parent if again.kind == "fork" else again.session_id
        if again_source == source:
            if again.kind != "fork":
                # what inference answers when the index holds the record's chain (a restart
                # emptied it, or the record's session fell out): the same fork id either way
                at = edit.position
                again = Inference(fork_id(source, marked.boundaries[max(at - 1, 0)]), "fork", source, at)
            return with_edits(view, edit, chained), again, record
        inference, source = again, again_source
        record = await store.load(tenant, source) if source is not None and store is not None else None
    # every record tried differs: the last one loaded is not compared, and not used
    return marked, Inference(root_id(marked.boundaries[-1]), "new"), None


def raw_scope(tenant: str, exchange: Exchange) -> str:
    """Whose recent raw bodies this request's may be compared with (`rawprefix`)."""
    return f"{tenant}\x00{exchange.path}"


def raw_match(exchange: Exchange, services: Services) -> rawprefix.RawMatch | None:
    """The client's raw body against the recent bodies of its tenant and path
    (`rawprefix.match_raw` on the masker's index), made once before parsing for the budget
    check, `parse` and the message view; `None` without session state or a credential, or
    for a body too small to index."""
    state: SessionState | None = services.sessions
    if state is None or exchange.is_anonymous or len(exchange.raw) < rawprefix.MIN_BYTES:
        return None
    tenant = state.tenant_of(exchange.provider, exchange.headers)
    index = masker_for(state, services).raw_index
    return rawprefix.match_raw(index, raw_scope(tenant, exchange), exchange.raw)


def newest_position(record: SessionRecord) -> int:
    """Message-array position of the newest message the record's request sent (-1 without one)."""
    return max((s.position for s in record.sidecars), default=-1)


def is_subagent(headers: Mapping[str, str]) -> bool:
    """A request that names a subagent (machine-paced: docs/provider-rules.md 9)."""
    if isinstance(headers, CIMultiDictProxy | CIMultiDict):  # case-insensitive: one lookup
        return AGENT_HEADER in headers
    return any(k.lower() == AGENT_HEADER for k in headers)


async def pacing_input(
    exchange: Exchange,
    state: SessionState,
    store: RecordStore | None,
    previous: SessionRecord | None,
    now: float,
    shared_arrivals: Sequence[float],
) -> PacingInput:
    """Add the gap since the session's previous request to the session's and the tenant's
    pacing (by the previous response's kind; a subagent's gaps are not the parent's), keep the
    session's in `Exchange.pacing` for its record, and forecast the next gap (`proxy.pacing`).
    The previous request's entries count as gone (`PacingInput.expired`) after their TTL, or
    when this request names another model (nothing it sends reads them)."""
    tenant = exchange.tenant or ""
    agent = is_subagent(exchange.headers)
    tenant_pacing = await state.pacing.get(tenant, store)
    session_pacing = previous.pacing if previous is not None else Pacing()
    expired = False
    if previous is not None and previous.arrivals:
        gap = now - previous.arrivals[-1]
        tail = previous.ttls[-1] if previous.ttls else "5m"
        expired = gap >= ONE_HOUR or (gap >= FIVE_MINUTES and tail != "1h")
        # another model reads none of the previous entries (docs/provider-rules.md 1.8: the cache is per model)
        expired = expired or (exchange.body is not None and request_model(exchange.body) != previous.model)
        if not agent and previous.turn is not None:
            session_pacing = session_pacing.with_gap(previous.turn, gap)
            tenant_pacing = tenant_pacing.with_gap(previous.turn, gap)
            state.pacing.put(tenant, tenant_pacing)
    exchange.pacing = session_pacing
    shared_live = len(shared_arrivals) >= 2 and now - shared_arrivals[-2] < FIVE_MINUTES
    return PacingInput(forecast(session_pacing, tenant_pacing), agent, expired, shared_live)


def client_runs(exchange: Exchange, services: Services, body: JSONObject) -> list[Run]:
    """The layout runs of the client's `body`, per prefix key from the request's shared
    `LayoutCache` (the rewriting stages reuse them; in `observe` mode nothing scans, so plain
    `layout` per key); kept by key in `Exchange.client_runs` as `(value, runs)`."""
    adapter = exchange.adapter
    by_key: dict[str, tuple[Any, list[Run]]] = {}
    runs: list[Run] = []
    if services.settings.mode == "observe":
        match = exchange.raw_match
        # the recent body sharing the body's first bytes, else the one `parse` took its last
        # messages from (a new session re-sending a conversation: its runs are laid out again
        # only for the messages that are not those objects at the same positions)
        source = (match.kept or match.around) if match is not None else None
        kept = source.runs if source is not None else None
        for key in adapter.prefix_keys:
            if key in body:
                value = body[key]
                hit = kept.get(key) if kept is not None else None
                if hit is not None and hit[0] is value:  # the recent body's own value (`parse`)
                    by_key[key] = hit
                else:
                    redone = adapter.relayout(key, value, hit[0], hit[1]) if hit is not None else None
                    by_key[key] = (value, redone[0] if redone is not None else adapter.layout({key: value}))
                runs.extend(by_key[key][1])
    else:
        policy = adapter.marker_policy(body)
        call_kinds = adapter.tool_shape.call_kinds
        cache = layout_cache(exchange)
        match = exchange.raw_match
        seed = match.kept if match is not None else None
        if seed is None or seed.scans is None:  # else the body `parse` took its last messages from
            seed = match.around if match is not None else None
        if seed is not None and seed.scans is not None:
            cache.seed(seed.scans)  # the recent body's scans: its messages are these objects
        for key, scan in cache.scans(adapter, body, policy, call_kinds):
            by_key[key] = (body[key], scan.runs)
            runs.extend(scan.runs)
        if match is not None:
            match.scans = cache.snapshot()
    exchange.client_runs = by_key
    return runs


def make_plan_context(
    previous: SessionRecord | None,
    shared_ttl: str,
    session_ttl: str,
    tail_misses: int = 0,
    rewritten_from: int | None = None,
    pacing: PacingInput | None = None,
) -> PlanContext:
    """What the breakpoints stage needs from the session: the previous request's marker
    positions (bridge breakpoints), the TTLs (or the forecast the planner chooses them from),
    the count of consecutive rewritten newest messages (wasted tail writes) and the first
    rewritten message."""
    return PlanContext(
        previous.breakpoints if previous is not None else (),
        shared_ttl,
        session_ttl,
        tail_misses,
        rewritten_from,
        pacing,
        first=previous is None,
    )


def sent_markers(
    blocks: Sequence[Block], body: JSONObject, positions: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The marker `positions` of the body as sent (`proxy.divergence.marker_positions`) and the
    TTL of each (a top-level automatic marker lends its TTL to the last block)."""
    ttls = []
    for i in positions:
        value = blocks[i].value
        own = [value[k] for k in MARKER_KEYS if isinstance(value, dict) and value.get(k) is not None]
        top = [body[k] for k in MARKER_KEYS if body.get(k) is not None]
        ttls.append(marker_ttl(own[0] if own else top[0] if top else None))
    return positions, tuple(ttls)


def _dig(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def update_pins(
    previous: Mapping[str, Any] | None, blocks: Sequence[Block], shape: ToolShape
) -> dict[str, Any]:
    """Pins after a request was sent as `blocks`: first seen wins (pure; `previous` kept as is).

    Keys are those of `proxy.pipeline.canonicalise.SessionPins`: `pinned_tool_order` (names,
    first-seen order, new names appended in sent order), `pinned_schemas` (name -> first-seen
    schema) and `pinned_inputs` (name -> first-seen tool-call input); at most `MAX_PINNED_TOOLS`
    names each.
    """
    tools = [block.value for block in blocks if block.section == "tools"]
    calls = [
        block.value
        for block in blocks
        if block.section != "tools" and block.kind in shape.call_kinds and isinstance(block.value, dict)
    ]
    return pins_after(previous, tools, calls, shape)


def pins_after(
    previous: Mapping[str, Any] | None, tools: Iterable[Any], calls: Iterable[Any], shape: ToolShape
) -> dict[str, Any]:
    """`update_pins` given the tool definitions and the tool-call blocks sent, in order."""
    previous = previous or {}
    order = list(previous.get("pinned_tool_order", ()))
    schemas = dict(previous.get("pinned_schemas", {}))
    inputs = dict(previous.get("pinned_inputs", {}))
    known = set(order)
    for value in tools:
        name = _dig(value, shape.name_path)
        if not isinstance(name, str):
            continue
        if name not in known and len(order) < MAX_PINNED_TOOLS:
            order.append(name)
            known.add(name)
        schema = _dig(value, shape.schema_path)
        if schema is not None and name not in schemas and len(schemas) < MAX_PINNED_TOOLS:
            schemas[name] = schema
    for value in calls:
        name = value.get(shape.call_name_key)
        call_input = value.get(shape.call_input_key)
        if isinstance(name, str) and isinstance(call_input, dict) and name not in inputs:
            if len(inputs) < MAX_PINNED_TOOLS:
                inputs[name] = call_input
    return {"pinned_tool_order": order, "pinned_schemas": schemas, "pinned_inputs": inputs}


def calls_from(prompt: PromptScan, previous: SessionRecord | None, pins: Mapping[str, Any] | None) -> int:
    """The first block whose tool calls can change the pins `pins_after` derives from `pins`
    (the `previous` record's): the first after the blocks `previous` was sent with too (same
    chain digests, so the same calls), else the first after the tools. Each of those calls was
    walked when `previous` was built, and first seen wins, so walking it again changes nothing:
    its name is pinned already, the pins were full (they never shrink) or it has no name or
    input. An appended turn walks its new calls only (a 600 KB history's thousand-odd calls
    took 9% of an appended turn's event-loop time)."""
    start = prompt.tools
    if previous is None or pins is None or not previous.chain:
        return start
    return max(start, shared_blocks(PrefixChain(previous.chain, previous.ends), prompt.chain))


def record_pins(exchange: Exchange, tool_pins: dict[str, Any]) -> dict[str, Any]:
    """`tool_pins` plus the pinned system segments (`proxy.pipeline.pins`): the pin stage's
    mapping for this request, else (the stage did not run: `observe` mode, no rules with
    `pin`) the previous record's, kept as is."""
    segments: Any = exchange.pinned_segments
    if segments is None:
        previous = exchange.session_pins
        segments = previous.get(PINS_KEY) if previous is not None else None
    return {**tool_pins, PINS_KEY: segments} if segments else tool_pins


def unchanged_sidecars(
    items: Sequence[Any], view: MessageView, previous: Sequence[Sidecar], columns: StoredColumns
) -> int:
    """How many leading elements of `items` (the message array as sent) `build_sidecars` would
    give the `previous` record's very sidecar: each the object `view` digested, with the masked
    and exact digests and the sent bytes' digest (`MessageView.keys`) of that sidecar. Compared
    as whole columns at memory speed (`columns`: `stored_columns(previous)`, positions `0..n-1`
    only; 0 otherwise), so an appended turn's record walks its new elements only (the walk of a
    600 KB history's elements was 13% of an appended turn's CPU under cProfile)."""
    stored = columns.of(previous, frozenset())
    if stored is None:
        return 0
    stop = min(len(items), len(view.items), len(view.keys), len(view.digests), len(view.exact), len(stored))
    if stop <= 0:
        return 0
    seen = view.items
    if not all(map(is_, items[:stop], seen[:stop])):
        stop = next(i for i in range(stop) if items[i] is not seen[i])
    stop = first_difference(view.digests, stored, stop)
    stop = first_difference(view.exact, columns.exacts(stop), stop)
    return first_difference(view.keys, columns.sent(stop), stop)


_DIGEST: Final = attrgetter("digest")
_EXACT: Final = attrgetter("exact")
_VALUE_DIGEST: Final = attrgetter("value_digest")


def donor_matches(items: Sequence[Any], view: MessageView, donor: Sequence[Sidecar]) -> list[bool] | None:
    """Per element of `items` (the message array as sent), whether `build_sidecars` gives it a
    sidecar equal to `donor`'s at the same position: the very object `view` digested, with
    that sidecar's masked and exact digests and sent bytes' digest (`Sidecar.value_digest`:
    the bytes `view` keys it by). `donor`: the sidecars recorded for a recent body whose
    elements these are, positions `0..len(donor) - 1` in order (`rawprefix.Kept.sidecars`: a
    new session re-sending a recent conversation). Compared as columns at memory speed;
    `None` when `donor` cannot match (another length, system-section positions)."""
    n = len(items)
    seen, keys, digests, exacts = view.items, view.keys, view.recorded, view.exact
    if not n or view.system_positions or min(len(donor), len(seen), len(keys), len(digests), len(exacts)) < n:
        return None
    if donor[n - 1].position != n - 1:
        return None
    tail = donor[:n]
    return list(
        map(
            all,
            zip(
                map(is_, items, seen),
                map(eq, digests, map(_DIGEST, tail)),
                map(eq, exacts, map(_EXACT, tail)),
                map(eq, keys, map(_VALUE_DIGEST, tail)),
                strict=True,
            ),
        )
    )


def build_sidecars(
    items: Sequence[Any],
    view: MessageView,
    replayed: Mapping[int, tuple[Any, bytes]],
    previous: Sequence[Sidecar],
    columns: StoredColumns | None = None,
    donor: Sequence[Sidecar] = (),
) -> tuple[Sidecar, ...]:
    """One sidecar per sent element (system positions excluded): its masked and exact client
    digests and `stripped_bytes` of what was sent.

    An element sent as the very object `view` digested is known by its digest
    (`MessageView.key_of`) and, when the view serialised it, by its bytes
    (`MessageView.stripped`); one sent as replayed by its bytes (`replayed`: position ->
    `(value sent, its stripped bytes)`); a sidecar equal to the previous record's at the same
    position is that object, so only elements the view did not see are dumped here.
    `columns`: `stored_columns(previous)` when the caller has it (the leading unchanged
    sidecars are then found at memory speed: `unchanged_sidecars`; the same answer). `donor`
    (without `previous`): a recent body's record sidecars (`donor_matches`); the elements it
    holds equal sidecars for are given those (equal) objects.
    """
    skip = view.system_positions
    digests, exacts = view.recorded, view.exact
    seen, keys = view.items, view.keys  # `view.key_of`, inlined: one pass over long histories
    known = min(len(seen), len(keys))
    dumped = view.stripped if len(view.stripped) == known else ()
    kept = unchanged_sidecars(items, view, previous, columns) if columns is not None and not skip else 0
    out = list(previous[:kept])
    before = {s.position: s for s in (previous[kept:] if kept else previous)}
    matches = donor_matches(items, view, donor) if donor and not previous else None
    for i in range(kept, len(items)):
        if matches is not None and matches[i]:
            out.append(donor[i])
            continue
        item = items[i]
        if skip and i in skip:
            continue
        digest, exact = digests[i], exacts[i]
        key = keys[i] if i < known and seen[i] is item else None
        data: bytes | None = dumped[i] if key is not None and dumped else None
        if key is None:
            hit = replayed.get(i)
            data = hit[1] if hit is not None and hit[0] is item else compact(stripped_bytes(item))
        old = before.get(i)
        if (
            old is not None
            and old.digest == digest
            and old.exact == exact
            and ((old.value_digest or old.sent_digest()) == key if data is None else old.value == data)
        ):
            out.append(old)
            continue
        if data is None:
            data = compact(stripped_bytes(item))
        out.append(Sidecar(i, digest, data, exact, key or xxhash.xxh3_128_digest(data)))
    return tuple(out)


def build_record(exchange: Exchange, body: JSONObject, view: MessageView | None) -> SessionRecord:
    """The session's new record from the body as sent (module docstring)."""
    adapter = exchange.adapter
    prompt = sent_prompt(exchange, body)
    chain = prompt.chain
    blocks = prompt.blocks
    breakpoints, ttls = sent_markers(blocks, body, sent_marker_positions(exchange, body, prompt))
    previous = exchange.previous
    sidecars: tuple[Sidecar, ...] = ()
    if view is not None and view.array_key is not None and view.is_list:
        items = body.get(view.array_key)
        aligned = aligned_items(items, view, exchange.head_dropped) if isinstance(items, list) else None
        if aligned is not None:
            match = exchange.raw_match
            around = match.around if match is not None else None
            sidecars = build_sidecars(
                aligned,
                view,
                exchange.replayed_bytes or {},
                previous.sidecars if previous is not None else (),
                exchange.stored_columns,
                around.sidecars if around is not None and around.sidecars is not None else (),
            )
            fresh = match.fresh if match is not None else None
            if fresh is not None and sidecars and sidecars[-1].position == len(sidecars) - 1:
                fresh.sidecars = sidecars  # positions 0..n-1 (increasing): the next new session's donor
    shape = adapter.tool_shape
    values, kinds, call_kinds = prompt.values, prompt.kinds, shape.call_kinds
    calls = [
        values[i]
        for i in range(calls_from(prompt, previous, exchange.session_pins), len(values))
        if kinds[i] in call_kinds and isinstance(values[i], dict)
    ]
    usage = exchange.usage
    turn = usage.turn if usage is not None else None
    session_pacing = exchange.pacing
    if session_pacing is None:
        session_pacing = previous.pacing if previous is not None else Pacing()
    return SessionRecord(
        chain=chain.chain,
        ends=chain.ends,
        model=request_model(body),
        params_digest=sent_params_digest(exchange, body),
        breakpoints=breakpoints,
        ttls=ttls,
        arrivals=exchange.arrivals,
        last_response_id=usage.response_id if usage is not None else None,
        sidecars=sidecars,
        pins=record_pins(exchange, pins_after(exchange.session_pins, values[: prompt.tools], calls, shape)),
        turns=(previous.turns if previous is not None else 0) + 1,
        head=view.head if view is not None else b"",
        tail_misses=exchange.tail_misses,
        pacing=session_pacing.with_response(turn) if not is_subagent(exchange.headers) else session_pacing,
        turn=turn,
        delivered=record_delivered(exchange),
        started=session_started(previous, exchange.arrivals),
    )


def session_started(previous: SessionRecord | None, arrivals: Sequence[float]) -> float:
    """`SessionRecord.started` of the new record: the previous record's; for a record written
    before it was kept, its oldest arrival held (a later time than the session's start when the
    session had more turns than it holds, so a re-render of its first messages may read as an
    edit once); this request's arrival for a new session."""
    if previous is not None and previous.started:
        return previous.started
    if previous is not None and previous.arrivals:
        return previous.arrivals[0]
    return arrivals[0] if arrivals else 0.0


def record_delivered(exchange: Exchange) -> tuple[tuple[str, str, int], ...]:
    """The moved notes the session's history holds after this request: the reorder and pin
    stages' entries, else (they did not run) the previous record's still carried
    (`proxy.pipeline.delivered`)."""
    if exchange.delivered_notes is not None:
        return exchange.delivered_notes
    return tuple(sorted(delivered.carried_notes(exchange).values()))


def after_response(exchange: Exchange, services: Services) -> None:
    """Build the session's record after a 2xx response and hand it to the store's background
    writer (`RecordStore.save_soon`: nothing here waits on the store); never raises."""
    state: SessionState | None = services.sessions
    store = services.store
    tenant, session = exchange.tenant, exchange.session_id
    if state is None or store is None or tenant is None or session is None:
        return
    if not 200 <= exchange.status < 300:
        return
    try:
        body = sent_body(exchange)
        if body is None:
            return
        view = exchange.message_view
        record = build_record(exchange, body, view)
    except Exception as exc:  # noqa: BLE001 - the response is already out; never fail it
        services.metrics.stage_errors.labels("session").inc()
        _log.warning("session record not built (%s)", type(exc).__name__)
        return
    store.save_soon(tenant, session, record)
    if record.turn is not None and not is_subagent(exchange.headers):
        state.pacing.record_response(tenant, record.turn, store)
    if view is not None:
        state.index.register(tenant, session, view.boundaries)


STAGE: Final = SessionStage()
