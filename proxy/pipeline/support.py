"""Glue shared by the rewriting stages' wrappers: rules, capabilities, marker counts.

Contract: everything here reads `Services` / `Exchange` and is cheap per request; the pure
cores of the stages never import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from proxy.exchange import Exchange
from proxy.pipeline.layout import LayoutCache
from proxy.profiles import Profile
from proxy.providers.base import ProviderAdapter
from proxy.rules import Budget, RuleSet, cached_rules
from proxy.services import Services
from proxy.settings import UpstreamCapabilities

NO_CAPABILITY_LIMITS: Final = UpstreamCapabilities()


def rules_for(services: Services) -> RuleSet:
    """`services.rules`, else the rules of `settings.rules_dir` (default: packaged), loaded
    once per folder. A broken rules folder raises: the stage fails open."""
    rules = services.rules
    if rules is not None:
        return rules
    return cached_rules(services.settings.rules_dir)


def capabilities_for(services: Services, adapter: ProviderAdapter, model: str | None = None) -> UpstreamCapabilities:
    """What the upstream behind `adapter` accepts in markers for `model` (rules-table spelling,
    `model_for`): its profile's rules (`Profile.capabilities`), with the provider's
    `capabilities` setting (`Settings.providers`) as overrides."""
    own = services.settings.providers.get(adapter.name)
    overrides = own.capabilities if own is not None else NO_CAPABILITY_LIMITS
    profile: Any = getattr(adapter, "profile", None)
    if isinstance(profile, Profile):
        return profile.capabilities(model, overrides)
    return overrides


def model_for(exchange: Exchange) -> str | None:
    """The request's model as the rules tables spell it: the platform path's model (Vertex,
    Bedrock) or the body's `model`, through the profile's `model_name` pattern (worked out
    once per request: `ModelFacts`)."""
    return _facts(exchange).model


def min_tokens_for(services: Services, exchange: Exchange, model: str | None) -> int:
    """Minimum cacheable prefix (tokens) of `model`: the adapter's (`min_cacheable_tokens`: the
    platform's own table where it differs), else the rules' `models.yaml`."""
    return exchange.adapter.min_cacheable_tokens(model, rules_for(services).min_tokens(model))


@dataclass(slots=True)
class ModelFacts:
    """What the stages ask about a request's model, worked out once per request
    (`Exchange.model_facts`): `model_for`, `request_capabilities`, `request_min_tokens`."""

    raw: Any
    """The model value they derive from: the platform path's model, else the body's `model`."""
    model: str | None
    """`model_for`'s answer."""
    caps: UpstreamCapabilities | None = None
    """`capabilities_for(services, exchange.adapter, model)`, once asked."""
    rules: RuleSet | None = None
    """The `RuleSet` `min_tokens` was read from (`None`: not asked yet)."""
    min_tokens: int = 0


def _facts(exchange: Exchange) -> ModelFacts:
    """The exchange's `ModelFacts`, made again when its model value changed (a body replaced
    with another model, a new path model)."""
    raw: Any = exchange.path_model
    if raw is None and exchange.body is not None:
        raw = exchange.body.get("model")
    facts = exchange.model_facts
    if facts is None or type(facts.raw) is not type(raw) or facts.raw != raw:
        profile: Any = getattr(exchange.adapter, "profile", None)
        if isinstance(profile, Profile):
            model = profile.model(raw)
        else:
            model = raw if isinstance(raw, str) else None
        facts = exchange.model_facts = ModelFacts(raw, model)
    return facts


def request_capabilities(services: Services, exchange: Exchange) -> UpstreamCapabilities:
    """`capabilities_for(services, exchange.adapter, model_for(exchange))`, once per request."""
    facts = _facts(exchange)
    caps = facts.caps
    if caps is None:
        caps = facts.caps = capabilities_for(services, exchange.adapter, facts.model)
    return caps


def request_min_tokens(services: Services, exchange: Exchange) -> int:
    """`min_tokens_for(services, exchange, model_for(exchange))`, once per request and rules."""
    facts = _facts(exchange)
    rules = rules_for(services)
    if facts.rules is not rules:
        facts.min_tokens = min_tokens_for(services, exchange, facts.model)
        facts.rules = rules
    return facts.min_tokens


def count_markers(exchange: Exchange, services: Services, **actions: int) -> None:
    """Add to `promptcache_breakpoints_total{provider, action}` (action: injected, moved,
    dropped, kept) through the children resolved at start (`Metrics.by_provider`)."""
    if not any(actions.values()):
        return  # nothing to add (most requests at most stages)
    resolved = services.metrics.by_provider.get(exchange.provider)
    for action, n in actions.items():
        if n:
            child = resolved.breakpoints.get(action) if resolved is not None else None
            if child is None:
                child = services.metrics.breakpoints.labels(exchange.provider, action)
            child.inc(n)


def layout_cache(exchange: Exchange) -> LayoutCache:
    """The request's `LayoutCache` (`Exchange.layout_cache`), shared by the rewriting stages."""
    cache = exchange.layout_cache
    if cache is None:
        cache = exchange.layout_cache = LayoutCache()
    return cache


def scan_budget(exchange: Exchange, services: Services) -> Budget:
    """The request's segment classification budget (`Exchange.scan_budget`, made on first use
    from `settings.reorder_budget_chars`)."""
    budget = exchange.scan_budget
    if budget is None:
        budget = exchange.scan_budget = Budget(services.settings.reorder_budget_chars)
    return budget


def count_budget_spent(services: Services, stage: str) -> None:
    """Count a stage that left text as sent because the request's scan budget ran out."""
    services.metrics.rules_budget_exceeded.labels(stage).inc()
