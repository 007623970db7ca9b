"""`Services`: the long-lived objects a stage may use, built once per app in `proxy.app`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.metrics import Metrics
from proxy.settings import Settings


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: Metrics
    rules: Any = None
    """The loaded `RuleSet` (proxy.rules), `None` until rules are loaded."""
    recorder: Any = None
    """The `TraceRecorder` (proxy.record) when `settings.record` is set."""
    affinity: Any = None
    """Provider -> `proxy.affinity.Affinity` over its upstream's base URLs (set at start)."""
    router: Any = None
    """The `proxy.providers.Router` of the configured profiles; `None` builds the default."""
    last_measurements: Any = None
    """`proxy.debug.LastMeasurements`: newest measurement per session, for `/debug/sessions`."""
    store: Any = None
    """The `RecordStore` (proxy.store) over the session backend, `None` when sessions are off."""
    tokens: Any = None
    """`o200k_base` counter (`proxy.sim.tokens.TokenCounter`) for predictions in real tokens,
    loaded off the loop at start; `None` before (measurement then estimates bytes/4)."""
    teams: Any = None
    """`proxy.teams.TeamResolver` built from `team_header`, `teams` and `teams_file`."""
    ledger: Any = None
    """`proxy.ledger.TenantLedger`: per-tenant totals for `/debug/tenants`."""
    active_upstreams: Any = None
    """Provider -> `proxy.upstreams.ActiveUpstream` (mode and host in use), set at start."""
    keep_warm: Any = None
    """`proxy.keepwarm.KeepWarm` when `keep_warm` is not `off` (set at start)."""
    sessions: Any = None
    """Per-process session state (`proxy.sessions.SessionState`: tenant secret, session
    inference index, pacing statistics); set with `store` by `proxy.store.store_ctx`."""
