"""One adapter per API: the route table picks it from the request's path (standard, prefixed and
platform paths, every packaged profile), and no adapter method takes a path."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from proxy.profiles import load_profiles
from proxy.providers import (
    ANTHROPIC,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    default_router,
    route,
)
from proxy.providers.anthropic import AnthropicMessagesAdapter
from proxy.providers.base import ProviderAdapter
from proxy.providers.converse import ConverseAdapter
from proxy.providers.openai import OpenAIAdapter, OpenAIChatAdapter, OpenAIResponsesAdapter

PROFILES = load_profiles()
PROVIDERS = Path(__file__).resolve().parents[2] / "proxy" / "providers"
VERTEX = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-6"
BEDROCK = "/model/us.anthropic.claude-sonnet-4-6-v1:0"

# (request path, openai credential shape) -> (adapter type, its profile, API path read, pipeline)
STANDARD = [
    ("/v1/messages", False, AnthropicMessagesAdapter, "/v1/messages", True),
    ("/anthropic/v1/messages", False, AnthropicMessagesAdapter, "/v1/messages", True),
    ("/v1/messages/count_tokens", False, AnthropicMessagesAdapter, "/v1/messages/count_tokens", False),
    ("/v1/chat/completions", False, OpenAIChatAdapter, "/v1/chat/completions", True),
    ("/openai/v1/chat/completions", False, OpenAIChatAdapter, "/v1/chat/completions", True),
    ("/v1/responses", False, OpenAIResponsesAdapter, "/v1/responses", True),
    ("/openai/v1/responses", False, OpenAIResponsesAdapter, "/v1/responses", True),
    ("/v1/responses/resp_1", False, OpenAIResponsesAdapter, "/v1/responses/resp_1", False),
    ("/v1/embeddings", False, OpenAIResponsesAdapter, "/v1/embeddings", False),
    ("/v1/models", True, OpenAIResponsesAdapter, "/v1/models", False),
    ("/v1/models", False, AnthropicMessagesAdapter, "/v1/models", False),
]

# (request path, profiles chosen (anthropic, openai)) -> (adapter type, profile, API path, stream)
PLATFORM = [
    (VERTEX + ":rawPredict", ("direct", "direct"), AnthropicMessagesAdapter, "vertex", "/v1/messages", False),
    (VERTEX + ":streamRawPredict", ("direct", "direct"), AnthropicMessagesAdapter, "vertex", "/v1/messages", True),
    (BEDROCK + "/invoke", ("direct", "direct"), AnthropicMessagesAdapter, "bedrock", "/v1/messages", False),
    (
        BEDROCK + "/invoke-with-response-stream",
        ("bedrock", "direct"),
        AnthropicMessagesAdapter,
        "bedrock",
        "/v1/messages",
        True,
    ),
    (BEDROCK + "/converse", ("direct", "direct"), ConverseAdapter, "bedrock", "/converse", False),
    (BEDROCK + "/converse-stream", ("bedrock", "direct"), ConverseAdapter, "bedrock", "/converse", True),
    (
        "/openai/deployments/gpt5/chat/completions",
        ("direct", "direct"),
        OpenAIChatAdapter,
        "azure",
        "/v1/chat/completions",
        False,
    ),
    ("/openai/deployments/d/responses", ("direct", "direct"), OpenAIResponsesAdapter, "azure", "/v1/responses", False),
    ("/openai/v1/chat/completions", ("direct", "azure"), OpenAIChatAdapter, "azure", "/v1/chat/completions", False),
    ("/openai/v1/responses", ("direct", "azure"), OpenAIResponsesAdapter, "azure", "/v1/responses", False),
]


@pytest.mark.parametrize(("path", "openai", "kind", "api", "is_pipeline"), STANDARD)
def test_module_route_maps_each_standard_path_to_its_api_adapter(
    path: str, openai: bool, kind: type, api: str, is_pipeline: bool
) -> None:
    adapter, rest = route(path, openai)
    assert (type(adapter), rest, rest == adapter.api_path) == (kind, api, is_pipeline)
    assert adapter is {"/v1/messages": ANTHROPIC, "/v1/chat/completions": OPENAI_CHAT}.get(
        adapter.api_path, OPENAI_RESPONSES if adapter.name == "openai" else ANTHROPIC
    )


@pytest.mark.parametrize("anthropic", sorted(PROFILES.by_family["anthropic"]))
@pytest.mark.parametrize("openai_profile", sorted(PROFILES.by_family["openai"]))
def test_router_maps_standard_paths_to_the_chosen_profiles_api_adapter(anthropic: str, openai_profile: str) -> None:
    router = default_router(PROFILES, (anthropic, openai_profile))
    for path, openai, kind, api, is_pipeline in STANDARD:
        found = router.route(path, openai_markers=openai)
        chosen = anthropic if found.adapter.name == "anthropic" else openai_profile
        got = (type(found.adapter), found.adapter.profile.name, found.path, found.is_pipeline)
        assert got == (kind, chosen, api, is_pipeline), path
        # one instance per (profile, API): the standard paths of an API share it
        assert found.adapter is router.route(found.adapter.api_path, openai_markers=openai).adapter


@pytest.mark.parametrize(("path", "names", "kind", "profile", "api", "stream"), PLATFORM)
def test_router_maps_platform_paths_to_the_api_adapter_of_their_profile(
    path: str, names: tuple[str, str], kind: type, profile: str, api: str, stream: bool
) -> None:
    found = default_router(PROFILES, names).route(path)
    got = (type(found.adapter), found.adapter.profile.name, found.path, found.adapter.api_path)
    assert got == (kind, profile, api, api)
    assert (found.is_pipeline, found.stream, found.upstream_path) == (True, stream, path)


def test_gateway_profiles_serve_chat_and_responses_with_their_own_rules() -> None:
    """OpenRouter and LiteLLM on the standard paths: the Chat adapter carries the gateway's
    Claude rule (Anthropic markers for a Claude model), the Responses adapter never does."""
    body = {"model": "anthropic/claude-sonnet-4-6", "messages": [{"role": "user", "content": "hi"}]}
    for name in ("openrouter", "litellm"):
        router = default_router(PROFILES, ("direct", name))
        chat = router.route("/v1/chat/completions").adapter
        responses = router.route("/v1/responses").adapter
        assert (chat.marker_policy(body).key, responses.marker_policy(body).key) == (
            "cache_control",
            "prompt_cache_breakpoint",
        )
    assert OPENAI_CHAT.marker_policy(body).key == "prompt_cache_breakpoint"


ADAPTER_TYPES = (AnthropicMessagesAdapter, OpenAIAdapter, OpenAIChatAdapter, OpenAIResponsesAdapter, ConverseAdapter)


@pytest.mark.parametrize("kind", (ProviderAdapter, *ADAPTER_TYPES), ids=lambda k: k.__name__)
def test_no_public_adapter_method_takes_a_path(kind: type) -> None:
    """The adapter is the API: nothing public on it is told which path it reads."""
    public = [name for name in dir(kind) if not name.startswith("_")]
    with_path = []
    for name in public:
        member = inspect.getattr_static(kind, name)
        function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if inspect.isfunction(function) and "path" in inspect.signature(function).parameters:
            with_path.append(name)
    assert public and with_path == []


def test_no_provider_function_takes_a_path_but_the_router() -> None:
    """`grep "def .*path: str" proxy/providers/*.py`, by the syntax tree: only the router's own
    functions (a request path is what they map) and `redact_path` take one."""
    allowed = {"__init__.py": {"redact_path", "family_of", "route", "_resolve"}}
    found = []
    for source in sorted(PROVIDERS.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
                if "path" in names and node.name not in allowed.get(source.name, set()):
                    found.append(f"{source.name}:{node.lineno} {node.name}")
    assert found == []
