"""glibc's allocator, tuned from inside `serve` (settings `malloc_arena_max`,
`malloc_mmap_threshold`, `malloc_trim_interval`).

What promptcache's resident memory is made of under 600 KB agent bodies (`bench/memory_bench.py`
prints it): besides the interpreter, the live caches and the requests in flight, most of the
rest is free memory glibc keeps inside the event loop's heap (the main arena): every request
allocates and frees several whole-body buffers (the raw body, orjson's parse buffer of about
12x the body, the rewritten body, the record encoding), and the holes they leave between
long-lived small objects are neither returned to the system nor always reusable by the next,
larger body of a growing conversation.

- `configure(arena_max, mmap_threshold)` calls `mallopt` once at start, before the threads
  (SQLite's two, the executor) make their own arenas: `M_ARENA_MAX` bounds those arenas (each may
  grow a 64 MiB heap; glibc's default allows eight per core); `M_MMAP_THRESHOLD`, when set, fixes
  the size from which an allocation gets its own mapping, returned to the system on free (glibc
  otherwise raises it to the largest block freed so far, up to 32 MiB, so after the first large
  body every buffer comes from the heap). A fixed threshold costs a page fault per touched 4 KiB
  page of each such buffer (measured here: a 600 KB copy into a fresh mapping 0.72 ms against
  0.02 ms into reused heap), so it is off by default.
- `Trimmer` hands the free pages of every arena back to the system (`malloc_trim(0)`) from a
  thread (ctypes releases the GIL; the allocator locks each arena in turn) once per interval
  while requests are being served, and once more after the traffic stops: the heap's free holes
  stop being resident, at the cost of faulting them in again when reused.

Linux with glibc only: elsewhere (musl, macOS) every call is a no-op that reports so, and
nothing fails. Pure decisions (`is_due`) are separate from the calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Final

from proxy.aio import create_task

M_MMAP_THRESHOLD: Final = -3
M_ARENA_MAX: Final = -8
"""`mallopt` parameter numbers (glibc `malloc.h`)."""

def _glibc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it (`gnu_get_libc_version` exists), else `None`."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.gnu_get_libc_version  # noqa: B018 (musl has no such symbol)
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    libc.malloc_trim.restype = ctypes.c_int
    return libc


_LIBC: Final = _glibc()


def available() -> bool:
    """Whether the allocator calls do anything here (Linux with glibc)."""
    return _LIBC is not None


def configure(arena_max: int = 0, mmap_threshold: int = 0) -> dict[str, int]:
    """Apply the settings (0: leave glibc's default) and return what was applied, by `mallopt`
    name (`{}` when nothing was, or not on glibc). `mmap_threshold` is clamped by glibc to at most
    32 MiB (a larger value is refused: not in the result)."""
    if _LIBC is None:
        return {}
    applied = {}
    wanted = (("M_ARENA_MAX", M_ARENA_MAX, arena_max), ("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, mmap_threshold))
    for name, param, value in wanted:
        if value > 0 and _LIBC.mallopt(param, value) == 1:
            applied[name] = value
    return applied


def trim() -> bool:
    """`malloc_trim(0)`: free pages of every arena back to the system; `True` when some were."""
    return _LIBC is not None and _LIBC.malloc_trim(0) == 1


def resident_bytes() -> int:
    """This process's resident set now (`/proc/self/statm`), 0 where there is none."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def is_due(served: int, last_served: int, idle_trimmed: bool) -> bool:
    """Whether a tick should trim: requests were served since the last tick (`served` is the
    running count, `last_served` its value then), or none were and the quiet spell that began has
    not been trimmed yet (`idle_trimmed`)."""
    return served != last_served or not idle_trimmed


@dataclass(slots=True)
class Trimmer:
    """`trim()` every `interval` seconds while `served()` grows, and once after it stops."""

    interval: float
    served: Callable[[], int]
    """The running count of requests served (`serve` passes the admission gate's)."""
    trims: int = 0
    """Trims done."""
    released: int = 0
    """Resident bytes the trims gave back in all (RSS before minus after, when it fell)."""
    _last: int = 0
    _idle_trimmed: bool = True

    async def tick(self) -> bool:
        """One tick: trim when due (`is_due`), in the default executor (not on the loop);
        whether it trimmed."""
        now = self.served()
        if not is_due(now, self._last, self._idle_trimmed):
            return False
        self._idle_trimmed = now == self._last
        self._last = now
        before = resident_bytes()
        await asyncio.get_running_loop().run_in_executor(None, trim)
        self.trims += 1
        self.released += max(0, before - resident_bytes())
        return True

    async def run(self) -> None:
        """Tick every `interval` seconds until cancelled."""
        self._last = self.served()
        while True:
            await asyncio.sleep(self.interval)
            await self.tick()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Trimmer]:
        """Run the ticks for the body of the `async with` block (nothing when not on glibc)."""
        on = available() and self.interval > 0
        task = create_task(self.run(), name="promptcache-malloc-trim") if on else None
        try:
            yield self
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
