"""OpenAI prompt-cache diagnostics for the simulator's Responses API (docs/provider-rules.md section 9).

Contract (developers.openai.com/api/docs/guides/prompt-caching/diagnostics):
- Every Responses request leaves a `Fingerprint` under its response id (per tenant, bounded
  LRU of `MAX_FINGERPRINTS`): the settings that decide reuse and the rendered token sequence.
- A request with `prompt_cache_options.comparison_response_id` gets `prompt_cache_diagnostics`
  on its response (JSON body and the streamed response objects), one of:
  `{"type": "cache_hit"}` (the compared prompt is a prefix of this one),
  `{"type": "cache_miss", "reason": R, "cache_missed_tokens": N, "comparison_reusable_tokens": M}`,
  `{"type": "comparison_response_not_found"}` (unknown id, or another tenant's), and
  `{"type": "unavailable"}` (a model before GPT-5.6: diagnostics are a 5.6+ feature).
- The reason is the first of, in this order: `model_changed`, `prompt_cache_key_changed`,
  `service_tier_changed` (absent = `auto`), `tools_changed`, `text_format_changed`
  (`text.format`), `reasoning_effort_changed` (`reasoning.effort`), `verbosity_changed`
  (`text.verbosity`), then `input_changed` (the token sequences part before the compared one
  ends). `M` is the length of the common token prefix (0 when a setting changed: nothing of the
  compared prompt is reusable), `N` the prompt tokens after it.
- Asking for diagnostics never changes cache accounting.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
import xxhash

MAX_FINGERPRINTS: Final = 8192


@dataclass(frozen=True, slots=True)
class Fingerprint:
    model: str
    settings: tuple[tuple[str, bytes], ...]
    """`(reason, digest)` per compared setting, in the order the reasons are checked."""
    tokens: array[int]


def _digest(value: Any) -> bytes:
    return xxhash.xxh3_64_digest(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


def fingerprint(body: Mapping[str, Any], model: str, tokens: array[int]) -> Fingerprint:
    """The request's reuse-deciding settings and its rendered tokens."""
    text = body.get("text")
    text = text if isinstance(text, dict) else {}
    reasoning = body.get("reasoning")
    reasoning = reasoning if isinstance(reasoning, dict) else {}
    tier = body.get("service_tier")
    settings = (
        ("prompt_cache_key_changed", _digest(body.get("prompt_cache_key"))),
        ("service_tier_changed", _digest("auto" if tier is None else tier)),
        ("tools_changed", _digest(body.get("tools") or [])),
        ("text_format_changed", _digest(text.get("format") or {"type": "text"})),
        ("reasoning_effort_changed", _digest(reasoning.get("effort"))),
        ("verbosity_changed", _digest(text.get("verbosity"))),
    )
    return Fingerprint(model, settings, tokens)


def _common_prefix(a: array[int], b: array[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n
    while low < high:  # longest equal prefix by bisection on slice equality
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def diagnose(previous: Fingerprint | None, current: Fingerprint, supported: bool) -> dict[str, Any]:
    """`prompt_cache_diagnostics` of `current` compared with `previous` (see the module docstring)."""
    if not supported:
        return {"type": "unavailable"}
    if previous is None:
        return {"type": "comparison_response_not_found"}
    total = len(current.tokens)
    if previous.model != current.model:
        reason = "model_changed"
    else:
        pairs = zip(previous.settings, current.settings, strict=True)
        reason = next((name for (name, old), (_, new) in pairs if old != new), "")
    if reason:
        return {"type": "cache_miss", "reason": reason, "cache_missed_tokens": total, "comparison_reusable_tokens": 0}
    shared = _common_prefix(previous.tokens, current.tokens)
    if shared == len(previous.tokens):
        return {"type": "cache_hit"}
    return {
        "type": "cache_miss",
        "reason": "input_changed",
        "cache_missed_tokens": total - shared,
        "comparison_reusable_tokens": shared,
    }


class Fingerprints:
    """`Fingerprint` by `(tenant, response id)`, the newest `cap` kept."""

    def __init__(self, cap: int = MAX_FINGERPRINTS) -> None:
        self._items: OrderedDict[tuple[str, str], Fingerprint] = OrderedDict()
        self._cap = cap

    def put(self, tenant: str, response_id: str, value: Fingerprint) -> None:
        self._items[(tenant, response_id)] = value
        while len(self._items) > self._cap:
            self._items.popitem(last=False)

    def get(self, tenant: str, response_id: str) -> Fingerprint | None:
        return self._items.get((tenant, response_id))
