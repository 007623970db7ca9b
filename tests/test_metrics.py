"""`proxy.metrics.Histogram`: its short `observe` gives exactly the library's samples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client import Histogram as LibraryHistogram

from proxy.metrics import Histogram

BUCKETS = (0.0001, 0.001, 0.01, 0.1, 1.0)


def _samples(registry: CollectorRegistry, name: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name.removeprefix(name), s.labels, s.value)
        for m in registry.collect()
        if m.name == name
        for s in m.samples
        if not s.name.endswith("_created")
    ]


def _pair(labelled: bool) -> tuple[CollectorRegistry, object, object]:
    registry = CollectorRegistry()
    labels = ["stage"] if labelled else []
    ours = Histogram("pc_ours", "test", labels, buckets=BUCKETS, registry=registry)
    theirs = LibraryHistogram("pc_theirs", "test", labels, buckets=BUCKETS, registry=registry)
    if labelled:
        return registry, ours.labels("parse"), theirs.labels("parse")
    return registry, ours, theirs


def test_bucket_edges_infinity_and_negative_amounts_land_where_the_library_puts_them() -> None:
    registry, ours, theirs = _pair(labelled=True)
    amounts = [0.0, 0.0001, 0.00010001, 0.001, 0.5, 1.0, 1.0000001, 7.0, math.inf, -3.0]
    for amount in amounts:
        ours.observe(amount)  # type: ignore[attr-defined]
        theirs.observe(amount)  # type: ignore[attr-defined]
    got = _samples(registry, "pc_ours")
    assert got == _samples(registry, "pc_theirs")
    buckets = [value for suffix, _, value in got if suffix == "_bucket"]
    assert buckets == [3.0, 5.0, 5.0, 5.0, 7.0, 10.0]  # le 0.0001, 0.001, 0.01, 0.1, 1, +Inf


def test_nan_and_exemplars_take_the_library_path() -> None:
    registry, ours, theirs = _pair(labelled=False)
    for metric in (ours, theirs):
        metric.observe(math.nan)  # type: ignore[attr-defined]
        metric.observe(0.01, {"trace_id": "abc"})  # type: ignore[attr-defined]
    ours_samples, theirs_samples = _samples(registry, "pc_ours"), _samples(registry, "pc_theirs")
    assert repr(ours_samples) == repr(theirs_samples)  # the sum is NaN in both (NaN != NaN)
    # NaN falls in no bucket (the library's loop never matches it); 0.01 in le=0.01 and up
    assert [v for suffix, _, v in ours_samples if suffix == "_bucket"] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_a_labelled_parent_still_refuses_observe() -> None:
    parent = Histogram("pc_parent", "test", ["stage"], buckets=BUCKETS, registry=CollectorRegistry())
    with pytest.raises(ValueError, match="missing label values"):
        parent.observe(0.1)


@given(st.lists(st.floats(allow_nan=False, min_value=-10, max_value=10), max_size=40))
def test_any_amounts_give_the_library_samples(amounts: list[float]) -> None:
    registry, ours, theirs = _pair(labelled=True)
    for amount in amounts:
        ours.observe(amount)  # type: ignore[attr-defined]
        theirs.observe(amount)  # type: ignore[attr-defined]
    assert _samples(registry, "pc_ours") == _samples(registry, "pc_theirs")
