"""`WriterThread`: one long-lived thread that runs a store's jobs and its paced batch drain.

- It is a one-thread `concurrent.futures.Executor` (`submit`, so `loop.run_in_executor` works
  with it) and, besides its jobs, runs `drain()`: the store's batch of queued writes.
- The event loop only tells it that writes are queued (`queued(is_urgent)`, under its lock: a
  flag and, only when the thread is idle or the write is urgent, a `notify`). A thread that is
  busy (in a job, a drain, or waiting out the interval) looks at the batch again by itself, so
  a steady stream of writes costs the loop no thread wake-up, no future and no timer per batch
  (py-spy, gateway bench small32 cell, session 10: `ThreadPoolExecutor.submit` and the pacing
  timer, once per batch of ~10 writes, were 3% of the loop's samples).
- Pacing: a drain starts at most once per `interval` seconds (`time.monotonic`), at once after a
  quiet spell or for an urgent write (one too large to wait, or `close`). A due drain runs
  before the jobs queued meanwhile, so a job submitted after an urgent write (the store's
  disconnect at close) runs after that write's transaction.
- `shutdown()` lets the thread finish a due drain and the jobs queued before it, then end; a
  `submit` or `queued` after it raises `RuntimeError` (as `ThreadPoolExecutor`'s does).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


class WriterThread(Executor):
    """See the module docstring. `drain`: called on the thread with no lock held; `interval`:
    seconds between the starts of two drains at least (the store's `write_interval`)."""

    def __init__(self, name: str, drain: Callable[[], None], interval: float) -> None:
        self.name = name
        self.interval = interval
        self._drain = drain
        self.lock = threading.Lock()
        """Held by the caller of `queued` around its append to the batch (the store's lock)."""
        self._wake = threading.Condition(self.lock)
        self._jobs: collections.deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._has_batch = False
        """Writes are queued for the next drain."""
        self._is_urgent = False
        """The next drain starts without waiting out the interval."""
        self._is_idle = False
        """The thread waits for work with no batch queued (only then does `queued` notify)."""
        self._started = -interval
        """`time.monotonic()` when the last drain began."""
        self._is_shut = False
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run `fn(*args, **kwargs)` on the thread, after the jobs before it (a due drain first)."""
        future: Future[Any] = Future()
        call = (lambda: fn(*args, **kwargs)) if kwargs else fn
        with self._wake:
            if self._is_shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.append((future, call, args if not kwargs else ()))
            self._start()
            self._wake.notify()
        return future

    def queued(self, is_urgent: bool) -> None:
        """Writes were queued for the drain (the caller holds `lock`); `is_urgent`: start it
        now, not after the interval. Raises `RuntimeError` after `shutdown`."""
        if self._is_shut:
            raise RuntimeError("writer thread shut down")
        self._has_batch = True
        if is_urgent:
            self._is_urgent = True
        if self._thread is None:
            self._start()
        elif self._is_idle or is_urgent:
            self._wake.notify()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more work; the thread ends once the due drain and the queued jobs are done."""
        with self._wake:
            self._is_shut = True
            if cancel_futures:
                for future, _, _ in self._jobs:
                    future.cancel()
                self._jobs.clear()
            self._wake.notify()
            thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _next(self) -> tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None:
        """Under the lock: wait for the next thing to do; `None` for a drain. Raises
        `StopIteration` when shut down with nothing left."""
        while True:
            if self._has_batch:
                now = time.monotonic()
                due = self._started + self.interval
                if self._is_urgent or now >= due or self._is_shut:
                    self._has_batch = self._is_urgent = False
                    self._started = now
                    return None
            if self._jobs:
                return self._jobs.popleft()
            if self._is_shut:
                raise StopIteration
            self._is_idle = not self._has_batch
            try:
                self._wake.wait(due - now if self._has_batch else None)
            finally:
                self._is_idle = False

    def _run(self) -> None:
        while True:
            with self._wake:
                try:
                    job = self._next()
                except StopIteration:
                    return
            if job is None:
                self._drain()
                continue
            future, call, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the job's caller
                future.set_exception(exc)
            else:
                future.set_result(result)
