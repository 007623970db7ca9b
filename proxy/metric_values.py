"""Multiprocess metric values (`serve --workers N`) written to the shared files once per loop turn.

In multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`, `proxy.workers`) prometheus-client writes a
value's mmap'd file on every change (a lock, a pid check, a struct pack: about 2 us an increment
and 6 us a histogram observation here, against 0.4 and 1.5 in one process; a request makes about
30). `BatchedValue` wraps the library's value: increments made during one event-loop turn are
summed in the process and added to the library's value once, at the end of the turn
(`loop.call_soon`), so a value that one turn touches many times (at 64 connections a turn serves
several requests) is written once.

Contract: totals are the library's, exactly (a `set` first writes what is pending); a scrape
answered by another worker sees an increment at most one loop turn after it was made. Outside
a running event loop (the SQLite writer thread, shutdown) an increment is written at once, and
what is pending is written at exit (`atexit`). `install()` makes prometheus-client build its
values through `BatchedValue`: call it before the first metric is built; without
multiprocess mode it does nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from typing import Any

from prometheus_client import values

_LOCK = threading.Lock()
_DIRTY: list[BatchedValue] = []
"""Values with an increment not yet written (each once)."""
_library_value: Any = None
"""The library's multiprocess value class that `install()` found (`None` before)."""


class BatchedValue:
    """One metric value whose increments reach `inner` (the library's value) once per loop turn."""

    _multiprocess = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._inner = _library_value(*args, **kwargs)
        self._delta = 0.0
        self._is_dirty = False

    def inc(self, amount: float) -> None:
        with _LOCK:
            self._delta += amount
            if self._is_dirty:
                return
            self._is_dirty = True
            _DIRTY.append(self)
            is_first = len(_DIRTY) == 1
        if is_first:
            _schedule()

    def set(self, value: float, timestamp: float | None = None) -> None:
        with _LOCK:
            self._delta = 0.0  # the value set replaces what was added before it
            self._inner.set(value, timestamp)

    def get(self) -> float:
        with _LOCK:
            return float(self._inner.get()) + self._delta

    def set_exemplar(self, exemplar: Any) -> None:
        self._inner.set_exemplar(exemplar)

    def get_exemplar(self) -> Any:
        return self._inner.get_exemplar()


def _schedule() -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on the event loop's thread: written now
        flush()
        return
    loop.call_soon(flush)


def flush() -> None:
    """Write every pending increment to the library's values (the shared files)."""
    with _LOCK:
        dirty = list(_DIRTY)
        _DIRTY.clear()
        for value in dirty:
            delta, value._delta, value._is_dirty = value._delta, 0.0, False
            if delta:
                value._inner.inc(delta)


def install() -> bool:
    """Build prometheus-client's values as `BatchedValue`s when it is in multiprocess mode;
    `True` when they are (idempotent)."""
    global _library_value
    current = values.ValueClass
    if current is BatchedValue:
        return True
    if not getattr(current, "_multiprocess", False):
        return False
    _library_value = current
    values.ValueClass = BatchedValue
    atexit.register(flush)
    return True
