"""`Services`: the long-lived objects a stage may use, built once per app in `proxy.app`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.metrics import Metrics
from proxy.pricing import PricingTable, default_pricing
from proxy.settings import Settings

if TYPE_CHECKING:
    from proxy.admission import BodyGate
    from proxy.affinity import Affinity
    from proxy.debug import LastMeasurements
    from proxy.keepwarm import KeepWarm
    from proxy.ledger import TenantLedger
    from proxy.providers import Router
    from proxy.rules import RuleSet
    from proxy.session_identity import SessionState
    from proxy.sim.tokens import TokenCounter
    from proxy.store import RecordStore
    from proxy.teams import TeamResolver
    from proxy.tokenizer import TokenizerLoader
    from proxy.trace_recorder import TraceRecorder
    from proxy.upstreams import ActiveUpstream


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: Metrics
    rules: RuleSet | None = None
    """The loaded `RuleSet` (proxy.rules), `None` until rules are loaded."""
    recorder: TraceRecorder | None = None
    """The `TraceRecorder` (proxy.trace_recorder) when `settings.record` is set."""
    affinity: dict[str, Affinity] | None = None
    """Provider -> `proxy.affinity.Affinity` over its upstream's base URLs (set at start)."""
    router: Router | None = None
    """The `proxy.providers.Router` of the configured profiles; `None` builds the default."""
    last_measurements: LastMeasurements | None = None
    """`proxy.debug.LastMeasurements`: newest measurement per session, for `/debug/sessions`."""
    store: RecordStore | None = None
    """The `RecordStore` (proxy.store) over the session backend, `None` when sessions are off."""
    tokens: TokenCounter | None = None
    """`o200k_base` counter (`proxy.sim.tokens.TokenCounter`) for predictions in real tokens,
    built off the loop by `tokenizer` before the first request that counts tokens; `None`
    before (and when it cannot be built: measurement then estimates bytes/4)."""
    gate: BodyGate | None = None
    """Admission to the request stages by body bytes (`proxy.admission`; `proxy.app`)."""
    tokenizer: TokenizerLoader | None = None
    """Builds `tokens` on first need (`proxy.tokenizer`; set by `proxy.app.create_app`)."""
    teams: TeamResolver | None = None
    """`proxy.teams.TeamResolver` built from `team_header`, `teams` and `teams_file`."""
    ledger: TenantLedger | None = None
    """`proxy.ledger.TenantLedger`: per-tenant totals for `/debug/tenants`."""
    active_upstreams: dict[str, ActiveUpstream] | None = None
    """Provider -> `proxy.upstreams.ActiveUpstream` (mode and host in use), set at start."""
    keep_warm: KeepWarm | None = None
    """`proxy.keepwarm.KeepWarm` when `keep_warm` is not `off` (set at start)."""
    sessions: SessionState | None = None
    """Per-process session state (`proxy.session_identity.SessionState`: tenant secret, session
    inference index, pacing statistics); set with `store` by `proxy.store.store_ctx`."""
    draining: bool = False
    """Set by `proxy.shutdown.drain` once the stop signal came: responses close their connection
    and `/readyz` answers 503."""
    ui_token: str = ""
    """The credential the cross-tenant pages (`/ui/`) need: `admin_token` when set, else one
    generated at start (`proxy.admin.ui_token_for`), printed once in the start-up banner."""
    pricing: PricingTable = field(default_factory=default_pricing)
    """Prices per provider and model family (`proxy.pricing`): measurement's costs, the session
    history, keep-warm's expected ping cost. Defaults to the packaged `rules/pricing.yaml`."""
