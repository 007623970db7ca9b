"""The platforms that serve Claude, as the simulator judges them (its own copy of their rules).

The proxy reads its profiles from `rules/profiles.yaml`; the simulator must not share them
(a wrong rule on both sides would hide a real rejection), so the platforms' rules are written
again here, from docs/provider-rules.md:

- `direct`: Anthropic's API; `cache_control` keys `type`, `ttl`, `scope` (1.2).
- `strict-compatible`: an Anthropic-compatible server that rejects `ttl`
  ("`cache_control.ttl: 1h` is not supported", LiteLLM PR #38790, 1.7) and `scope`.
- `vertex`: `:rawPredict` / `:streamRawPredict`, model in the path, `anthropic_version` in the
  body, rejects `scope` ("...ephemeral.scope: Extra inputs are not permitted", 1.2) and the
  `prompt-caching-scope` / `extended-cache-ttl` betas (9).
- `bedrock` (InvokeModel): `/model/{id}/invoke[-with-response-stream]`, `anthropic_version` and
  `anthropic_beta` in the body, rejects `scope`, answers 403 "You invoked an unsupported model or
  your request did not allow prompt caching." to a marker for a model without caching (9,
  litellm #39210); errors are `{"message": ...}` with `x-amzn-ErrorType`.
- `foundry`: the Messages API; rejects `scope` (1.2).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from proxy.sim.errors import Rejected

UNEXPECTED_BETA: Final = (
    "Unexpected value(s) `{values}` for the `anthropic-beta` header. Please consult our documentation "
    "at docs.anthropic.com or try again without the header."
)
BEDROCK_NO_CACHING: Final = "You invoked an unsupported model or your request did not allow prompt caching."


@dataclass(frozen=True, slots=True)
class Platform:
    name: str
    marker_keys: frozenset[str] = frozenset({"type", "ttl", "scope"})
    rejected_betas: tuple[str, ...] = ()
    """Beta prefixes answered with 400."""
    version_field: str | None = None
    """Body field that must be present (`anthropic_version`)."""
    beta_field: str | None = None
    """Body field holding the betas (Bedrock `anthropic_beta`)."""
    no_cache_models: tuple[str, ...] = ()
    """Models (fnmatch) answering 403 to any cache marker."""
    model_in_path: bool = False
    aws_errors: bool = False
    has_diagnostics: bool = True
    """False: a `diagnostics` field is refused (cache diagnostics are Claude API only, 1.12)."""


PLATFORMS: Final = {
    "direct": Platform("direct"),
    "strict-compatible": Platform("strict-compatible", marker_keys=frozenset({"type"})),
    "vertex": Platform(
        "vertex",
        marker_keys=frozenset({"type", "ttl"}),
        rejected_betas=("prompt-caching-scope-", "extended-cache-ttl-"),
        version_field="anthropic_version",
        model_in_path=True,
        has_diagnostics=False,
    ),
    "bedrock": Platform(
        "bedrock",
        marker_keys=frozenset({"type", "ttl"}),
        rejected_betas=("prompt-caching-scope-", "extended-cache-ttl-"),
        version_field="anthropic_version",
        beta_field="anthropic_beta",
        no_cache_models=("claude-3-opus*", "claude-3-sonnet*", "claude-3-haiku*", "claude-v2*", "claude-instant*"),
        model_in_path=True,
        aws_errors=True,
        has_diagnostics=False,
    ),
    "foundry": Platform("foundry", marker_keys=frozenset({"type", "ttl"}), rejected_betas=("prompt-caching-scope-",)),
}

_BEDROCK_ID: Final = re.compile(r"^(?:[a-z]{2,4}\.)?(?:anthropic\.)?(?P<name>[^:]+?)(?:-v\d+)?(?::\d+)?$")


def model_name(platform: Platform, model: str) -> str:
    """A platform model id as Anthropic spells it: Vertex `claude-x@20250514` -> `claude-x`,
    Bedrock `us.anthropic.claude-x-v1:0` -> `claude-x`."""
    if platform.name == "vertex":
        return model.partition("@")[0]
    if platform.name == "bedrock":
        found = _BEDROCK_ID.match(model)
        return found.group("name") if found else model
    return model


def check_betas(platform: Platform, betas: Iterable[str]) -> None:
    """400 for betas the platform does not accept."""
    bad = [b for b in betas if platform.rejected_betas and b.startswith(platform.rejected_betas)]
    if bad:
        if platform.aws_errors:
            raise Rejected(400, "invalid beta flag")
        raise Rejected(400, UNEXPECTED_BETA.format(values=",".join(bad)))


def body_betas(platform: Platform, body: Mapping[str, Any]) -> frozenset[str]:
    """The betas a platform carries in the body (Bedrock `anthropic_beta`)."""
    if platform.beta_field is None:
        return frozenset()
    value = body.get(platform.beta_field)
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Rejected(400, f"{platform.beta_field}: Input should be a valid list of strings")
    return frozenset(value)


def check_body(platform: Platform, body: Mapping[str, Any]) -> dict[str, Any]:
    """The body as the Messages API would read it (platform fields removed); raises `Rejected`."""
    out = dict(body)
    if platform.version_field is not None:
        version = out.pop(platform.version_field, None)
        if not isinstance(version, str) or not version:
            raise Rejected(400, f"{platform.version_field}: Field required")
    if platform.beta_field is not None:
        out.pop(platform.beta_field, None)
    if platform.model_in_path and "model" in out:
        raise Rejected(400, "model: Extra inputs are not permitted")
    if not platform.has_diagnostics and "diagnostics" in out:
        raise Rejected(400, "diagnostics: Extra inputs are not permitted")
    return out


def has_marker(body: Mapping[str, Any]) -> bool:
    """True when any block (or the top level) carries `cache_control`."""
    if body.get("cache_control") is not None:
        return True
    for key in ("tools", "system"):
        items = body.get(key)
        if isinstance(items, list) and any(isinstance(b, dict) and b.get("cache_control") for b in items):
            return True
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("cache_control") for b in content):
            return True
    return False


def check_caching(platform: Platform, model: str, body: Mapping[str, Any]) -> None:
    """Bedrock's 403 for a cache marker sent to a model that cannot cache."""
    if any(fnmatch.fnmatchcase(model, p) for p in platform.no_cache_models) and has_marker(body):
        raise Rejected(403, BEDROCK_NO_CACHING)


AWS_ERROR_TYPES: Final = {400: "ValidationException", 401: "UnrecognizedClientException", 403: "AccessDeniedException"}
