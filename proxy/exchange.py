"""`Exchange`: the per-request state every stage reads and writes (the "flow object").

Invariants: `raw` is the client's body exactly as received and is never modified; the bytes
sent upstream are `upstream_body` when a stage produced one, else `raw`. A failing stage resets
`upstream_body` to `None` (fail open). Once the request stages are done and `upstream_body` is
what goes upstream, the handler drops `raw` (`release_raw`): nothing after the stages reads it.

The stage contract is typed: every field below a stage's heading is written by that stage only
(or by the one function named in its docstring) and read by the later stages, measurement and the
response side. A rewriting stage replaces the body with `replace_body()`, which marks it for
`serialise`; nothing else sets `is_body_dirty`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDictProxy

from proxy.providers.base import JSONObject, ProviderAdapter, Usage
from proxy.rules import Budget

if TYPE_CHECKING:
    from proxy.measure import Measurement
    from proxy.pacing import Pacing
    from proxy.pipeline.breakpoints import Plan, PlanContext
    from proxy.pipeline.layout import LayoutCache
    from proxy.pipeline.rawprefix import RawMatch
    from proxy.pipeline.replay import MessageView, StoredColumns
    from proxy.pipeline.support import ModelFacts
    from proxy.prefix import PrefixChain, PromptScan
    from proxy.providers.base import Run
    from proxy.session_identity import Inference
    from proxy.store.codec import SessionRecord


@dataclass(slots=True)
class Exchange:
    adapter: ProviderAdapter
    """The adapter of the API this request speaks (`proxy.providers.Route.adapter`): chosen once
    by the router, it is what every stage asks about the provider and the API."""
    path: str
    """The request path without a routing prefix (`Route.path`): for a pipeline request the API
    path (`adapter.api_path`, also for a platform path such as Vertex's `:rawPredict`); sent
    upstream when `upstream_path` is `None`."""
    query_string: str
    """The query as the client sent it, still percent-encoded (`?` excluded), forwarded as is."""
    headers: CIMultiDictProxy[str]
    raw: bytes
    received_at: float = field(default_factory=time.perf_counter)
    """`time.perf_counter()` when the request body was read (seconds)."""
    body: JSONObject | None = None
    """Parsed request body (`None` when not JSON); stages rewrite it copy-on-write."""
    upstream_body: bytes | None = None
    """Bytes to send upstream; `None` sends `raw` unchanged."""
    tenant: str | None = None
    """Keyed hash of the credential and upstream host; never the credential itself."""
    session_id: str | None = None
    team: str | None = None
    """Team the request's cost is attributed to (`proxy.teams`), resolved on first use."""
    failed_stage: str | None = None
    upstream_path: str | None = None
    """Path sent upstream when it is not `path` (a platform path such as Vertex's
    `...:rawPredict`, percent-encoded as received); `None` sends `path`."""
    path_model: str | None = None
    """The model named by a platform path (Vertex, Bedrock put it there, not in the body)."""
    is_signed: bool = False
    """The request is signed over its body (SigV4): forwarded byte-identical, measured only."""
    undecodable_body: str | None = None
    """Why a body streamed through (`proxy.body_encoding.inflating`) did not decode, once it
    failed mid-stream (set by the handler): answered 400, not as an upstream failure."""
    body_too_large: int | None = None
    """The limit (`max_body_bytes`) a body streamed through passed mid-stream once inflated (set
    by the handler): answered 413, not as an upstream failure."""
    header_overrides: dict[str, str | None] = field(default_factory=dict)
    """Upstream request headers a stage replaces (`None` removes the header), e.g. the
    `anthropic-beta` values a platform rejects dropped."""
    status: int = 0
    usage: Usage | None = None
    is_anonymous: bool = False
    """The request carries no credential header (set by the handler): observe only, nothing
    read from or written to the session store (no credential, no state)."""
    over_budget: str | None = None
    """Why the request was over the pipeline budget (`proxy.pipeline.budget`): only `parse`
    ran, the client's bytes went upstream, only usage is counted; `None` within it."""
    is_usage_counted: bool = False
    """`usage` was added to the token counters (`proxy.pipeline.observe.record_usage`: once)."""
    sent_at: float | None = None
    """`time.perf_counter()` when the upstream request was sent."""
    scan_budget: Budget | None = None
    """What the segment rules may still classify for this request (`reorder_budget_chars`:
    reorder, pins and the session map share it; `proxy.pipeline.support.scan_budget`)."""
    is_pipeline: bool = False
    """The handler ran the request stages on this exchange (`proxy.handlers`): the response side
    measures and records it."""

    # --- the pipeline runner, before `parse` (`proxy.pipeline.run_request_stages`) ---
    raw_match: RawMatch | None = None
    """The raw body against the tenant's recent ones (`proxy.pipeline.session.raw_match`):
    read by the budget check, `parse` (`rawprefix.parse_tail`) and the session stage."""

    # --- parse (`proxy.pipeline.parse`) ---
    invalid_utf8: tuple[int, int] | None = None
    """`(offset, byte)` of the first byte that is not UTF-8 when the body failed to parse for
    that reason (the handler answers 400)."""

    # --- session (`proxy.pipeline.session`) ---
    message_view: MessageView | None = None
    """Masked digests of the client's messages (`proxy.pipeline.replay.view_messages`)."""
    session_inference: Inference | None = None
    """How the session was found: `explicit` / `append` / `fork` / `new` (`proxy.session_identity`)."""
    client_runs: dict[str, tuple[Any, list[Run]]] | None = None
    """Prefix key -> `(the client's value, its layout runs)`, reused by
    `proxy.measure.sent_prompt` for a key sent unchanged (the same object)."""
    previous: SessionRecord | None = None
    """The session's previous 2xx request as recorded (the parent's for a fork), or `None`."""
    is_kept_warm: bool = False
    """A keep-warm window of this session was open when this request arrived (`proxy.keepwarm`)."""
    arrivals: tuple[float, ...] = ()
    """Epoch seconds of the session's recent requests, this one included."""
    stored_columns: StoredColumns | None = None
    """`previous`'s sidecars as columns (`proxy.pipeline.replay.stored_columns`), made once for
    the session stage, replay and measurement."""
    history_rewritten: int | None = None
    """Index of the first earlier message whose real content changed; `None` when none did."""
    tail_misses: int = 0
    """Consecutive requests, this one included, that rewrote the previous request's newest
    message (`SessionRecord.tail_misses`)."""
    session_pins: Mapping[str, Any] | None = None
    """The previous record's pins (`SessionRecord.pins`: tool pins and `pinned_segments`), or
    `None` without any."""
    pacing: Pacing | None = None
    """The session's pacing after adding the gap since its previous request (for its record)."""
    plan_context: PlanContext | None = None
    """What the breakpoints stage needs from the session (previous markers, TTL forecast)."""

    # --- shared by the rewriting stages (`proxy.pipeline.support.layout_cache`) ---
    layout_cache: LayoutCache | None = None
    """Layout scans of the body versions this request went through, created on first use."""
    model_facts: ModelFacts | None = None
    """The request's model as the rules spell it, its marker capabilities and minimum
    cacheable tokens, worked out once (`proxy.pipeline.support.ModelFacts`; again when the
    model changes)."""

    # --- reorder (`proxy.pipeline.reorder`) ---
    system_tiers: tuple[str, ...] | None = None
    """Tier of each system block of the reordered body, in order."""
    system_moved_to_user: int = 0
    """Volatile system segments moved onto the newest user message."""
    head_dropped: int = 0
    """System-section messages (OpenAI leading system/developer messages) that left the message
    array because all their text moved onto the newest user message: replay and the session
    record line the sent array up with the client's by it (`replay.aligned_items`)."""

    # --- reorder and pin: notes moved onto the user message (`proxy.pipeline.delivered`) ---
    carried_notes: dict[str, tuple[str, str, int]] | None = None
    """Slot -> `(slot, text, position)` of the session's delivered notes still in its history
    (`proxy.pipeline.delivered.carried_notes`, computed once)."""
    delivered_notes: tuple[tuple[str, str, int], ...] | None = None
    """The session's delivered notes after this request (`SessionRecord.delivered`); `None`
    when neither stage ran (`proxy.pipeline.delivered.record_delivery`)."""

    # --- pin (`proxy.pipeline.pins`) ---
    pinned_segments: dict[str, str] | None = None
    """The session's pinned system segments after this request (key -> first-seen text);
    `None` when the stage did not run."""
    pins_kept: int = 0
    """Segments sent with their first-seen bytes."""
    pins_moved: int = 0
    """Changed segments whose new value went onto the newest user message."""

    # --- replay (`proxy.pipeline.replay`) ---
    replayed: int = 0
    """Messages sent as their stored bytes."""
    replayed_bytes: dict[int, tuple[Any, bytes]] | None = None
    """Position -> `(value sent, its stored bytes)` of each replayed message (for the record)."""

    # --- diagnostics (`proxy.pipeline.diagnostics`) ---
    is_diagnostics_requested: bool = False
    """The request asks the upstream to diagnose its cache misses."""

    # --- breakpoints (`proxy.pipeline.breakpoints`) ---
    plan: Plan | None = None
    """The markers placed and why."""

    # --- rewriting stages, through `replace_body` ---
    is_body_dirty: bool = False
    """A stage replaced `body`: `serialise` dumps it to `upstream_body`."""

    # --- serialise (`proxy.pipeline.serialise`); `proxy.measure.sent_body` otherwise ---
    serialised: tuple[bytes, JSONObject | None] | None = None
    """`(upstream bytes, the body they were dumped from)`; filled by `sent_body` (the bytes
    parsed, once) when the stage did not dump them."""

    # --- forward (`proxy.forward`) ---
    stream_error: str | None = None
    """Exception type name when relaying the upstream's stream failed."""
    is_client_gone: bool = False
    """The client hung up before the last byte."""

    # --- measurement (`proxy.measure`), response side ---
    sent_params: tuple[JSONObject, bytes] | None = None
    """`(body sent, params digest)` (`sent_params_digest`, once per request)."""
    sent_prompt: tuple[JSONObject, PromptScan] | None = None
    """`(body sent, its PromptScan)` (`sent_prompt`, once per request)."""
    sent_chain: PrefixChain | None = None
    """Chain digests of the prompt sent (`measure`)."""
    measurement: Measurement | None = None
    """Everything measured about this request (`measure`)."""

    def replace_body(self, body: JSONObject) -> None:
        """Make `body` (a new object: stages are copy-on-write) the request body and mark it for
        `serialise`; the only way a stage changes what goes upstream."""
        self.body = body
        self.is_body_dirty = True

    @property
    def provider(self) -> str:
        return self.adapter.name

    @property
    def outgoing(self) -> bytes:
        return self.raw if self.upstream_body is None else self.upstream_body

    def release_raw(self) -> bool:
        """After the request stages: drop the client's bytes when a rewritten body goes upstream
        instead (`upstream_body` set, no stage failed), so a request waiting on the upstream
        and its response holds one copy of its body, not two (600 KB less per request in
        flight with a 600 KB agent body: a model's answer takes seconds, so nearly every
        request in flight is waiting there).
        `raw` becomes `b""`; what reads it after the stages (`proxy.measure.sent_body` on a
        failed stage, `outgoing`) reads it only when it was kept. `True` when dropped."""
        if self.upstream_body is None or self.failed_stage is not None or self.is_signed:
            return False
        self.raw = b""
        return True
