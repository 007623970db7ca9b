"""diagnostics: ask the upstream to diagnose its own cache misses (the providers' cache diagnostics).

With `settings.cache_diagnostics` on, each pipeline request gets the provider's request-level
diagnostics field pointing at the session's previous response: on Anthropic
`diagnostics: {"previous_message_id": <id or null>}` (null opts in on a first turn;
platform.claude.com/docs/en/build-with-claude/cache-diagnostics, docs/provider-rules.md 1.12); on OpenAI
Responses for GPT-5.6+ `prompt_cache_options.comparison_response_id` (from the second turn:
there is no opt-in without a baseline; docs/provider-rules.md 9). The response's reason is read by the
usage reader and reconciled with promptcache's own cause by `proxy.measure`
(`promptcache_diagnostics_agreement_total{provider,result}`).

Contract: provider knowledge stays in the adapter (`with_cache_diagnostics`, `None` when the
provider has no such feature or the client set the field itself); the body is replaced
copy-on-write and marked dirty, never edited in place; the stage needs the `session` stage's
`Exchange.previous` (a `SessionRecord` or `None`) and must run after it. It rewrites the request,
so `observe` mode skips it. Sets `Exchange.is_diagnostics_requested` when it asked.
"""

from __future__ import annotations

from typing import Any, Final

from proxy.exchange import Exchange
from proxy.providers.base import JSONObject, ProviderAdapter
from proxy.services import Services


def with_diagnostics(
    adapter: ProviderAdapter, body: JSONObject, previous: Any
) -> JSONObject | None:
    """The body asking for diagnostics against `previous.last_response_id`, or `None` (no change)."""
    previous_id = getattr(previous, "last_response_id", None)
    return adapter.with_cache_diagnostics(body, previous_id if isinstance(previous_id, str) else None)


class DiagnosticsStage:
    name: Final = "diagnostics"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        if not services.settings.cache_diagnostics or exchange.body is None:
            return
        body = with_diagnostics(exchange.adapter, exchange.body, exchange.previous)
        if body is None:
            return
        exchange.replace_body(body)
        exchange.is_diagnostics_requested = True


STAGE: Final = DiagnosticsStage()
