"""Glue shared by the rewriting stages' wrappers: rules, capabilities, marker counts.

Contract: everything here reads `Services` / `Exchange` and is cheap per request; the pure
cores of the stages never import it.
"""

from __future__ import annotations

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
    Bedrock) or the body's `model`, through the profile's `model_name` pattern."""
    model: Any = exchange.path_model
    if model is None and exchange.body is not None:
        model = exchange.body.get("model")
    profile: Any = getattr(exchange.adapter, "profile", None)
    if isinstance(profile, Profile):
        return profile.model(model)
    return model if isinstance(model, str) else None


def min_tokens_for(services: Services, exchange: Exchange, model: str | None) -> int:
    """Minimum cacheable prefix (tokens) of `model`: the adapter's (`min_cacheable_tokens`: the
    platform's own table where it differs), else the rules' `models.yaml`."""
    return exchange.adapter.min_cacheable_tokens(model, rules_for(services).min_tokens(model))


def count_markers(exchange: Exchange, services: Services, **actions: int) -> None:
    """Add to `promptcache_breakpoints_total{provider, action}` (action: injected, moved,
    dropped, kept) through the children resolved at start (`Metrics.by_provider`)."""
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
