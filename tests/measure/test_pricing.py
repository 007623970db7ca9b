"""rules/pricing.yaml and proxy.pricing: families, costs, and errors that name file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from proxy.pricing import DEFAULT_PATH, PricingError, load_pricing
from proxy.providers.base import Usage


def test_packaged_file_loads_and_is_dated() -> None:
    table = load_pricing()
    assert table.as_of == "2026-09-01"
    assert dict(table.sources)["anthropic"].startswith("https://platform.claude.com/")
    assert table.family_names("anthropic")[-1] == "other"
    assert len(table.family_names("anthropic")) + len(table.family_names("openai")) <= 30


@pytest.mark.parametrize(
    ("provider", "model", "family"),
    [
        ("anthropic", "claude-sonnet-4-6", "claude-sonnet-4"),
        ("anthropic", "claude-sonnet-4-5-20250929", "claude-sonnet-4"),
        ("anthropic", "claude-opus-4-1-20250805", "claude-opus-4"),
        ("anthropic", "claude-opus-4-20250514", "claude-opus-4"),
        ("anthropic", "claude-opus-4-8", "claude-opus-4.5"),
        ("anthropic", "claude-opus-5", "claude-opus-4.5"),
        ("anthropic", "claude-opus-5-5", "claude-opus-5.5"),
        ("anthropic", "claude-fable-5-1", "claude-fable-5.1"),
        ("anthropic", "claude-fable-5", "claude-fable-5"),
        ("anthropic", "claude-haiku-4-5@20251001", "claude-haiku-4.5"),
        ("anthropic", "claude-sonnet-4x", "other"),
        ("anthropic", "gpt-5", "other"),
        ("openai", "gpt-5", "gpt-5"),
        ("openai", "gpt-5.1-codex", "gpt-5"),
        ("openai", "gpt-5-mini-2025-08-07", "gpt-5-mini"),
        ("openai", "gpt-5.6", "other"),
        ("openai", "gpt-4o-mini", "gpt-4o-mini"),
        ("openai", "", "other"),
    ],
)
def test_family_by_longest_prefix(provider: str, model: str, family: str) -> None:
    assert load_pricing().family(provider, model) == family


def test_costs_in_usd() -> None:
    prices = load_pricing().prices("anthropic", "claude-opus-4-8")
    assert prices is not None
    usage = Usage(
        input_none=1_000, cache_read=100_000, cache_write_5m=10_000, cache_write_1h=2_000, output=500
    )
    # 1,000 x 5 + 100,000 x 0.5 + 10,000 x 6.25 + 2,000 x 10 + 500 x 25 = 150,000 micro-USD.
    assert prices.cost(usage) == pytest.approx(0.15, rel=1e-12)
    # 113,000 prompt tokens x 5 + 500 x 25 = 577,500 micro-USD.
    assert prices.uncached_cost(usage) == pytest.approx(0.5775, rel=1e-12)


def _write(tmp_path: Path, mutate) -> Path:
    doc = yaml.safe_load(DEFAULT_PATH.read_text())
    mutate(doc)
    path = tmp_path / "pricing.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("version"), "version: must be 1"),
        (lambda d: d.update(extra=1), "extra: unknown key"),
        (lambda d: d["families"]["gpt-5"].pop("cache_read"), "families.gpt-5.cache_read: missing"),
        (lambda d: d["families"]["gpt-5"].update(input=-1), "families.gpt-5.input: must not be negative"),
        (lambda d: d["families"]["gpt-5"].update(input="cheap"), "families.gpt-5.input: must be a number"),
        (
            lambda d: d["families"]["gpt-5"].update(provider="gemini"),
            "families.gpt-5.provider: must be one of",
        ),
        (lambda d: d["families"]["gpt-5"].update(colour=1), "families.gpt-5.colour: unknown key"),
        (lambda d: d["families"]["gpt-5"].update(prefixes=["gpt-4o"]), "already belongs to gpt-4o"),
        (lambda d: d["other"]["openai"].pop("output"), "other.openai.output: missing"),
        (lambda d: d["sources"].update(openai="ftp://x"), "sources.openai: must be an https:// URL"),
        (lambda d: d.pop("as_of"), "as_of: must be the date"),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, mutate, message: str) -> None:
    path = _write(tmp_path, mutate)
    with pytest.raises(PricingError) as info:
        load_pricing(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "pricing.yaml"
    path.write_text("version: 1\nfamilies: [unclosed\n")
    with pytest.raises(PricingError, match=r"pricing\.yaml: line 3 invalid YAML"):
        load_pricing(path)
