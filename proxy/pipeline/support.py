"""Glue shared by the rewriting stages' wrappers: rules, capabilities, marker counts.

Contract: everything here reads `Services` / `Exchange` and is cheap per request; the pure
cores of the stages never import it.
"""

from __future__ import annotations

from typing import Any, Final

from proxy.exchange import Exchange
from proxy.pipeline.layout import LayoutCache
from proxy.providers.base import ProviderAdapter
from proxy.rules import RuleSet, cached_rules
from proxy.services import Services
from proxy.settings import UpstreamCapabilities

NO_CAPABILITY_LIMITS: Final = UpstreamCapabilities()


def rules_for(services: Services) -> RuleSet:
    """`services.rules`, else the rules of `settings.rules_dir` (default: packaged), loaded
    once per folder. A broken rules folder raises: the stage fails open."""
    rules: Any = services.rules
    if rules is not None:
        return rules
    return cached_rules(services.settings.rules_dir)


def capabilities_for(services: Services, adapter: ProviderAdapter) -> UpstreamCapabilities:
    """The `<provider>_capabilities` setting of the upstream behind `adapter`."""
    caps = getattr(services.settings, f"{adapter.name}_capabilities", None)
    return caps if isinstance(caps, UpstreamCapabilities) else NO_CAPABILITY_LIMITS


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
    """The request's `LayoutCache` (`notes["layout_cache"]`), shared by the rewriting stages."""
    cache = exchange.notes.get("layout_cache")
    if not isinstance(cache, LayoutCache):
        cache = exchange.notes["layout_cache"] = LayoutCache()
    return cache
