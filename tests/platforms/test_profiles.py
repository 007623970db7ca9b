"""Profiles as data: loading, errors, effective capabilities, routing of platform paths."""

from __future__ import annotations

import pytest

from proxy.profiles import DIRECT, ProfileError, load_profiles, parse_profiles
from proxy.providers import default_router
from proxy.settings import UpstreamCapabilities

PROFILES = load_profiles()


def test_packaged_profiles_load_with_every_documented_name() -> None:
    assert sorted(PROFILES.by_family["anthropic"]) == ["bedrock", "direct", "foundry", "strict-compatible", "vertex"]
    assert sorted(PROFILES.by_family["openai"]) == ["azure", "direct", "litellm", "openrouter"]


def test_errors_name_file_and_key_path() -> None:
    text = (
        "version: 1\n"
        "anthropic:\n"
        "  odd:\n"
        "    marker_atributes: [type]\n"
        "    paths: [{template: 'no-slash', api: /v1/messages}]\n"
        "    model_name: '(unclosed'\n"
        "openai:\n"
        "  gw: {error_shape: xml}\n"
    )
    with pytest.raises(ProfileError) as info:
        parse_profiles(text, "p.yaml")
    assert str(info.value).splitlines() == [
        "p.yaml: anthropic.odd.marker_atributes: unknown key",
        "p.yaml: anthropic.odd.paths.0.template: must be a path starting with /",
        "p.yaml: anthropic.odd.model_name: invalid regex: missing ), unterminated subpattern at position 0",
        "p.yaml: openai.gw.error_shape: must be one of anthropic, openai, aws, google",
    ]
    with pytest.raises(ProfileError, match="version: must be 1"):
        parse_profiles("anthropic: {}\n")


def test_unknown_profile_name_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"unknown anthropic profile 'vertx' \(known: bedrock, direct, foundry"):
        PROFILES.get("anthropic", "vertx")


def test_capabilities_come_from_the_profile_and_old_flags_still_override() -> None:
    vertex = PROFILES.get("anthropic", "vertex")
    strict = PROFILES.get("anthropic", "strict-compatible")
    bedrock = PROFILES.get("anthropic", "bedrock")
    assert DIRECT["anthropic"].capabilities("claude-sonnet-4-6") == UpstreamCapabilities()
    assert vertex.capabilities("claude-sonnet-4-6") == UpstreamCapabilities(strip_scope=True)
    assert strict.capabilities("claude-sonnet-4-6") == UpstreamCapabilities(strip_ttl=True, strip_scope=True)
    # 1h only where the model allows it on Bedrock (docs/provider-rules.md 4)
    assert bedrock.capabilities("claude-sonnet-4-6") == UpstreamCapabilities(strip_scope=True)
    assert bedrock.capabilities("claude-3-7-sonnet") == UpstreamCapabilities(strip_ttl=True, strip_scope=True)
    override = UpstreamCapabilities(no_tool_message_markers=True)
    assert vertex.capabilities("claude-sonnet-4-6", override) == UpstreamCapabilities(
        strip_scope=True, no_tool_message_markers=True
    )
    assert DIRECT["anthropic"].capabilities(None, override) is override


def test_model_names_per_platform_and_bedrock_minimums() -> None:
    bedrock = PROFILES.get("anthropic", "bedrock")
    assert bedrock.model("us.anthropic.claude-sonnet-4-6-v1:0") == "claude-sonnet-4-6"
    assert bedrock.model("anthropic.claude-3-7-sonnet-20250219-v1:0") == "claude-3-7-sonnet-20250219"
    assert bedrock.min_tokens_for("claude-opus-4-7") == 4096
    assert bedrock.min_tokens_for("claude-sonnet-4-6") is None
    assert PROFILES.get("anthropic", "vertex").model("claude-opus-4-7@20260101") == "claude-opus-4-7"
    litellm = PROFILES.get("openai", "litellm")
    assert litellm.is_claude("anthropic/claude-sonnet-4-6") and not litellm.is_claude("gpt-5.1")
    assert litellm.model("bedrock/us.anthropic.claude-sonnet-4-6-v1:0") == "claude-sonnet-4-6-v1"


def test_router_platform_paths_and_standard_paths() -> None:
    router = default_router(PROFILES, ("strict-compatible", "litellm"))
    vertex = router.route(
        "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-6:streamRawPredict"
    )
    assert (vertex.adapter.profile.name, vertex.path, vertex.model, vertex.stream, vertex.is_pipeline) == (
        "vertex",
        "/v1/messages",
        "claude-sonnet-4-6",
        True,
        True,
    )
    bedrock = router.route(
        "/model/us.anthropic.claude-sonnet-4-6-v1:0/invoke", "/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke"
    )
    assert (bedrock.adapter.profile.name, bedrock.model, bedrock.upstream_path) == (
        "bedrock",
        "us.anthropic.claude-sonnet-4-6-v1:0",
        "/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke",
    )
    azure = router.route("/openai/deployments/gpt5/chat/completions")
    assert (azure.adapter.name, azure.adapter.profile.name, azure.path, azure.upstream_path) == (
        "openai",
        "azure",
        "/v1/chat/completions",
        "/openai/deployments/gpt5/chat/completions",
    )
    standard = router.route("/v1/messages")
    assert (standard.adapter.profile.name, standard.path, standard.is_pipeline) == (
        "strict-compatible",
        "/v1/messages",
        True,
    )
    # under the /openai routing prefix, Azure's /openai/v1/... is Azure's only when chosen
    chat = router.route("/openai/v1/chat/completions")
    assert (chat.adapter.profile.name, chat.path, chat.upstream_path) == (
        "litellm",
        "/v1/chat/completions",
        "/v1/chat/completions",
    )
    chosen = default_router(PROFILES, ("direct", "azure")).route("/openai/v1/chat/completions")
    assert (chosen.adapter.profile.name, chosen.path, chosen.upstream_path) == (
        "azure",
        "/v1/chat/completions",
        "/openai/v1/chat/completions",
    )
    prefixed = router.route("/openai/v2/other")
    assert (prefixed.adapter.profile.name, prefixed.path, prefixed.is_pipeline) == ("litellm", "/v2/other", False)
    models = router.route("/v1/models", openai_markers=True)
    assert (models.adapter.name, models.is_pipeline) == ("openai", False)
