"""Per-model numbers for the simulator, loaded once from `rules/simulator.yaml` (or a user file).

Contract:
- The file has `version: 1`, an `anthropic` and an `openai` section; each has a `default` (used for
  any model id no rule matches) and an ordered `models` list of rules. A rule has `models:` (a list
  of exact ids or `fnmatch` patterns such as `claude-opus-5-*`) and overrides of default fields.
  The **first** matching rule wins, so specific patterns go first.
- Unknown keys, wrong types and a missing `version` are errors (`ConfigError`) naming the file and
  the key path; YAML syntax errors name the line.
- `SimConfig` is frozen; `anthropic_model(id)` / `openai_model(id)` resolve (and memoise) the
  settings for a model id. Numbers come from docs/provider-rules.md 1.6 (minimums), 1.4/1.5 (4 breakpoints,
  20-position lookback), 1.7 (TTLs), 2.1-2.3 (OpenAI threshold, 128-token steps, routing, overflow,
  retention, GPT-5.6+ breakpoints).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import yaml


def _default_path() -> Path:
    """`rules/simulator.yaml` at the repository root, else where a wheel installs the rules
    (`<prefix>/share/promptcache/rules`). Kept separate from the proxy's own lookup on purpose:
    the simulator imports nothing from the proxy."""
    source = Path(__file__).resolve().parents[2] / "rules" / "simulator.yaml"
    if source.is_file():
        return source
    for prefix in (sys.prefix, sys.base_prefix):
        installed = Path(prefix) / "share" / "promptcache" / "rules" / "simulator.yaml"
        if installed.is_file():
            return installed
    return source


DEFAULT_PATH: Final = _default_path()

_GLOB_CHARS: Final = frozenset("*?[")


class ConfigError(ValueError):
    """An invalid simulator config; the message names the file and key path."""


@dataclass(frozen=True, slots=True)
class AnthropicModel:
    """Cache numbers of one Anthropic model."""

    min_cache_tokens: int = 1024
    """Minimum cumulative prefix (tokens) at a breakpoint for a write (docs/provider-rules.md 1.6)."""
    ttls: tuple[str, ...] = ("5m", "1h")
    """TTLs the model offers; a marker with another offered-by-the-API TTL is refused (1.7)."""
    lookback_positions: int = 20
    """Positions each breakpoint checks, counting itself (1.5)."""
    max_breakpoints: int = 4
    """`cache_control` markers per request, the automatic one included (1.4)."""
    default_effort: str | None = "high"
    """`output_config.effort` value equal to "omitted" for the params fingerprint (1.8)."""


@dataclass(frozen=True, slots=True)
class OpenAIModel:
    """Cache numbers of one OpenAI model."""

    min_cache_tokens: int = 1024
    """Minimum prompt length (tokens) for any caching (2.1)."""
    step_tokens: int = 128
    """Granularity of automatic hits above the minimum (2.1, 2.5)."""
    routing_prefix_tokens: int = 256
    """Leading tokens hashed (with `prompt_cache_key`) to pick a machine (2.1)."""
    overflow_requests_per_minute: int = 15
    """Requests per minute per routing key a machine takes; later ones land elsewhere (2.1)."""
    retention_seconds: float = 600.0
    """In-memory idle retention of automatic entries, refreshed on use (2.2)."""
    extended_retention_seconds: float = 86_400.0
    """Idle retention with `prompt_cache_retention: "24h"` (2.2)."""
    breakpoints: bool = False
    """GPT-5.6+ semantics: exact matching at breakpoints, no automatic 128-token steps (2.3)."""
    breakpoint_ttls: Mapping[str, float] = field(default_factory=lambda: {"30m": 1800.0})
    """Accepted `prompt_cache_options.ttl` values -> minimum lifetime in seconds (2.3)."""
    max_breakpoint_writes: int = 4
    """Breakpoints written per request (2.3)."""
    breakpoint_read_window: int = 80
    """Latest breakpoints considered when matching (2.3)."""


S = TypeVar("S", AnthropicModel, OpenAIModel)


@dataclass(frozen=True, slots=True)
class ModelRule:
    patterns: tuple[str, ...]
    """Exact ids or `fnmatch` patterns."""
    overrides: Mapping[str, Any]
    """Field overrides applied on top of the section default."""


@dataclass(frozen=True)
class SimConfig:
    """The whole simulator table; build with `SimConfig.load(path)` or `from_mapping`."""

    anthropic_default: AnthropicModel = AnthropicModel()
    anthropic_rules: tuple[ModelRule, ...] = ()
    openai_default: OpenAIModel = OpenAIModel()
    openai_rules: tuple[ModelRule, ...] = ()
    source: str = "<defaults>"
    _memo: dict[tuple[str, str], Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def load(cls, path: str | Path | None = None) -> SimConfig:
        """Read and validate a YAML file (default `rules/simulator.yaml`); blocking file I/O."""
        p = Path(path) if path is not None else DEFAULT_PATH
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read simulator config: {exc.strerror or exc}") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{p}:{where}: invalid YAML: {exc}") from exc
        return cls.from_mapping(data, source=str(p))

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "<mapping>") -> SimConfig:
        """Validate an already-parsed mapping (the YAML document)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: the document must be a mapping")
        _check_keys(data, {"version", "anthropic", "openai"}, source, "")
        if data.get("version") != 1:
            raise ConfigError(f"{source}: version: required and must be 1")
        a_default, a_rules = _section(data.get("anthropic", {}), AnthropicModel, source, "anthropic")
        o_default, o_rules = _section(data.get("openai", {}), OpenAIModel, source, "openai")
        return cls(a_default, a_rules, o_default, o_rules, source)

    def anthropic_model(self, model: str) -> AnthropicModel:
        """Settings for an Anthropic model id (first matching rule, else the default)."""
        return self._resolve("anthropic", model, self.anthropic_default, self.anthropic_rules)

    def openai_model(self, model: str) -> OpenAIModel:
        """Settings for an OpenAI model id (first matching rule, else the default)."""
        return self._resolve("openai", model, self.openai_default, self.openai_rules)

    def model_ids(self, provider: str) -> list[str]:
        """Exact (pattern-free) ids named in a provider's rules, in file order."""
        rules = self.anthropic_rules if provider == "anthropic" else self.openai_rules
        return [p for r in rules for p in r.patterns if not (_GLOB_CHARS & set(p))]

    def _resolve(self, provider: str, model: str, default: S, rules: tuple[ModelRule, ...]) -> S:
        key = (provider, model)
        hit = self._memo.get(key)
        if hit is None:
            hit = default
            for rule in rules:
                if any(fnmatch.fnmatchcase(model, p) for p in rule.patterns):
                    hit = dataclasses.replace(default, **rule.overrides)
                    break
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = hit
        return hit


def _check_keys(obj: Mapping[str, Any], allowed: set[str], source: str, path: str) -> None:
    for key in obj:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(f"{source}: {where}: unknown key (allowed: {', '.join(sorted(allowed))})")


def _section(raw: Any, cls: type[S], source: str, path: str) -> tuple[S, tuple[ModelRule, ...]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {path}: must be a mapping")
    _check_keys(raw, {"default", "models"}, source, path)
    default = cls(**_fields(raw.get("default") or {}, cls, source, f"{path}.default"))
    rules = []
    models = raw.get("models") or []
    if not isinstance(models, list):
        raise ConfigError(f"{source}: {path}.models: must be a list of rules")
    for i, item in enumerate(models):
        where = f"{path}.models[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{source}: {where}: must be a mapping")
        patterns = item.get("models")
        if (
            not isinstance(patterns, list)
            or not patterns
            or not all(isinstance(p, str) and p for p in patterns)
        ):
            raise ConfigError(f"{source}: {where}.models: must be a non-empty list of model ids")
        overrides = {k: v for k, v in item.items() if k != "models"}
        fields = _fields(overrides, cls, source, where)
        dataclasses.replace(default, **fields)  # validates the combination early
        rules.append(ModelRule(tuple(patterns), fields))
    return default, tuple(rules)


def _fields(raw: Any, cls: type[S], source: str, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {path}: must be a mapping")
    known = {f.name: f for f in dataclasses.fields(cls)}
    _check_keys(raw, set(known), source, path)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{source}: {path}.{key}"
        sample = getattr(cls(), key)
        if isinstance(sample, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: expected true or false")
            out[key] = value
        elif isinstance(sample, int):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{where}: expected an integer >= 0")
            out[key] = value
        elif isinstance(sample, float):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"{where}: expected a number of seconds >= 0")
            out[key] = float(value)
        elif isinstance(sample, tuple):
            if not isinstance(value, list) or not all(v in ("5m", "1h") for v in value):
                raise ConfigError(f"{where}: expected a list of '5m' / '1h'")
            out[key] = tuple(value)
        elif isinstance(sample, Mapping):
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                for k, v in value.items()
            ):
                raise ConfigError(f"{where}: expected a mapping of ttl name -> seconds > 0")
            out[key] = {k: float(v) for k, v in value.items()}
        else:  # str | None
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{where}: expected a string or null")
            out[key] = value
    return out
