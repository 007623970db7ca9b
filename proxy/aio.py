"""Background tasks that keep a reference and a name (raw `asyncio.create_task` is banned)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

_TASKS: set[asyncio.Task[Any]] = set()
_log = logging.getLogger("promptcache.aio")


def create_task(coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
    """Start `coro` as a named task kept alive until done; its exception, if any, is logged."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _TASKS.add(task)
    task.add_done_callback(_done)
    return task


def _done(task: asyncio.Task[Any]) -> None:
    _TASKS.discard(task)
    if not task.cancelled() and task.exception() is not None:
        _log.error("background task %s failed: %r", task.get_name(), task.exception())
