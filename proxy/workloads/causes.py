"""Divergence causes of replayed requests, named as promptcache's measurement names them.

`promptcache replay` prints, per trace and strategy, how many requests had each cause of
`proxy.metrics.CAUSES` (the causes `proxy.measure` assigns). Two sources:
- `promptcache`: the proxy measures its own traffic; `cause_counts(registry)` sums its
  `promptcache_prefix_divergences_total{provider,section,cause}` by cause, and
  `new_cause(before, after)` names the one cause a single request added.
- `none` / `naive` (no proxy in the path): `CauseTracker` applies measurement's pure core
  (`proxy.divergence.compare`, with the adapter's read rules) to each request's body as sent upstream,
  against the previous 2xx request of the same conversation. A conversation is the explicit
  session promptcache would use (`proxy.session_identity.explicit_session`: a session header,
  `metadata.user_id`'s session, `prompt_cache_key`, `user`); requests without one form a single
  conversation (consecutive requests), where the proxy would infer sessions from shared
  prefixes. `history_rewritten` is the offline verdict `promptcache explain` uses: the first
  changed block belongs to an earlier message than the previous request's last one
(`proxy.divergence.is_rewrite`). Volatile
  rules and per-model minimums come from the rules the proxy loads by default.

Invariant: bodies are read, never modified. Counts are requests (2xx only: the proxy measures
no failed request, and a failed request is never a conversation's reference).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from proxy.divergence import Reference, compare, prompt_of, read_predictor, read_rules, reference_of, request_model
from proxy.measure import volatile_checker
from proxy.providers import route
from proxy.providers.base import Block, JSONObject, Usage
from proxy.rules import RuleSet
from proxy.session_identity import explicit_session

DIVERGENCES_METRIC = "promptcache_prefix_divergences"
"""Family name of `promptcache_prefix_divergences_total` as `prometheus_client` collects it."""


def cause_counts(registry: CollectorRegistry) -> Counter[str]:
    """Requests per cause in a proxy's `promptcache_prefix_divergences_total` (all providers and
    sections summed)."""
    out: Counter[str] = Counter()
    for metric in registry.collect():
        if metric.name != DIVERGENCES_METRIC:
            continue
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                out[sample.labels["cause"]] += int(sample.value)
    return out


def new_cause(before: Mapping[str, int], after: Mapping[str, int]) -> str | None:
    """The cause whose count grew between two `cause_counts` readings (one request), else None."""
    grown = [cause for cause, n in after.items() if n > before.get(cause, 0)]
    return grown[0] if len(grown) == 1 else None


@dataclass(frozen=True, slots=True)
class SentRequest:
    """A conversation's reference request."""

    reference: Reference
    """What the next comparison reads (`proxy.divergence.PreviousRequest`)."""
    message_indices: tuple[int | None, ...]
    """Message index of each block in the `messages` section, `None` elsewhere
    (`proxy.divergence.is_rewrite`)."""


class CauseTracker:
    """Causes of one strategy's requests over one trace, in send order (module docstring)."""

    def __init__(self, rules: RuleSet | None, session_headers: Sequence[str]) -> None:
        self._session_headers = tuple(session_headers)
        self._is_volatile: Callable[[Block], bool] | None = volatile_checker(rules)
        self._min_tokens: Callable[[str], int] = rules.min_tokens if rules is not None else lambda _: 0
        self._previous: dict[Any, SentRequest] = {}

    def cause(self, path: str, headers: Mapping[str, str], body: JSONObject, usage: Usage | None) -> str:
        """The cause of a 2xx request sent as `body` with response `usage`; it becomes the
        reference of its conversation."""
        adapter, _ = route(path)
        model = request_model(body)
        min_tokens = adapter.min_cacheable_tokens(model, self._min_tokens(model))
        rules = read_rules(adapter, body, min_tokens)
        prompt = prompt_of(adapter, body, rules)
        lowered = {k.lower(): v for k, v in headers.items()}
        key = (path, explicit_session(lowered, body, self._session_headers, adapter))
        previous = self._previous.get(key)
        found = compare(
            previous.reference if previous is not None else None,
            prompt,
            rules,
            previous_messages=previous.message_indices if previous is not None else None,
            is_volatile=self._is_volatile,
            usage=usage,
            predictor=read_predictor(adapter, body, len(prompt.blocks), min_tokens),
        )
        self._previous[key] = SentRequest(
            reference_of(prompt),
            tuple(b.message_index if b.section == "messages" else None for b in prompt.blocks),
        )
        return found.cause
