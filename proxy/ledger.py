"""Per-tenant totals and `GET /debug/tenants`: what the caller's own credential has cost.

`TenantLedger` keeps, per tenant (the keyed hash of credential and upstream host, never the
credential), the requests with usage, prompt tokens read / written / uncached, output tokens,
list-price cost, the cost had nothing been cached, and the sessions seen. It is bounded: at most
`MAX_TENANTS` tenants (LRU) and `MAX_SESSIONS_PER_TENANT` distinct session ids counted each.
Per process: with several replicas each answers for the traffic it served.

`GET /debug/tenants` answers for the caller only: it derives the caller's tenant for each
provider from the credential header it presents (`x-api-key` or `Authorization`, as the client
sends it) and returns those tenants' totals; nobody can ask for another tenant's. Served on the
admin listener when `admin_port` is set, else on the main one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from proxy.appkeys import SERVICES
from proxy.teams import OTHER

MAX_TENANTS: Final = 4096
MAX_SESSIONS_PER_TENANT: Final = 4096


@dataclass(slots=True)
class TenantTotals:
    provider: str
    team: str
    requests: int = 0
    read: int = 0
    written: int = 0
    uncached: int = 0
    output: int = 0
    cost_usd: float = 0.0
    uncached_cost_usd: float = 0.0
    sessions: set[str] = field(default_factory=set)
    over_budget: int = 0
    """Requests over the pipeline budget: forwarded as sent, not optimised (`proxy.pipeline.budget`)."""
    last_over_budget: str | None = None
    """The newest such request's reason (its bytes or blocks against the setting)."""

    def as_json(self, tenant: str) -> dict[str, Any]:
        prompt = self.read + self.written + self.uncached
        return {
            "provider": self.provider,
            "tenant": tenant,
            "team": self.team,
            "requests": self.requests,
            "sessions": len(self.sessions),
            "input_tokens": {"read": self.read, "write": self.written, "none": self.uncached},
            "output_tokens": self.output,
            "hit_ratio": round(self.read / prompt, 4) if prompt else None,
            "cost_usd": round(self.cost_usd, 6),
            "uncached_cost_usd": round(self.uncached_cost_usd, 6),
            "savings_usd": round(self.uncached_cost_usd - self.cost_usd, 6),
            "over_budget": self.over_budget,
            "last_over_budget": self.last_over_budget,
        }


class TenantLedger:
    """`TenantTotals` by tenant, at most `cap` tenants (least recently used dropped)."""

    def __init__(self, cap: int = MAX_TENANTS) -> None:
        self._items: OrderedDict[str, TenantTotals] = OrderedDict()
        self._cap = cap

    def totals(self, tenant: str, provider: str, team: str) -> TenantTotals:
        """The tenant's totals (created empty), marked most recently used."""
        found = self._items.get(tenant)
        if found is None:
            found = TenantTotals(provider, team)
            self._items[tenant] = found
            while len(self._items) > self._cap:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(tenant)
            found.team = team
        return found

    def get(self, tenant: str) -> TenantTotals | None:
        return self._items.get(tenant)

    def add_usage(self, tenant: str, provider: str, team: str, session_id: str | None, usage: Any) -> None:
        """Count one response's usage (tokens) for `tenant`."""
        totals = self.totals(tenant, provider, team)
        totals.requests += 1
        totals.read += usage.cache_read
        totals.written += usage.cache_write
        totals.uncached += usage.input_none
        totals.output += usage.output
        if session_id and len(totals.sessions) < MAX_SESSIONS_PER_TENANT:
            totals.sessions.add(session_id)

    def add_cost(self, tenant: str, provider: str, team: str, cost: float, uncached: float) -> None:
        """Count one response's cost and counterfactual cost (USD) for `tenant`."""
        totals = self.totals(tenant, provider, team)
        totals.cost_usd += cost
        totals.uncached_cost_usd += uncached


async def tenants_handler(request: web.Request) -> web.Response:
    """See the module docstring."""
    from proxy.admin import caller_headers

    services = request.app[SERVICES]
    state, ledger = services.sessions, services.ledger
    if state is None or ledger is None:
        return web.json_response({"error": "sessions are off"}, status=503)
    found: dict[str, dict[str, Any]] = {}
    for provider in ("anthropic", "openai"):
        tenant = state.tenant_of(provider, caller_headers(request))
        totals = ledger.get(tenant)
        if totals is not None and tenant not in found:
            found[tenant] = totals.as_json(tenant)
    return web.json_response({"tenants": list(found.values())})


# --- attribution (the response side calls these) ------------------------------------------------


def team_for(exchange: Any, services: Any) -> str:
    """The exchange's team (`proxy.teams`), resolved once and kept on `exchange.team`."""
    if exchange.team is None:
        resolver = services.teams
        exchange.team = resolver.team_of(exchange.headers) if resolver is not None else OTHER
    return str(exchange.team)


def _tenant(exchange: Any, services: Any) -> str | None:
    if exchange.tenant is None and services.sessions is not None:
        exchange.tenant = services.sessions.tenant_of(exchange.provider, exchange.headers)
    return exchange.tenant if isinstance(exchange.tenant, str) else None


def attribute_usage(exchange: Any, services: Any) -> None:
    """Count `exchange.usage` for its team (metrics) and its tenant (the ledger)."""
    usage = exchange.usage
    team = team_for(exchange, services)
    tm = services.metrics.team_metrics(team)
    tm.requests.inc()
    tm.input_tokens["read"].inc(usage.cache_read)
    tm.input_tokens["write"].inc(usage.cache_write)
    tm.input_tokens["none"].inc(usage.input_none)
    tenant = _tenant(exchange, services)
    if services.ledger is not None and tenant is not None:
        services.ledger.add_usage(tenant, exchange.provider, team, exchange.session_id, usage)


def note_over_budget(exchange: Any, services: Any, reason: str) -> None:
    """Count a request over the pipeline budget for its tenant, keeping `reason`."""
    tenant = _tenant(exchange, services)
    if services.ledger is not None and tenant is not None:
        totals = services.ledger.totals(tenant, exchange.provider, team_for(exchange, services))
        totals.over_budget += 1
        totals.last_over_budget = reason


def attribute_cost(exchange: Any, services: Any, cost: float, uncached: float) -> None:
    """Count one request's cost and counterfactual cost (USD) for its team and tenant."""
    team = team_for(exchange, services)
    tm = services.metrics.team_metrics(team)
    tm.cost.inc(cost)
    tm.uncached_cost.inc(uncached)
    tenant = _tenant(exchange, services)
    if services.ledger is not None and tenant is not None:
        services.ledger.add_cost(tenant, exchange.provider, team, cost, uncached)
