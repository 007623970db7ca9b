"""`WriterThread`: the SQLite store's one writer thread (jobs in order, a paced drain that a due
batch runs before the jobs queued after it, shutdown finishing what was queued)."""

from __future__ import annotations

import threading

import pytest

from proxy.store.writer_thread import WriterThread


class Drains:
    """A drain that records the thread it ran on and can be awaited by count."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.ran = threading.Semaphore(0)

    def __call__(self) -> None:
        self.threads.append(threading.current_thread().name)
        self.ran.release()


def test_jobs_run_in_order_on_one_named_thread_and_return_their_results() -> None:
    drains = Drains()
    writer = WriterThread("test-writer", drains, 0.0)
    try:
        seen: list[int] = []
        futures = [writer.submit(seen.append, i) for i in range(5)]
        assert [f.result(timeout=10) for f in futures] == [None] * 5
        assert seen == [0, 1, 2, 3, 4]
        assert writer.submit(lambda: threading.current_thread().name).result(timeout=10) == "test-writer"
        failed = writer.submit(int, "x")
        with pytest.raises(ValueError, match="invalid literal"):
            failed.result(timeout=10)
        assert writer.submit(lambda a, b=0: a + b, 2, b=3).result(timeout=10) == 5
        assert drains.threads == []  # no write queued: no drain
    finally:
        writer.shutdown()


def test_a_paced_batch_waits_for_the_interval_unless_urgent_and_a_due_one_runs_before_later_jobs() -> None:
    drains = Drains()
    writer = WriterThread("test-writer", drains, 3600.0)
    try:
        with writer.lock:
            writer.queued(is_urgent=False)  # after a quiet spell (the first): at once
        assert drains.ran.acquire(timeout=10)
        with writer.lock:
            writer.queued(is_urgent=False)  # within the hour: waits
        writer.submit(lambda: None).result(timeout=10)  # the job ran meanwhile, the drain did not
        assert len(drains.threads) == 1
        with writer.lock:
            writer.queued(is_urgent=True)  # a large write: now, with the paced one
        writer.submit(lambda: None).result(timeout=10)  # queued after it: runs after the drain
        assert drains.threads == ["test-writer", "test-writer"]
    finally:
        writer.shutdown()


def test_an_idle_thread_is_woken_by_a_queued_write() -> None:
    drains = Drains()
    writer = WriterThread("test-writer", drains, 0.0)
    try:
        writer.submit(lambda: None).result(timeout=10)  # started, then idle
        for count in range(1, 4):
            with writer.lock:
                writer.queued(is_urgent=False)
            assert drains.ran.acquire(timeout=10)
            assert len(drains.threads) == count
    finally:
        writer.shutdown()


def test_shutdown_drains_the_paced_batch_and_then_refuses_work() -> None:
    drains = Drains()
    writer = WriterThread("test-writer", drains, 3600.0)
    with writer.lock:
        writer.queued(is_urgent=False)
    assert drains.ran.acquire(timeout=10)
    gate = threading.Event()
    busy = writer.submit(gate.wait)
    with writer.lock:
        writer.queued(is_urgent=False)  # within the hour, while the thread is busy: paced
    later = writer.submit(lambda: "after")
    gate.set()
    writer.shutdown()  # waits: the paced batch and the job queued before it are done
    assert busy.result(timeout=0) is True
    assert later.result(timeout=0) == "after"
    assert len(drains.threads) == 2
    with pytest.raises(RuntimeError):
        writer.submit(lambda: None)
    with writer.lock, pytest.raises(RuntimeError):
        writer.queued(is_urgent=True)
