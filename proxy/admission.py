"""Admission to the request stages, bounded in client-body bytes (`pipeline_inflight_bytes`).

The request stages are CPU work on one event loop with one await (the session record's read),
so running more requests through them at once does not finish any sooner: it only interleaves
them, and each one interleaved holds its parsed body, the views built over it and the rewritten
body while it waits for its turn (about 5x its raw size; at 64 connections of 600 KB sessions
that was most of the peak RSS). `BodyGate` lets requests into the stages while the raw bytes of
those inside stay within `limit`; the others wait in arrival order holding only their raw
bytes. A body larger than the whole limit is let in alone (nothing else inside). Nothing is
dropped or refused: a wait is counted (`promptcache_pipeline_admission_waits_total`), and its
time is part of the request's latency. A waiting request whose client leaves gives up its
place; one let in gives its bytes back when it leaves the stages, whatever happens in them.
The forward to the upstream and the response are not under the gate (a slow upstream holds
no place).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable


class BodyGate:
    """FIFO admission by bytes (module docstring). Not thread-safe: one event loop."""

    def __init__(self, limit: int, on_wait: Callable[[], None] | None = None) -> None:
        """`limit`: raw bytes inside at once (0: no bound); `on_wait` is called once per request
        that has to wait."""
        self.limit = limit
        self.held = 0
        """Raw bytes of the requests inside."""
        self.inside = 0
        """Requests inside."""
        self.admitted = 0
        """Requests let in so far (the allocator's trimmer reads it as activity)."""
        self._on_wait = on_wait
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return len(self._waiting)

    @property
    def waiting_bytes(self) -> int:
        """Raw bytes the requests waiting for their turn hold (their bodies, read before the
        wait; a sum over the queue, for diagnostics such as `bench/memory_bench.py`)."""
        return sum(size for size, turn in self._waiting if not turn.done())

    def _fits(self, size: int) -> bool:
        return self.limit <= 0 or self.inside == 0 or self.held + size <= self.limit

    def try_enter(self, size: int) -> bool:
        """Take `size` bytes of the limit now when no one waits and they fit (`admit`'s path
        without a wait, with no async context manager per request); `True` when taken, and
        the caller then calls `leave(size)` once, whatever happens inside."""
        if not self._waiting and self._fits(size):
            self._take(size)
            return True
        return False

    def leave(self, size: int) -> None:
        """Give back the bytes `try_enter` took (and let the waiting requests that fit in)."""
        self._give_back(size)

    @contextlib.asynccontextmanager
    async def admit(self, size: int) -> AsyncIterator[None]:
        """Hold `size` bytes of the limit for the body of the `async with` block."""
        if not self._waiting and self._fits(size):
            self._take(size)
        else:
            if self._on_wait is not None:
                self._on_wait()
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (size, turn)
            self._waiting.append(entry)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._give_back(size)  # let in, then cancelled before it ran
                else:
                    with contextlib.suppress(ValueError):  # `_let_in` may have skipped it already
                        self._waiting.remove(entry)
                    self._let_in()  # the request behind it may fit now
                raise
        try:
            yield
        finally:
            self._give_back(size)

    def _take(self, size: int) -> None:
        self.held += size
        self.inside += 1
        self.admitted += 1

    def _give_back(self, size: int) -> None:
        self.held -= size
        self.inside -= 1
        self._let_in()

    def _let_in(self) -> None:
        """Admit waiting requests, in order, while the first one fits."""
        while self._waiting and self._fits(self._waiting[0][0]):
            size, turn = self._waiting.popleft()
            if turn.done():  # cancelled, its task not yet resumed
                continue
            self._take(size)
            turn.set_result(None)
