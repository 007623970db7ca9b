"""`proxy.metric_values`: multiprocess values written once per loop turn, totals unchanged.

The values are built over prometheus-client's own multiprocess value class in a temporary
`PROMETHEUS_MULTIPROC_DIR`, and read back through the library's `MultiProcessCollector` (what
`/metrics` under `--workers` serves), so the test sees what another worker would.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, multiprocess, values

from proxy import metric_values
from proxy.metrics import Counter


@pytest.fixture
def batched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """`BatchedValue` over the library's multiprocess class writing into `tmp_path`."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    monkeypatch.setattr(metric_values, "_library_value", None)
    assert metric_values.install()
    assert values.ValueClass is metric_values.BatchedValue
    yield tmp_path
    metric_values.flush()


def _shared(directory: Path, name: str) -> float:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    return registry.get_sample_value(name, {"kind": "a"}) or 0.0


async def test_increments_of_one_turn_reach_the_shared_file_at_its_end(batched: Path) -> None:
    counter = Counter("pc_test_turns", "test", ["kind"], registry=None).labels("a")
    for _ in range(1000):
        counter.inc(2)
    assert counter._value.get() == 2000  # this process sees them at once
    assert _shared(batched, "pc_test_turns_total") == 0  # not yet written
    await asyncio.sleep(0)  # the loop's turn ends: one write
    assert _shared(batched, "pc_test_turns_total") == 2000
    counter.inc(5)
    await asyncio.sleep(0)
    assert _shared(batched, "pc_test_turns_total") == 2005


def test_without_a_loop_an_increment_is_written_at_once(batched: Path) -> None:
    counter = Counter("pc_test_now", "test", ["kind"], registry=None).labels("a")
    counter.inc(3)
    assert _shared(batched, "pc_test_now_total") == 3
    done = threading.Thread(target=counter.inc, args=(4,))
    done.start()
    done.join()
    assert _shared(batched, "pc_test_now_total") == 7


async def test_a_set_replaces_what_was_added_before_it(batched: Path) -> None:
    from prometheus_client import Gauge

    gauge = Gauge("pc_test_gauge", "test", ["kind"], registry=None, multiprocess_mode="livesum").labels("a")
    gauge.inc(10)
    gauge.set(4)
    gauge.inc(1)
    assert gauge._value.get() == 5
    await asyncio.sleep(0)
    assert _shared(batched, "pc_test_gauge") == 5


def test_without_multiprocess_mode_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "ValueClass", values.MutexValue)
    assert not metric_values.install()
    assert values.ValueClass is values.MutexValue
