"""The simulator's clock: real wall time, or manual time that tests move.

Contract:
- `Clock.now()` returns epoch seconds (float). Every TTL, idle retention and rate window in the
  simulator reads time only through it, so a manual clock makes all cache expiry deterministic.
- A manual clock starts at a fixed epoch (default `MANUAL_START`) and moves only through
  `advance(seconds)` / `set(epoch_seconds)` (exposed as `POST /_sim/clock`). Time never goes
  backwards: `set` to an earlier instant is refused.
- A real clock refuses `advance` / `set` with `ClockError`.
"""

from __future__ import annotations

import time
from typing import Final

MANUAL_START: Final = 1_800_000_000.0
"""Default start of a manual clock (2027-01-15T08:00:00Z), epoch seconds."""


class ClockError(ValueError):
    """A manual-clock operation on a real clock, or time moved backwards."""


class Clock:
    """Epoch-seconds clock; `manual=True` freezes time until `advance` / `set`."""

    __slots__ = ("_manual", "_now")

    def __init__(self, *, manual: bool = False, start: float | None = None) -> None:
        self._manual = manual
        self._now = MANUAL_START if start is None else float(start)

    @classmethod
    def real(cls) -> Clock:
        return cls(manual=False)

    @classmethod
    def manual_at(cls, start: float = MANUAL_START) -> Clock:
        return cls(manual=True, start=start)

    @property
    def is_manual(self) -> bool:
        return self._manual

    def now(self) -> float:
        """Current time in epoch seconds."""
        return self._now if self._manual else time.time()

    def advance(self, seconds: float) -> float:
        """Move a manual clock forward by `seconds` (>= 0); returns the new time."""
        if not self._manual:
            raise ClockError("the simulator runs on the real clock; start it with --clock manual")
        if not seconds >= 0:
            raise ClockError("advance must be a number of seconds >= 0")
        self._now += float(seconds)
        return self._now

    def set(self, epoch_seconds: float) -> float:
        """Set a manual clock to `epoch_seconds` (not earlier than now); returns the new time."""
        if not self._manual:
            raise ClockError("the simulator runs on the real clock; start it with --clock manual")
        if not epoch_seconds >= self._now:
            raise ClockError("time cannot move backwards")
        self._now = float(epoch_seconds)
        return self._now
