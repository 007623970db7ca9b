"""Provider adapters and upstream profiles, chosen explicitly by request path.

`ADAPTERS` maps the routing prefix a client may use (`/anthropic`, `/openai`) to its adapter;
`route(path)` resolves a request path to `(adapter, upstream_path)`: the explicit prefix wins,
otherwise the path itself decides (`/v1/messages...` is Anthropic, `/v1/chat`, `/v1/responses`,
`/v1/embeddings`... are OpenAI). Unknown paths go to the OpenAI upstream only when they carry an
OpenAI-only shape; everything else defaults to Anthropic's.

`Router` adds the upstream profiles (`proxy.profiles`): a platform's own paths (Vertex
`:rawPredict`, Bedrock `/model/{model}/invoke`, Azure `/openai/deployments/{d}/...`) run through
the pipeline with that platform's adapter, as the API shape they carry (`Route.path`), and are
forwarded to their own path (`Route.upstream_path`, still percent-encoded as received); the
standard paths use the adapters of the configured `anthropic_profile` / `openai_profile`.
A platform path is recognised whatever profile is configured (the path names the platform),
except one under a routing prefix (Azure's `/openai/v1/...`), which needs its profile chosen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

from proxy.profiles import PathRule, Profile, Profiles
from proxy.providers import anthropic as _anthropic
from proxy.providers import openai as _openai
from proxy.providers.anthropic import AnthropicAdapter
from proxy.providers.base import ProviderAdapter
from proxy.providers.converse import CONVERSE_PATH, ConverseAdapter
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


def is_openai_credential_shape(header_names: Container[str]) -> bool:
    """True when a request's header names (lower case) are OpenAI-only: `authorization`
    without `x-api-key` and without `anthropic-version` (Anthropic's own headers). Decides
    shared paths in `route` / `Router.route`."""
    names = header_names
    return "authorization" in names and "x-api-key" not in names and "anthropic-version" not in names


CREDENTIAL_PREFIXES: Final = tuple(sorted({*_anthropic.KEY_PREFIXES, *_openai.KEY_PREFIXES}, key=len, reverse=True))
"""How the providers' credentials start (each adapter module's `KEY_PREFIXES`)."""
CREDENTIAL_SHAPE: Final = re.compile(
    r"(?<![A-Za-z0-9])(?:" + "|".join(map(re.escape, CREDENTIAL_PREFIXES)) + r")[A-Za-z0-9_\-]{16,}"
)
"""A provider credential in text: a known prefix (not inside a longer word) and at least 16 key
characters; one prefix and one character class, so it runs in time linear in the text."""
REDACTED: Final = "[redacted]"
_MIN_CREDENTIAL_CHARS: Final = 8
"""A request's own credential shorter than this is not searched for in its path."""


_PATH_WORD: Final = re.compile(r"[a-z][a-z_]*|v\d+(?:beta\d*)?")
"""A segment an API path is made of (`v1`, `messages`, `count_tokens`): where the redaction of
a key split over several segments stops."""


def redact_path(path: str, credential: str = "") -> str:
    """`path` with every `/`-separated segment that holds a credential replaced by `[redacted]`:
    a provider key shape (`CREDENTIAL_SHAPE`), or the request's own `credential` (any shape, at
    least 8 characters). A segment that starts like a provider key (`CREDENTIAL_PREFIXES`) is
    redacted with the segments after it up to the next path word (`_PATH_WORD`), so a key split
    by `/` (or a decoded `%2F`) goes whole. For log lines, spans and recorded traces; never for
    forwarding."""
    own = credential if len(credential) >= _MIN_CREDENTIAL_CHARS else None
    if not any(prefix in path for prefix in CREDENTIAL_PREFIXES) and (own is None or own not in path):
        return path
    segments = path.split("/")
    is_inside_key = False
    for i, segment in enumerate(segments):
        starts_key = segment.startswith(CREDENTIAL_PREFIXES) or CREDENTIAL_SHAPE.search(segment) is not None
        if starts_key or (own is not None and own in segment):
            segments[i] = REDACTED
            is_inside_key = starts_key
        elif is_inside_key and segment and _PATH_WORD.fullmatch(segment) is None:
            segments[i] = REDACTED
        else:
            is_inside_key = False
    return "/".join(segments)


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


_ROUTING_PREFIXES: Final = ("/anthropic/", "/openai/")
"""A platform path under a routing prefix (Azure's `/openai/v1/...`) is the platform's only when
its profile is the configured one; otherwise it keeps meaning "prefix + standard path"."""


def _is_prefixed_standard(template: str) -> bool:
    """`/openai/v1/...`: a routing prefix followed by a standard `/v1/` path."""
    return any(template.startswith(prefix + "v1/") for prefix in _ROUTING_PREFIXES)


_ADAPTER_TYPES: Final[dict[str, Callable[[Profile], ProviderAdapter]]] = {
    "anthropic": AnthropicAdapter,
    "openai": OpenAIAdapter,
}
_API_ADAPTERS: Final[dict[str, Callable[[Profile], ProviderAdapter]]] = {CONVERSE_PATH: ConverseAdapter}
"""API shapes with an adapter of their own (the family's adapter serves the others)."""


def adapter_for(profile: Profile, api: str | None = None) -> ProviderAdapter:
    """The adapter of `profile`'s family (or of the `api` shape, Converse), applying its rules."""
    kind = _API_ADAPTERS.get(api or "", _ADAPTER_TYPES[profile.family])
    adapter: ProviderAdapter = kind(profile)
    return adapter


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes and how the pipeline reads it."""

    adapter: ProviderAdapter
    path: str
    """The path the adapter reads the body as: `/v1/messages` for a Vertex `:rawPredict`; for
    other paths the path without a routing prefix."""
    upstream_path: str
    """The path sent upstream, percent-encoded as the client sent it."""
    is_pipeline: bool = False
    """True for a POST body the pipeline optimises (the caller checks the method)."""
    model: str | None = None
    """The model named by the path (`{model}` of a platform path), else `None`."""
    stream: bool = False
    """True when the path itself asks for a stream (`:streamRawPredict`)."""


ROUTE_CACHE_SIZE: Final = 1024
"""Distinct `(path, raw path, credential shape)` arguments whose route `Router.route` keeps."""


class Router:
    """Routes requests with the configured profiles (one per family on the standard paths)."""

    def __init__(self, profiles: Profiles, anthropic_profile: str = "direct", openai_profile: str = "direct") -> None:
        chosen = {"anthropic": anthropic_profile, "openai": openai_profile}
        self.adapters: dict[str, ProviderAdapter] = {
            family: adapter_for(profiles.get(family, name)) for family, name in chosen.items()
        }
        self.platform: list[tuple[PathRule, ProviderAdapter]] = []
        self._routes: dict[tuple[str, str | None, bool], Route] = {}
        for profile in profiles.with_paths():
            is_chosen = chosen[profile.family] == profile.name
            family = self.adapters[profile.family] if is_chosen else adapter_for(profile)
            own = {api: adapter_for(profile, api) for api in _API_ADAPTERS}
            self.platform.extend(
                (rule, own.get(rule.api, family))
                for rule in profile.paths
                if is_chosen or not _is_prefixed_standard(rule.template)
            )

    def route(self, path: str, raw_path: str | None = None, openai_markers: bool = False) -> Route:
        """Resolve `path` (percent-decoded; `raw_path` as received, query string excluded).

        Pure in its arguments, so the answers for the first `ROUTE_CACHE_SIZE` distinct
        arguments are kept (clients send a handful of paths; a flood of new ones is resolved
        each time, never evicting those)."""
        key = (path, raw_path, openai_markers)
        found = self._routes.get(key)
        if found is None:
            found = self._route(path, raw_path, openai_markers)
            if len(self._routes) < ROUTE_CACHE_SIZE:
                self._routes[key] = found
        return found

    def _route(self, path: str, raw_path: str | None, openai_markers: bool) -> Route:
        raw = raw_path if raw_path is not None else path
        platform = self._platform(raw, None)
        if platform is not None:  # Azure's own paths start with /openai/
            return platform
        for prefix in ("/anthropic", "/openai"):
            if path == prefix or path.startswith(prefix + "/"):
                family = prefix[1:]
                rest, raw_rest = path[len(prefix) :] or "/", raw[len(prefix) :] or "/"
                return self._resolve(rest, raw_rest, self.adapters[family])
        return self._resolve(path, raw, None, openai_markers)

    def _platform(self, raw: str, family: str | None) -> Route | None:
        for rule, adapter in self.platform:
            if family is not None and family != adapter.name:
                continue
            found = rule.match(raw)
            if found is not None:
                model = found.get("model")
                return Route(adapter, rule.api, raw, True, unquote(model) if model else None, rule.stream)
        return None

    def _resolve(self, path: str, raw: str, forced: ProviderAdapter | None, openai_markers: bool = False) -> Route:
        platform = self._platform(raw, forced.name if forced is not None else None)
        if platform is not None:
            return platform
        if forced is None:
            default, _ = route(path, openai_markers)
            forced = self.adapters[default.name]
        return Route(forced, path, raw, path in forced.pipeline_paths)


def default_router(profiles: Profiles | None = None, names: Sequence[str] = ("direct", "direct")) -> Router:
    """A router over the packaged profiles (or `profiles`), `names` = (anthropic, openai)."""
    from proxy.profiles import load_profiles

    return Router(profiles if profiles is not None else load_profiles(), names[0], names[1])
