"""`Exchange`: the per-request state every stage reads and writes (the "flow object").

Invariants: `raw` is the client's body exactly as received and is never modified; the bytes
sent upstream are `upstream_body` when a stage produced one, else `raw`. A failing stage resets
`upstream_body` to `None` (fail open).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from multidict import CIMultiDictProxy

from proxy.providers.base import JSONObject, ProviderAdapter, Usage


@dataclass(slots=True)
class Exchange:
    adapter: ProviderAdapter
    path: str
    """Upstream path without a routing prefix, e.g. `/v1/messages`."""
    query_string: str
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
    notes: dict[str, Any] = field(default_factory=dict)
    """Stage outputs that later stages or measurement read (plans, digests, counts)."""
    upstream_path: str | None = None
    """Path sent upstream when it is not `path` (a platform path such as Vertex's
    `...:rawPredict`, percent-encoded as received); `None` sends `path`."""
    path_model: str | None = None
    """The model named by a platform path (Vertex, Bedrock put it there, not in the body)."""
    is_signed: bool = False
    """The request is signed over its body (SigV4): forwarded byte-identical, measured only."""
    header_overrides: dict[str, str | None] = field(default_factory=dict)
    """Upstream request headers a stage replaces (`None` removes the header), e.g. the
    `anthropic-beta` values a platform rejects dropped."""
    status: int = 0
    usage: Usage | None = None
    is_anonymous: bool = False
    """The request carries no credential header (set by the handler): observe only, nothing
    read from or written to the session store (no credential, no state)."""
    is_usage_counted: bool = False
    """`usage` was added to the token counters (`proxy.pipeline.observe.record_usage`: once)."""
    sent_at: float | None = None
    """`time.perf_counter()` when the upstream request was sent."""

    @property
    def provider(self) -> str:
        return self.adapter.name

    @property
    def outgoing(self) -> bytes:
        return self.raw if self.upstream_body is None else self.upstream_body
