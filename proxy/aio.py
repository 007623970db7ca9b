"""Background tasks that keep a reference and a name (raw `asyncio.create_task` is banned).

- `create_task(coro, name=...)`: a task kept alive until done; its exception, if any, is logged
  at ERROR, unless the task is `is_awaited`: its caller reads the result and reports a failure
  itself (the session store's bounded read), so the exception is retrieved and logged at DEBUG
  only (one failure, one line, at the caller's level).
- `TaskSet(limit)`: the background work one component owns (the session store's record saves,
  keep-warm pings ...): at most `limit` tasks at once (`spawn` refuses more and returns `None`,
  so the caller can count what it dropped), none cancelled when the request that started it
  ends, and `drain(timeout)` on shutdown waits for them, cancelling what is left after
  `timeout` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

_TASKS: set[asyncio.Task[Any]] = set()
_log = logging.getLogger("promptcache.aio")


def create_task(coro: Coroutine[Any, Any, Any], *, name: str, is_awaited: bool = False) -> asyncio.Task[Any]:
    """Start `coro` as a named task kept alive until done; its exception, if any, is logged
    (at DEBUG when `is_awaited`: the caller awaits the task and reports its failure)."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _TASKS.add(task)
    task.add_done_callback(_done_awaited if is_awaited else _done)
    return task


def _done(task: asyncio.Task[Any]) -> None:
    _TASKS.discard(task)
    if not task.cancelled() and task.exception() is not None:
        _log.error("background task %s failed: %r", task.get_name(), task.exception())


def _done_awaited(task: asyncio.Task[Any]) -> None:
    _TASKS.discard(task)
    if not task.cancelled() and task.exception() is not None:  # retrieved even when nobody awaits it now
        _log.debug("awaited task %s failed: %r", task.get_name(), task.exception())


class TaskSet:
    """A bounded set of named background tasks, drained on shutdown (module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any] | None:
        """Start `coro` unless `limit` tasks are running (then `coro` is closed unrun: `None`)."""
        if len(self._tasks) >= self.limit:
            coro.close()
            return None
        task = create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, timeout: float) -> int:
        """Wait up to `timeout` seconds for every task (also those they start meanwhile), then
        cancel the rest; returns how many were cancelled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._tasks:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.wait(set(self._tasks), timeout=remaining)
        left = set(self._tasks)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left)
        return len(left)
