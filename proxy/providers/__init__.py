"""Provider adapters and upstream profiles, chosen explicitly by request path.

One adapter per API: `ANTHROPIC` (Messages), `OPENAI_CHAT` (Chat Completions),
`OPENAI_RESPONSES` (Responses), and Bedrock's Converse on its platform paths. `route(path)`
resolves a request path to `(adapter, path without a routing prefix)`: the family comes from
the explicit prefix (`/anthropic`, `/openai`) or else from the path itself (`/v1/messages...` is
Anthropic, `/v1/chat`, `/v1/responses`, `/v1/embeddings`... are OpenAI; an unknown path goes to
OpenAI only when it carries an OpenAI-only credential shape, otherwise to Anthropic); the API
path then picks the family's adapter (`FAMILY_APIS`), and a path of no API of its own
(embeddings, models, count_tokens ...) gets the family's pass-through adapter (that of the API
`FAMILY_DEFAULT` names: only its error shape and usage reader apply).

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
from proxy.providers import anthropic_request, openai_request
from proxy.providers import openai as _openai
from proxy.providers.anthropic import MESSAGES_PATH, AnthropicMessagesAdapter
from proxy.providers.base import ProviderAdapter
from proxy.providers.converse import CONVERSE_PATH, ConverseAdapter
from proxy.providers.openai import CHAT_PATH, RESPONSES_PATH, OpenAIChatAdapter, OpenAIResponsesAdapter

AdapterType = Callable[[Profile], ProviderAdapter]

FAMILY_APIS: Final[dict[str, dict[str, AdapterType]]] = {
    "anthropic": {MESSAGES_PATH: AnthropicMessagesAdapter},
    "openai": {CHAT_PATH: OpenAIChatAdapter, RESPONSES_PATH: OpenAIResponsesAdapter},
}
"""Family -> the API paths a client may send on the standard routes -> their adapter type."""
FAMILY_DEFAULT: Final[dict[str, str]] = {"anthropic": MESSAGES_PATH, "openai": RESPONSES_PATH}
"""The API whose adapter serves a family's other paths (pass-through: only its error shape and
usage reader apply; OpenAI's is Responses, whose usage reader those paths always had)."""
PLATFORM_APIS: Final[dict[str, AdapterType]] = {CONVERSE_PATH: ConverseAdapter}
"""API shapes reached only through a platform's own paths (`rules/profiles.yaml` `api`)."""

ANTHROPIC: Final = AnthropicMessagesAdapter()
OPENAI_CHAT: Final = OpenAIChatAdapter()
OPENAI_RESPONSES: Final = OpenAIResponsesAdapter()
_DIRECT: Final[dict[str, tuple[dict[str, ProviderAdapter], ProviderAdapter]]] = {
    "anthropic": ({MESSAGES_PATH: ANTHROPIC}, ANTHROPIC),
    "openai": ({CHAT_PATH: OPENAI_CHAT, RESPONSES_PATH: OPENAI_RESPONSES}, OPENAI_RESPONSES),
}
"""Family -> (API path -> adapter, pass-through adapter), on the `direct` profiles."""
MARKER_KEYS: Final = frozenset({anthropic_request.MARKER_KEY, openai_request.MARKER_KEY})
"""Every API's block key of a cache marker (Anthropic `cache_control`, OpenAI
`prompt_cache_breakpoint`): what provider-independent digests leave out (`proxy.prefix`,
session identity, replay's sidecars)."""

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


def family_of(path: str, openai_markers: bool = False) -> tuple[str, str]:
    """`(family, path without a routing prefix)`: an explicit `/anthropic` or `/openai` prefix
    wins, then the path's own shape.

    `openai_markers` is true when the request carries an OpenAI-only credential shape
    (`Authorization: Bearer` without `x-api-key` and without `anthropic-version`); it decides
    shared paths such as `/v1/models` and `/v1/files`.
    """
    for family in ("anthropic", "openai"):
        prefix = "/" + family
        if path == prefix or path.startswith(prefix + "/"):
            return family, path[len(prefix) :] or "/"
    if path.startswith(_OPENAI_PREFIXES):
        return "openai", path
    if path.startswith("/v1/messages"):
        return "anthropic", path
    return ("openai" if openai_markers else "anthropic"), path


def route(path: str, openai_markers: bool = False) -> tuple[ProviderAdapter, str]:
    """The direct adapter of the API `path` names, and `path` without a routing prefix
    (`family_of`): `/v1/chat/completions` -> `OPENAI_CHAT`, `/v1/responses` ->
    `OPENAI_RESPONSES`, `/v1/messages` -> `ANTHROPIC`, another path -> its family's
    pass-through adapter (`FAMILY_DEFAULT`)."""
    family, rest = family_of(path, openai_markers)
    apis, default = _DIRECT[family]
    return apis.get(rest, default), rest


_ROUTING_PREFIXES: Final = ("/anthropic/", "/openai/")
"""A platform path under a routing prefix (Azure's `/openai/v1/...`) is the platform's only when
its profile is the configured one; otherwise it keeps meaning "prefix + standard path"."""


def _is_prefixed_standard(template: str) -> bool:
    """`/openai/v1/...`: a routing prefix followed by a standard `/v1/` path."""
    return any(template.startswith(prefix + "v1/") for prefix in _ROUTING_PREFIXES)


def adapter_for(profile: Profile, api: str | None = None) -> ProviderAdapter:
    """The adapter of API path `api` in `profile`'s family (`FAMILY_APIS`, or a platform-only
    shape: Converse), applying the profile's rules; the family's pass-through adapter
    (`FAMILY_DEFAULT`) for `None` or a path of no API of its own."""
    apis = FAMILY_APIS[profile.family]
    key = api or ""
    kind = PLATFORM_APIS.get(key) or apis.get(key) or apis[FAMILY_DEFAULT[profile.family]]
    return kind(profile)


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes and how the pipeline reads it."""

    adapter: ProviderAdapter
    """The adapter of the API the request speaks (`ProviderAdapter.api_path`), on its profile."""
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
        self.apis: dict[str, dict[str, ProviderAdapter]] = {}
        """Family -> API path -> adapter of the chosen profile (the standard paths)."""
        self.defaults: dict[str, ProviderAdapter] = {}
        """Family -> the chosen profile's pass-through adapter (the family's other paths)."""
        for family, name in chosen.items():
            self.apis[family], self.defaults[family] = self._adapters(profiles.get(family, name))
        self.platform: list[tuple[PathRule, ProviderAdapter]] = []
        self._routes: dict[tuple[str, str | None, bool], Route] = {}
        for profile in profiles.with_paths():
            is_chosen = chosen[profile.family] == profile.name
            apis, default = (
                (self.apis[profile.family], self.defaults[profile.family]) if is_chosen else self._adapters(profile)
            )
            own = {**apis, **{api: adapter_for(profile, api) for api in PLATFORM_APIS}}
            self.platform.extend(
                (rule, own.get(rule.api, default))
                for rule in profile.paths
                if is_chosen or not _is_prefixed_standard(rule.template)
            )

    @staticmethod
    def _adapters(profile: Profile) -> tuple[dict[str, ProviderAdapter], ProviderAdapter]:
        """`profile`'s adapter per API path of its family, and its pass-through adapter (one of them)."""
        apis = {api: adapter_for(profile, api) for api in FAMILY_APIS[profile.family]}
        return apis, apis[FAMILY_DEFAULT[profile.family]]

    def route(self, path: str, raw_path: str | None = None, openai_markers: bool = False) -> Route:
        """Resolve `path` (percent-decoded; `raw_path` as received, query string excluded).

        Pure in its arguments, so the answers for the first `ROUTE_CACHE_SIZE` distinct
        arguments are kept (clients send a handful of paths; a flood of new ones is resolved
        each time, never evicting those)."""
        key = (path, raw_path, openai_markers)
        found = self._routes.get(key)
        if found is None:
            found = self._new_route(key)
            if len(self._routes) < ROUTE_CACHE_SIZE:
                self._routes[key] = found
        return found

    def _new_route(self, key: tuple[str, str | None, bool]) -> Route:
        """`route` of `key` = `(path, raw_path, openai_markers)`, resolved afresh."""
        path, raw_path, openai_markers = key
        raw = raw_path if raw_path is not None else path
        platform = self._platform(raw, None)
        if platform is not None:  # Azure's own paths start with /openai/
            return platform
        for family in ("anthropic", "openai"):
            prefix = "/" + family
            if path == prefix or path.startswith(prefix + "/"):
                rest, raw_rest = path[len(prefix) :] or "/", raw[len(prefix) :] or "/"
                return self._resolve(rest, raw_rest, family)
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

    def _resolve(self, path: str, raw: str, forced: str | None, openai_markers: bool = False) -> Route:
        platform = self._platform(raw, forced)
        if platform is not None:
            return platform
        family = forced if forced is not None else family_of(path, openai_markers)[0]
        adapter = self.apis[family].get(path) or self.defaults[family]
        return Route(adapter, path, raw, path == adapter.api_path)


def default_router(profiles: Profiles | None = None, names: Sequence[str] = ("direct", "direct")) -> Router:
    """A router over the packaged profiles (or `profiles`), `names` = (anthropic, openai)."""
    from proxy.profiles import load_profiles

    return Router(profiles if profiles is not None else load_profiles(), names[0], names[1])
