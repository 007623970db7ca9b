"""Provider adapters, chosen explicitly by request path.

`ADAPTERS` maps the routing prefix a client may use (`/anthropic`, `/openai`) to its adapter;
`route(path)` resolves a request path to `(adapter, upstream_path)`: the explicit prefix wins,
otherwise the path itself decides (`/v1/messages...` is Anthropic, `/v1/chat`, `/v1/responses`,
`/v1/embeddings`... are OpenAI). Unknown paths go to the OpenAI upstream only when they carry an
OpenAI-only shape; everything else defaults to Anthropic's.
"""

from __future__ import annotations

from typing import Final

from proxy.providers.anthropic import AnthropicAdapter
from proxy.providers.base import ProviderAdapter
from proxy.providers.openai import OpenAIAdapter

ANTHROPIC: Final = AnthropicAdapter()
OPENAI: Final = OpenAIAdapter()
ADAPTERS: Final[dict[str, ProviderAdapter]] = {"anthropic": ANTHROPIC, "openai": OPENAI}

_OPENAI_PREFIXES: Final = (
    "/v1/chat/",
    "/v1/responses",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/assistants",
    "/v1/threads",
    "/v1/audio",
    "/v1/images",
    "/v1/moderations",
    "/v1/vector_stores",
    "/v1/fine_tuning",
    "/v1/uploads",
    "/v1/realtime",
    "/v1/conversations",
)


def route(path: str, openai_markers: bool = False) -> tuple[ProviderAdapter, str]:
    """Pick the adapter for `path` and strip an explicit `/anthropic` or `/openai` prefix.

    `openai_markers` is true when the request carries an OpenAI-only credential shape
    (`Authorization: Bearer` without `x-api-key` and without `anthropic-version`); it decides
    shared paths such as `/v1/models` and `/v1/files`.
    """
    for prefix, adapter in (("/anthropic", ANTHROPIC), ("/openai", OPENAI)):
        if path == prefix or path.startswith(prefix + "/"):
            rest = path[len(prefix) :] or "/"
            return adapter, rest
    if path.startswith(_OPENAI_PREFIXES):
        return OPENAI, path
    if path.startswith("/v1/messages"):
        return ANTHROPIC, path
    return (OPENAI if openai_markers else ANTHROPIC), path
