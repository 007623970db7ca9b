"""`GET /debug/sessions` and `/debug/sessions/{id}`: the caller's sessions, as JSON.

Tenant-partitioned like every stored byte: the caller presents the same credential header the
client uses (`x-api-key` or `Authorization`), and only that tenant's sessions are visible; a
session of another tenant is indistinguishable from a missing one (404).

- `/debug/sessions`: the caller's recent sessions, newest first (`requests`, `hit_ratio`,
  `savings_usd`, `last_cause` ...), from the in-process index `proxy.history.SessionHistory`
  (bounded; the same index the `/ui/` pages read).
- `/debug/sessions/{id}`: one session's stored record and its last request's measurement.
  `{id}` is the id the client sends (`x-claude-code-session-id`, `metadata.user_id`'s session,
  `prompt_cache_key` ...) or the stored id shown in logs and in the listing. The provider is
  found from the session (each provider's tenant is tried); `?provider=anthropic|openai`
  restricts the lookup to one.

Served on the admin listener when `admin_port` is set, else on the main one; behind
`admin_token` when one is set (`proxy.admin`).

`remember_measurement` feeds the index after each measured response (the `debug` stage of `proxy.response`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any, Final

from aiohttp import web

from proxy.admin import caller_headers
from proxy.appkeys import SERVICES
from proxy.history import SessionHistory
from proxy.pipeline.segments import classifier_for
from proxy.pipeline.support import scan_budget

_log = logging.getLogger("promptcache.debug")

PROVIDERS: Final = ("anthropic", "openai")


class LastMeasurements(SessionHistory):
    """The newest measurement per `(tenant, session_id)`: now the recent-sessions index
    (`proxy.history.SessionHistory`), whose `get` keeps the old meaning."""


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def record_summary(record: Any) -> dict[str, Any]:
    """The stored session record without message bytes (sizes only)."""
    return {
        "model": record.model,
        "turns": record.turns,
        "prompt_blocks": len(record.ends),
        "prompt_bytes": record.ends[-1] if record.ends else 0,
        "breakpoints": list(record.breakpoints),
        "ttls": list(record.ttls),
        "arrivals": list(record.arrivals),
        "last_response_id": record.last_response_id,
        "sidecars": len(record.sidecars),
        "sidecar_bytes": sum(len(s.exact) for s in record.sidecars),
        "pinned_segments": len(record.pins.get("pinned_segments") or ()),
        "tail_misses": record.tail_misses,
    }


def caller_tenants(state: Any, headers: Mapping[str, str], provider: str | None = None) -> list[tuple[str, str]]:
    """`(provider, tenant)` of the caller for each provider (or only `provider`); none for a
    caller without a credential (no credential, no state: such requests are never stored)."""
    from proxy.tenant import credential_of

    if not credential_of(headers):
        return []
    return [(p, state.tenant_of(p, headers)) for p in PROVIDERS if provider in (None, p)]


def _scope(request: web.Request) -> tuple[Any, str | None, web.Response | None]:
    """`(services, ?provider=, error response)`: 503 while sessions are off, 400 for an unknown
    provider."""
    services = request.app[SERVICES]
    if services.sessions is None or services.store is None or services.last_measurements is None:
        return services, None, web.json_response({"error": "sessions are off"}, status=503)
    provider = request.query.get("provider")
    if provider is not None and provider not in PROVIDERS:
        return services, None, web.json_response({"error": "provider must be anthropic or openai"}, status=400)
    return services, provider, None


async def sessions_handler(request: web.Request) -> web.Response:
    """`GET /debug/sessions`: the caller's recent sessions, newest first (module docstring)."""
    services, provider, error = _scope(request)
    if error is not None:
        return error
    mine = caller_tenants(services.sessions, caller_headers(request), provider)
    return web.json_response({"sessions": [e.summary() for e in services.last_measurements.recent(mine)]})


async def session_handler(request: web.Request) -> web.Response:
    """See the module docstring."""
    from proxy.session_identity import explicit_id

    services, provider, error = _scope(request)
    if error is not None:
        return error
    state, store, history = services.sessions, services.store, services.last_measurements
    raw_id = request.match_info["session_id"]
    candidates = [
        (name, tenant, session_id)
        for name, tenant in caller_tenants(state, caller_headers(request), provider)
        for session_id in dict.fromkeys((explicit_id(raw_id), raw_id))
    ]
    # The index knows each session's provider; the store (keyed by tenant only) is the fallback.
    for name, tenant, session_id in candidates:
        entry = history.entry(tenant, session_id)
        if entry is not None and entry.provider == name:
            record = await store.load(tenant, session_id)
            return _session_json(session_id, name, entry, record)
    tried: set[tuple[str, str]] = set()
    for name, tenant, session_id in candidates:
        if (tenant, session_id) in tried:
            continue
        tried.add((tenant, session_id))
        record = await store.load(tenant, session_id)
        if record is not None:
            return _session_json(session_id, name, None, record)
    return web.json_response({"error": "no such session for this credential"}, status=404)


def _session_json(session_id: str, provider: str, entry: Any, record: Any) -> web.Response:
    return web.json_response(
        {
            "session_id": session_id,
            "provider": provider,
            "summary": entry.summary() if entry is not None else None,
            "record": record_summary(record) if record is not None else None,
            "last_request": _jsonable(entry.last_measurement if entry is not None else None),
        }
    )


def remember_measurement(exchange: Any, services: Any) -> None:
    """Add `exchange.measurement` to its session's history (`/debug/sessions`, `/ui/`).

    Reads what measurement left on the exchange (the body and `PromptScan` sent, the previous
    record); never raises into the response path (a failure is logged and skipped)."""
    measurement = exchange.measurement
    history = services.last_measurements
    if measurement is None or history is None or not exchange.tenant or not exchange.session_id:
        return
    if getattr(services.settings, "history_sessions", 1) == 0:
        return
    try:
        sent = exchange.sent_prompt
        body, prompt = (sent[0], sent[1]) if sent is not None else (None, None)
        rules = services.rules
        classifier = budget = None
        if rules is not None:
            classifier = classifier_for(rules)
            budget = scan_budget(exchange, services)
        pricing = services.pricing
        model = body.get("model") if isinstance(body, dict) else None
        prices = pricing.prices(exchange.provider, model if isinstance(model, str) else "")
        entry = history.add(
            exchange.tenant,
            exchange.session_id,
            measurement,
            path=exchange.path,
            body=body,
            prompt=prompt,
            previous=exchange.previous,
            classifier=classifier,
            prices=prices,
            budget=budget,
        )
        if entry.map is not None and entry.map.is_budget_spent:
            services.metrics.rules_budget_exceeded.labels("history").inc()
    except Exception as exc:  # noqa: BLE001 - the history never fails a request
        _log.warning("session history skipped (%s)", type(exc).__name__)
