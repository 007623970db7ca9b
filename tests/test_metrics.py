"""`proxy.metrics.Histogram` and `Counter`: their short `observe` / `inc` give exactly the
library's samples; in one process their values are lock-free `LoopValue`s, except the metrics
another thread changes (the store's)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, values
from prometheus_client import Counter as LibraryCounter
from prometheus_client import Histogram as LibraryHistogram

from proxy.metrics import Counter, Histogram, LoopValue, Metrics, ThreadSafeCounter, ThreadSafeHistogram

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


def _counter_pair(labelled: bool) -> tuple[CollectorRegistry, object, object]:
    registry = CollectorRegistry()
    labels = ["kind"] if labelled else []
    ours = Counter("pc_ours", "test", labels, registry=registry)
    theirs = LibraryCounter("pc_theirs", "test", labels, registry=registry)
    if labelled:
        return registry, ours.labels("a"), theirs.labels("a")
    return registry, ours, theirs


@given(st.lists(st.floats(allow_nan=False, min_value=0, max_value=1e6), max_size=40), st.booleans())
def test_any_increments_give_the_library_counter_samples(amounts: list[float], labelled: bool) -> None:
    registry, ours, theirs = _counter_pair(labelled)
    for amount in amounts:
        ours.inc(amount)  # type: ignore[attr-defined]
        theirs.inc(amount)  # type: ignore[attr-defined]
    assert _samples(registry, "pc_ours") == _samples(registry, "pc_theirs")


def test_a_counter_refuses_a_negative_amount_and_keeps_an_exemplar_as_the_library_does() -> None:
    registry, ours, theirs = _counter_pair(labelled=False)
    for metric in (ours, theirs):
        with pytest.raises(ValueError, match="only be incremented by non-negative"):
            metric.inc(-1)  # type: ignore[attr-defined]
        metric.inc(2, {"trace_id": "abc"})  # type: ignore[attr-defined]
        metric.inc()  # type: ignore[attr-defined]
    assert _samples(registry, "pc_ours") == _samples(registry, "pc_theirs") == [("_total", {}, 3.0)]
    assert ours._value.get_exemplar().labels == {"trace_id": "abc"}  # type: ignore[attr-defined]


def test_single_process_values_are_lock_free_except_the_store_metrics() -> None:
    assert values.ValueClass is values.MutexValue  # the test process is not in multiprocess mode
    metrics = Metrics(CollectorRegistry())
    pm = metrics.by_provider["anthropic"]
    for counter in (pm.outcome["ok"], pm.input_tokens["read"], metrics.stage_error_counters["parse"]):
        assert type(counter._value) is LoopValue
    timer = metrics.stage_timers["session"]
    assert type(timer._sum) is LoopValue and all(type(b) is LoopValue for b in timer._buckets)
    # the store's writer thread counts evictions and faults: those keep the library's lock
    for name in ("store_errors", "store_dropped_writes", "store_local_reads", "store_evictions",
                 "store_skipped", "store_faults"):
        assert isinstance(getattr(metrics, name), ThreadSafeCounter), name
    assert isinstance(metrics.store_duration, ThreadSafeHistogram)
    evictions = metrics.store_evictions.labels("sqlite", "tenant")
    assert type(evictions._value) is values.MutexValue
    store_timer = metrics.store_duration.labels("sqlite", "get")
    assert type(store_timer._sum) is values.MutexValue
    evictions.inc(3)
    store_timer.observe(0.002)
    pm.outcome["ok"].inc()
    timer.observe(0.0003)
    r = metrics.registry
    assert r.get_sample_value("promptcache_session_store_evictions_total", {"backend": "sqlite", "cap": "tenant"}) == 3
    assert r.get_sample_value(
        "promptcache_session_store_operation_duration_seconds_count", {"backend": "sqlite", "operation": "get"}
    ) == 1
    assert r.get_sample_value("promptcache_requests_total", {"provider": "anthropic", "outcome": "ok"}) == 1
    assert r.get_sample_value("promptcache_stage_duration_seconds_bucket", {"stage": "session", "le": "0.0005"}) == 1
    assert r.get_sample_value("promptcache_stage_duration_seconds_bucket", {"stage": "session", "le": "0.00025"}) == 0
