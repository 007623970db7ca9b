"""platform: the upstream profile's rules outside the markers (betas, session hint).

Pure core `platform_edits(profile, betas, body, session_id)`; the wrapper first lets the adapter
place markers of a platform whose markers are blocks of their own (`with_platform_markers`:
Bedrock Converse `cachePoint`), then reads the profile
from the exchange's adapter (`adapter.profile`) and writes `exchange.header_overrides` and a
copy-on-write body. Marker attributes (ttl, scope, tool messages) are the breakpoint planner's,
through `Profile.capabilities`.

Rules (data in `rules/profiles.yaml`):
- `anthropic-beta` values the platform rejects (`rejected_betas`, prefixes) are dropped from the
  header and from the platform's body field (`beta_body_field`, Bedrock's `anthropic_beta`); an
  empty header is removed. Vertex and Bedrock reject `prompt-caching-scope-*` (docs/provider-rules.md 1.2,
  1.13: "Unexpected value(s) ... for the `anthropic-beta` header"). The kept set is stable per
  conversation since it depends on the client's set only.
- `session_field` (OpenRouter `session_id`, docs/provider-rules.md 6) is set from the promptcache session
  when the body has none (at most 256 characters, OpenRouter's limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from proxy.exchange import Exchange
from proxy.pipeline.support import request_capabilities, request_min_tokens
from proxy.profiles import DIRECT, Profile
from proxy.providers.base import JSONObject
from proxy.services import Services

BETA_HEADER: Final = "anthropic-beta"
MAX_SESSION_HINT: Final = 256


@dataclass(frozen=True, slots=True)
class PlatformEdits:
    body: JSONObject
    """The body to send (the same object when unchanged)."""
    beta_header: str | None
    """The `anthropic-beta` value to send, `""` to remove the header, `None` to leave it alone."""
    dropped_betas: tuple[str, ...] = ()


def split_betas(values: Sequence[str]) -> list[str]:
    """Header values (`a,b`, repeated headers) as one list, blanks removed, order kept."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def platform_edits(profile: Profile, betas: Sequence[str], body: JSONObject, session_id: str | None) -> PlatformEdits:
    """The profile's beta and session-hint edits of one request (never mutates `body`)."""
    kept = [b for b in betas if profile.accepts_beta(b)]
    dropped = [b for b in betas if not profile.accepts_beta(b)]
    beta_header = ",".join(kept) if dropped else None
    new_body = body
    field = profile.beta_body_field
    listed = body.get(field) if field else None
    if field and isinstance(listed, list):
        keep_listed = [b for b in listed if not (isinstance(b, str) and not profile.accepts_beta(b))]
        if len(keep_listed) != len(listed):
            dropped += [b for b in listed if b not in keep_listed]
            new_body = {**new_body, field: keep_listed} if keep_listed else {
                k: v for k, v in new_body.items() if k != field
            }
    hint = profile.session_field
    if hint and session_id and hint not in body:
        new_body = {**new_body, hint: session_id[:MAX_SESSION_HINT]}
    return PlatformEdits(new_body, beta_header, tuple(dropped))


def profile_of(exchange: Exchange) -> Profile:
    """The upstream profile of the exchange's adapter (the family's `direct` when it has none)."""
    profile: Any = getattr(exchange.adapter, "profile", None)
    return profile if isinstance(profile, Profile) else DIRECT[exchange.adapter.name]


class PlatformStage:
    name: Final = "platform"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        body = exchange.body
        if body is None:
            return
        profile = profile_of(exchange)
        caps = request_capabilities(services, exchange)
        min_tokens = request_min_tokens(services, exchange)
        marked = exchange.adapter.with_platform_markers(body, min_tokens, not caps.strip_ttl)
        if marked is not None and marked is not body:
            exchange.replace_body(marked)
            body = marked
        if not (profile.rejected_betas or profile.session_field):
            return
        edits = platform_edits(
            profile, split_betas(exchange.headers.getall(BETA_HEADER, [])), body, exchange.session_id
        )
        if edits.beta_header is not None:
            exchange.header_overrides[BETA_HEADER] = edits.beta_header or None
        if edits.body is not body:
            exchange.replace_body(edits.body)


STAGE: Final = PlatformStage()
