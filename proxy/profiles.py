"""Upstream profiles: each platform's rules as data, loaded once from `rules/profiles.yaml`.

A `Profile` is a named bundle (Vertex, Bedrock, Foundry, strict-compatible, Azure, OpenRouter,
LiteLLM ...): its own request paths, the `cache_control` attributes and `anthropic-beta` values
it accepts, per-model minimums and 1h TTLs where they differ, how signed requests look, and the
shape of its error bodies. Shared code reads these fields; it never branches on a profile name.

Contract:
- `load_profiles(dir)` reads `profiles.yaml` of `dir` (else the packaged one); unknown keys,
  wrong types and bad regexes raise `ProfileError` naming the file and key path.
- `Profile.capabilities(model, overrides)` is the effective `UpstreamCapabilities` of one request:
  the profile's rules OR'ed with the old per-upstream flags (`anthropic_capabilities` ...), which
  stay working as overrides.
- Everything is frozen; a profile is safe to share between requests.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import yaml

from proxy.paths import packaged_rules_dir
from proxy.settings import UpstreamCapabilities

PROFILES_FILE: Final = "profiles.yaml"
FAMILIES: Final = ("anthropic", "openai")
API_PATHS: Final = frozenset({"/v1/messages", "/v1/chat/completions", "/v1/responses", "/converse"})
ErrorShape = Literal["anthropic", "openai", "aws", "google"]
_SHAPES: Final = ("anthropic", "openai", "aws", "google")
_SEGMENT: Final = re.compile(r"\{([a-z_]+)\}")


class ProfileError(ValueError):
    """An invalid profiles file; the message names the file and key path of each problem."""


@dataclass(frozen=True, slots=True)
class PathRule:
    """One platform path that runs through the pipeline."""

    template: str
    """`/model/{model}/invoke`: each `{name}` matches one path segment (no `/`)."""
    api: str
    """The API shape of the body: `/v1/messages`, `/v1/chat/completions`, `/v1/responses` or
    `/converse` (Bedrock Converse)."""
    stream: bool = False
    """True when the path itself asks for a streamed response (`:streamRawPredict`)."""
    pattern: re.Pattern[str] = field(default=re.compile(""), compare=False)

    def match(self, path: str) -> dict[str, str] | None:
        """The template's named segments for `path` (percent-decoded), or `None`."""
        found = self.pattern.fullmatch(path)
        return found.groupdict() if found else None


def _compile_template(template: str) -> re.Pattern[str]:
    parts = _SEGMENT.split(template)
    out = ""
    for i, part in enumerate(parts):
        out += f"(?P<{part}>[^/]+?)" if i % 2 else re.escape(part)
    return re.compile(out)


@dataclass(frozen=True, slots=True)
class Profile:
    """One upstream platform's rules (see `rules/profiles.yaml` for each key's meaning)."""

    name: str
    family: str
    """`anthropic` or `openai`: which adapter and upstream serve it."""
    paths: tuple[PathRule, ...] = ()
    marker_attributes: frozenset[str] = frozenset({"type", "ttl", "scope"})
    tool_message_markers: bool = True
    rejected_betas: tuple[str, ...] = ()
    beta_body_field: str | None = None
    one_hour_models: tuple[str, ...] | None = None
    model_name: re.Pattern[str] | None = None
    min_tokens: tuple[tuple[str, int], ...] = ()
    """`(model prefix, tokens)`, longest prefix first."""
    signed_auth: tuple[str, ...] = ()
    claude_models: tuple[str, ...] = ()
    session_field: str | None = None
    cache_diagnostics: bool = True
    """False: the platform rejects Anthropic's `diagnostics` request field (Claude API only,
    docs/provider-rules.md 1.12), so the `cache_diagnostics` setting asks nothing there."""
    error_shape: ErrorShape | None = None
    """`None`: the family's own shape."""

    def model(self, model: Any) -> str | None:
        """`model` as the rules tables spell it (`us.anthropic.claude-x-v1:0` -> `claude-x`)."""
        if not isinstance(model, str) or not model:
            return None
        if self.model_name is not None:
            found = self.model_name.match(model)
            if found is not None and found.group("name"):
                return found.group("name")
        return model

    def min_tokens_for(self, model: str | None) -> int | None:
        """The platform's own minimum for `model` (tokens), `None` where it follows the API's."""
        if model is not None:
            for prefix, tokens in self.min_tokens:
                if model.startswith(prefix):
                    return tokens
        return None

    def allows_one_hour(self, model: str | None) -> bool:
        if self.one_hour_models is None:
            return True
        return model is not None and any(fnmatch.fnmatchcase(model, p) for p in self.one_hour_models)

    def is_claude(self, model: Any) -> bool:
        """True when an OpenAI-wire gateway serves `model` with Claude (`claude_models`)."""
        return isinstance(model, str) and any(fnmatch.fnmatchcase(model, p) for p in self.claude_models)

    def is_signed(self, authorization: str) -> bool:
        """True for a signed request (`Authorization: AWS4-HMAC-SHA256 ...`)."""
        return bool(authorization) and authorization.startswith(self.signed_auth) if self.signed_auth else False

    def accepts_beta(self, value: str) -> bool:
        return not value.startswith(self.rejected_betas) if self.rejected_betas else True

    def capabilities(self, model: str | None, overrides: UpstreamCapabilities | None = None) -> UpstreamCapabilities:
        """The effective marker capabilities for one request to `model` (rules-table spelling)."""
        over = overrides or _NO_OVERRIDES
        strip_ttl = over.strip_ttl or "ttl" not in self.marker_attributes or not self.allows_one_hour(model)
        strip_scope = over.strip_scope or "scope" not in self.marker_attributes
        no_tool = over.no_tool_message_markers or not self.tool_message_markers
        if (strip_ttl, strip_scope, no_tool) == (over.strip_ttl, over.strip_scope, over.no_tool_message_markers):
            return over
        return _caps(strip_ttl, strip_scope, no_tool)


_NO_OVERRIDES: Final = UpstreamCapabilities()


@functools.lru_cache(maxsize=8)
def _caps(strip_ttl: bool, strip_scope: bool, no_tool: bool) -> UpstreamCapabilities:
    return UpstreamCapabilities(strip_ttl=strip_ttl, strip_scope=strip_scope, no_tool_message_markers=no_tool)


DIRECT: Final = {family: Profile("direct", family) for family in FAMILIES}
"""The providers' own APIs: no path of their own, every marker attribute accepted."""


@dataclass(frozen=True, slots=True)
class Profiles:
    """Every loaded profile, by family and name."""

    by_family: Mapping[str, Mapping[str, Profile]]
    source: str = ""

    def get(self, family: str, name: str) -> Profile:
        """The profile `name` of `family`; raises `ProfileError` when there is none."""
        try:
            return self.by_family[family][name]
        except KeyError:
            known = ", ".join(sorted(self.by_family.get(family, {})))
            raise ProfileError(f"unknown {family} profile {name!r} (known: {known})") from None

    def with_paths(self) -> list[Profile]:
        """Profiles that declare platform paths, in file order."""
        return [p for family in FAMILIES for p in self.by_family.get(family, {}).values() if p.paths]


_KEYS: Final = frozenset(
    {
        "paths",
        "marker_attributes",
        "tool_message_markers",
        "rejected_betas",
        "beta_body_field",
        "one_hour_models",
        "model_name",
        "min_tokens",
        "signed_auth",
        "claude_models",
        "session_field",
        "cache_diagnostics",
        "error_shape",
    }
)


class _Errors:
    def __init__(self, file: str) -> None:
        self.file = file
        self.lines: list[str] = []

    def add(self, where: tuple[Any, ...], message: str) -> None:
        self.lines.append(f"{self.file}: {'.'.join(str(p) for p in where)}: {message}")


def _strings(value: Any, where: tuple[Any, ...], errors: _Errors) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        errors.add(where, "must be a list of non-empty strings")
        return ()
    return tuple(value)


def _profile(family: str, name: str, raw: Any, errors: _Errors) -> Profile | None:
    where = (family, name)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        errors.add(where, "must be a mapping")
        return None
    for key in raw:
        if key not in _KEYS:
            errors.add((*where, key), "unknown key")
    kw: dict[str, Any] = {}
    paths = []
    for i, item in enumerate(raw.get("paths") or []):
        at = (*where, "paths", i)
        if not isinstance(item, dict) or set(item) - {"template", "api", "stream"}:
            errors.add(at, "must be a mapping of template, api and stream")
            continue
        template, api, stream = item.get("template"), item.get("api"), item.get("stream", False)
        if not isinstance(template, str) or not template.startswith("/"):
            errors.add((*at, "template"), "must be a path starting with /")
            continue
        if api not in API_PATHS:
            errors.add((*at, "api"), f"must be one of {', '.join(sorted(API_PATHS))}")
            continue
        if not isinstance(stream, bool):
            errors.add((*at, "stream"), "must be true or false")
            continue
        paths.append(PathRule(template, api, stream, _compile_template(template)))
    kw["paths"] = tuple(paths)
    for key in ("marker_attributes",):
        if key in raw:
            kw[key] = frozenset(_strings(raw[key], (*where, key), errors))
    for key in ("rejected_betas", "signed_auth", "claude_models"):
        if key in raw:
            kw[key] = _strings(raw[key], (*where, key), errors)
    if "one_hour_models" in raw:
        kw["one_hour_models"] = _strings(raw["one_hour_models"], (*where, "one_hour_models"), errors)
    for key in ("tool_message_markers", "cache_diagnostics"):
        if key in raw:
            if not isinstance(raw[key], bool):
                errors.add((*where, key), "must be true or false")
            else:
                kw[key] = raw[key]
    for key in ("beta_body_field", "session_field"):
        if key in raw:
            if not isinstance(raw[key], str) or not raw[key]:
                errors.add((*where, key), "must be a non-empty string")
            else:
                kw[key] = raw[key]
    if "model_name" in raw:
        try:
            pattern = re.compile(str(raw["model_name"]))
            if "name" not in pattern.groupindex:
                raise re.error("needs a group named `name`")
            kw["model_name"] = pattern
        except re.error as exc:
            errors.add((*where, "model_name"), f"invalid regex: {exc}")
    if "min_tokens" in raw:
        table = raw["min_tokens"]
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in table.items()
        ):
            errors.add((*where, "min_tokens"), "must map model prefixes to token counts")
        else:
            kw["min_tokens"] = tuple(sorted(table.items(), key=lambda kv: (-len(kv[0]), kv[0])))
    if "error_shape" in raw:
        if raw["error_shape"] not in _SHAPES:
            errors.add((*where, "error_shape"), f"must be one of {', '.join(_SHAPES)}")
        else:
            kw["error_shape"] = raw["error_shape"]
    return Profile(name, family, **kw)


def parse_profiles(text: str, file: str = PROFILES_FILE) -> Profiles:
    """Profiles from YAML text; raises `ProfileError` listing every problem."""
    errors = _Errors(file)
    try:
        top = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{file}: invalid YAML: {exc}") from None
    if not isinstance(top, dict) or top.get("version") != 1:
        raise ProfileError(f"{file}: version: must be 1 (a mapping with `version: 1` at the top)")
    by_family: dict[str, dict[str, Profile]] = {}
    for key in top:
        if key != "version" and key not in FAMILIES:
            errors.add((key,), "unknown key (expected anthropic or openai)")
    for family in FAMILIES:
        section = top.get(family) or {}
        if not isinstance(section, dict):
            errors.add((family,), "must map profile names to profiles")
            continue
        profiles: dict[str, Profile] = {"direct": DIRECT[family]}
        for name, raw in section.items():
            profile = _profile(family, str(name), raw, errors)
            if profile is not None:
                profiles[str(name)] = profile
        by_family[family] = profiles
    if errors.lines:
        raise ProfileError("\n".join(errors.lines))
    return Profiles(by_family, file)


@functools.lru_cache(maxsize=8)
def load_profiles(dir: Path | None = None) -> Profiles:
    """`profiles.yaml` of `dir`, else the packaged one (loaded once per folder)."""
    path = Path(dir) / PROFILES_FILE if dir is not None else None
    if path is None or not path.is_file():
        path = packaged_rules_dir() / PROFILES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_profiles(text, str(path))
