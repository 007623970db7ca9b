"""Cost model: list prices per model family, loaded once from `rules/pricing.yaml`.

Contract:
- `load_pricing(path)` reads and validates the file into a frozen `PricingTable`; every error is
  a `PricingError` naming the file and the key path (and the line for YAML syntax errors).
  Unknown keys, missing fields, negative or non-numeric prices, a missing `version`, `as_of` or
  source, a family whose provider has no `other` row and a prefix claimed by two families are
  errors.
- `PricingTable.family(provider, model)` maps any model id to a family name from the file or to
  `other`: the label set is bounded by the file, whatever model strings clients send. A prefix
  matches the id itself or the id followed by a non-alphanumeric character other than `.`
  (`claude-opus-4` matches `claude-opus-4-20250514` and `claude-opus-4@x`, `gpt-5` does not match
  `gpt-5.6`); the longest matching prefix wins.
- `Prices.cost(usage)` is the actual cost of one response and `Prices.uncached_cost(usage)` the
  counterfactual cost with every prompt token billed as uncached input (USD). Savings are their
  difference and may be negative (writes cost more than input: docs/provider-rules.md 1.9).
- `default_pricing()` loads the packaged file once per process (memoised).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from proxy.paths import packaged_rules_dir
from proxy.providers.base import Usage

DEFAULT_PATH: Final = packaged_rules_dir() / "pricing.yaml"
"""`rules/pricing.yaml` at the repository root."""
OTHER: Final = "other"
"""Family label of every model id no prefix matches."""
PER_TOKENS: Final = 1_000_000
"""Prices are USD per this many tokens."""

_PRICE_FIELDS: Final = ("input", "output", "cache_write_5m", "cache_write_1h", "cache_read")
_FAMILY_FIELDS: Final = frozenset({"provider", "prefixes", *_PRICE_FIELDS})
_TOP_FIELDS: Final = frozenset({"version", "as_of", "sources", "families", "other"})
_MEMO_SIZE: Final = 1024


class PricingError(ValueError):
    """An invalid pricing file; the message names the file and the key path."""


@dataclass(frozen=True, slots=True)
class Prices:
    """One price row, USD per million tokens."""

    input: float
    """Uncached prompt tokens."""
    output: float
    cache_write_5m: float
    cache_write_1h: float
    cache_read: float

    def cost(self, usage: Usage) -> float:
        """Actual cost of `usage` in USD."""
        micro = (
            usage.input_none * self.input
            + usage.cache_read * self.cache_read
            + usage.cache_write_5m * self.cache_write_5m
            + usage.cache_write_1h * self.cache_write_1h
            + usage.output * self.output
        )
        return micro / PER_TOKENS

    def uncached_cost(self, usage: Usage) -> float:
        """Counterfactual cost of `usage` in USD had nothing been cached or written."""
        return (usage.prompt_total * self.input + usage.output * self.output) / PER_TOKENS


@dataclass(frozen=True, slots=True)
class Family:
    """A named price row and the model-id prefixes that select it."""

    name: str
    provider: str
    prefixes: tuple[str, ...]
    prices: Prices


@dataclass(frozen=True, slots=True)
class PricingTable:
    """The whole cost model; immutable, shared by every request."""

    as_of: str
    """Date the prices were read (ISO 8601)."""
    sources: tuple[tuple[str, str], ...]
    """`(provider, URL)` pairs the prices come from."""
    families: tuple[Family, ...]
    other: tuple[tuple[str, Prices], ...]
    """`(provider, prices)` for model ids no family claims."""
    _memo: dict[tuple[str, str], tuple[str, Prices | None]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    """Resolved `(provider, model)` pairs; cleared when it reaches `_MEMO_SIZE` entries."""

    def family_names(self, provider: str) -> tuple[str, ...]:
        """Every `family` label value `provider` can produce, `other` last."""
        return (*(f.name for f in self.families if f.provider == provider), OTHER)

    def family(self, provider: str, model: str) -> str:
        """Family label of `model` (see the module docstring); `other` when none matches."""
        return self.lookup(provider, model)[0]

    def prices(self, provider: str, model: str) -> Prices | None:
        """Price row of `model`; `None` when `provider` has no row at all."""
        return self.lookup(provider, model)[1]

    def lookup(self, provider: str, model: str) -> tuple[str, Prices | None]:
        """`(family, prices)` of `model` in one call (memoised, bounded)."""
        key = (provider, model)
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            found = self._memo[key] = _resolve(self, provider, model)
        return found


def _matches(model: str, prefix: str) -> bool:
    if not model.startswith(prefix):
        return False
    if len(model) == len(prefix):
        return True
    following = model[len(prefix)]
    return not following.isalnum() and following != "."


def _resolve(table: PricingTable, provider: str, model: str) -> tuple[str, Prices | None]:
    best: Family | None = None
    best_len = -1
    for family in table.families:
        if family.provider != provider:
            continue
        for prefix in family.prefixes:
            if len(prefix) > best_len and _matches(model, prefix):
                best, best_len = family, len(prefix)
    if best is not None:
        return best.name, best.prices
    return OTHER, dict(table.other).get(provider)


def _fail(path: Path, key: str, message: str) -> PricingError:
    return PricingError(f"{path}: {key}: {message}")


def _prices(path: Path, key: str, raw: Any, allowed: frozenset[str]) -> Prices:
    if not isinstance(raw, dict):
        raise _fail(path, key, "must be a mapping")
    unknown = sorted(set(map(str, raw)) - allowed)
    if unknown:
        raise _fail(path, f"{key}.{unknown[0]}", "unknown key")
    values: dict[str, float] = {}
    for name in _PRICE_FIELDS:
        if name not in raw:
            raise _fail(path, f"{key}.{name}", "missing")
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _fail(path, f"{key}.{name}", "must be a number (USD per million tokens)")
        if value < 0:
            raise _fail(path, f"{key}.{name}", "must not be negative")
        values[name] = float(value)
    return Prices(**values)


def parse_pricing(raw: Any, path: Path) -> PricingTable:
    """Validate an already-loaded YAML document (see the module docstring)."""
    if not isinstance(raw, dict):
        raise _fail(path, "(top level)", "must be a mapping")
    unknown = sorted(set(map(str, raw)) - _TOP_FIELDS)
    if unknown:
        raise _fail(path, unknown[0], "unknown key")
    if raw.get("version") != 1:
        raise _fail(path, "version", "must be 1")
    as_of = raw.get("as_of")
    if not isinstance(as_of, str) or not as_of:
        raise _fail(path, "as_of", "must be the date the prices were read, as a quoted string")
    sources = raw.get("sources")
    if not isinstance(sources, dict) or not sources:
        raise _fail(path, "sources", "must map each provider to the URL of its price list")
    for provider, url in sources.items():
        if not isinstance(url, str) or not url.startswith("https://"):
            raise _fail(path, f"sources.{provider}", "must be an https:// URL")
    other_raw = raw.get("other")
    if not isinstance(other_raw, dict):
        raise _fail(path, "other", "must map each provider to a price row")
    other = tuple(
        (str(p), _prices(path, f"other.{p}", row, frozenset(_PRICE_FIELDS))) for p, row in other_raw.items()
    )
    providers = {p for p, _ in other}
    families_raw = raw.get("families")
    if not isinstance(families_raw, dict):
        raise _fail(path, "families", "must be a mapping of family names")
    families: list[Family] = []
    owner: dict[tuple[str, str], str] = {}
    for name, row in families_raw.items():
        key = f"families.{name}"
        if not isinstance(name, str) or not name or name == OTHER:
            raise _fail(path, key, f"family names must be non-empty strings other than {OTHER!r}")
        prices = _prices(path, key, row, _FAMILY_FIELDS)
        provider = row.get("provider")
        if provider not in providers:
            raise _fail(path, f"{key}.provider", f"must be one of {sorted(providers)} (the `other` rows)")
        prefixes = row.get("prefixes")
        if (
            not isinstance(prefixes, list)
            or not prefixes
            or not all(isinstance(p, str) and p for p in prefixes)
        ):
            raise _fail(path, f"{key}.prefixes", "must be a non-empty list of model-id prefixes")
        for prefix in prefixes:
            if (provider, prefix) in owner:
                raise _fail(
                    path, f"{key}.prefixes", f"{prefix!r} already belongs to {owner[provider, prefix]}"
                )
            owner[provider, prefix] = name
        families.append(Family(name, provider, tuple(prefixes), prices))
    return PricingTable(
        as_of=as_of,
        sources=tuple((str(p), str(u)) for p, u in sources.items()),
        families=tuple(families),
        other=other,
    )


def load_pricing(path: str | Path = DEFAULT_PATH) -> PricingTable:
    """Read and validate a pricing file. Raises `PricingError` naming the file and key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PricingError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise PricingError(f"{path}:{line} invalid YAML: {exc}") from exc
    return parse_pricing(raw, path)


def pricing_for(dir: str | Path | None) -> PricingTable:
    """`pricing.yaml` of the rules folder `dir` when it has one, else the packaged table (as
    `proxy.profiles.load_profiles` does for `profiles.yaml`). Raises `PricingError`."""
    path = Path(dir) / DEFAULT_PATH.name if dir is not None else None
    if path is None or not path.is_file():
        return default_pricing()
    return load_pricing(path)


@functools.cache
def default_pricing() -> PricingTable:
    """The packaged `rules/pricing.yaml`, loaded once per process."""
    return load_pricing(DEFAULT_PATH)
