"""The three rewriting cores chained as the pipeline runs them (no session, no replay)."""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.pipeline.breakpoints import Plan, PlanContext, place_breakpoints
from proxy.pipeline.canonicalise import SessionPins, canonicalise_body
from proxy.pipeline.layout import LayoutCache
from proxy.pipeline.reorder import reorder_body
from proxy.providers.base import ProviderAdapter
from proxy.rules import RuleSet, load_rules
from proxy.settings import UpstreamCapabilities

RULES = load_rules()
"""The packaged rules: volatile segments move onto the newest user message."""
STAYING_RULES = dataclasses.replace(
    RULES, rules=tuple(dataclasses.replace(r, move_to_user=False) for r in RULES.rules)
)
"""The packaged rules with every `move_to_user` off: volatile segments sort last in the system."""
CAPS = UpstreamCapabilities()


def optimise(
    adapter: ProviderAdapter,
    body: dict[str, Any],
    rules: RuleSet = RULES,
    *,
    min_tokens: int | None = None,
    pins: SessionPins | None = None,
    context: PlanContext | None = None,
    caps: UpstreamCapabilities = CAPS,
    shared_cache: bool = True,
) -> tuple[dict[str, Any], Plan]:
    """canonicalise -> reorder -> breakpoints, sharing one `LayoutCache` as the stages do
    (`shared_cache=False`: each core lays out on its own)."""
    cache = LayoutCache() if shared_cache else None
    canonical, _ = canonicalise_body(adapter, body, pins, caps, cache)
    reordered, system = reorder_body(adapter, canonical, rules, caps)
    return place_breakpoints(
        adapter,
        reordered,
        min_tokens=rules.min_tokens(body.get("model")) if min_tokens is None else min_tokens,
        system_tiers=system.tiers,
        context=context,
        caps=caps,
        cache=cache,
    )
