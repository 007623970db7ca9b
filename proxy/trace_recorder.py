"""Trace recording: append every pipeline request a client sends to a JSONL workload trace.

Format (the workload format `promptcache replay` reads): one JSON object per line,
`{"gap": seconds since the previous recorded request, "path": "/v1/messages", "headers":
{session and prompt-affecting headers only}, "body": {the client's request body}}`. Credentials
never enter a trace: only the headers named in `settings.session_headers` and those that change
what a provider caches (`anthropic-beta`, `anthropic-version`) are kept. Lines are written in arrival
order by one dedicated thread, so the event loop never blocks on the file.

The recorder never fails a request: a body it cannot encode (nested deeper than orjson's 254
levels, ...) or a line it cannot write (disk full, file gone read-only) is skipped and counted
in `promptcache_record_errors_total`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import orjson
from multidict import CIMultiDictProxy
from prometheus_client import Counter

from proxy.providers import CREDENTIAL_SHAPE, REDACTED

_log = logging.getLogger("promptcache.record")

PROMPT_HEADERS: Final = ("anthropic-beta", "anthropic-version")
"""Headers that are part of what the provider caches (docs/provider-rules.md 1.8, 1.13)."""


def _unkeyed(value: str) -> str:
    """A recorded header's value, `[redacted]` when it holds a provider key shape (a client that
    puts its key in a session header, e.g. `x-session-id`)."""
    return REDACTED if CREDENTIAL_SHAPE.search(value) is not None else value


class TraceRecorder:
    """Appends requests to `path`; `record()` returns at once, the write happens on a thread."""

    def __init__(self, path: Path, session_headers: tuple[str, ...], errors: Counter | None = None) -> None:
        """`errors`: counts what could not be recorded (`promptcache_record_errors_total`)."""
        self.path = path
        self._errors = errors
        self._headers = tuple(h.lower() for h in session_headers) + PROMPT_HEADERS
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="promptcache-record")
        self._last: float | None = None
        self._pending: set[asyncio.Future[None]] = set()
        path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, path: str, headers: CIMultiDictProxy[str], raw: bytes) -> None:
        """Queue one request for the trace; never raises. A body that is not JSON is skipped
        (not counted: nothing to replay); one that cannot be encoded is skipped and counted."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        try:
            kept = {name: _unkeyed(headers[name]) for name in self._headers if name in headers}
            now = time.time()
            gap = 0.0 if self._last is None else round(now - self._last, 3)
            line = orjson.dumps({"gap": gap, "path": path, "headers": kept, "body": body}) + b"\n"
            self._last = now
            future = asyncio.get_running_loop().run_in_executor(self._executor, self._append, line)
        except Exception as exc:  # noqa: BLE001 - the recorder never fails a request
            self._failed(exc)
            return
        self._pending.add(future)
        future.add_done_callback(self._written)

    def _written(self, future: asyncio.Future[None]) -> None:
        self._pending.discard(future)
        if not future.cancelled() and future.exception() is not None:
            self._failed(future.exception())

    def _failed(self, exc: BaseException | None) -> None:
        if self._errors is not None:
            self._errors.inc()
        _log.warning("trace line not recorded (%s)", type(exc).__name__)

    def _append(self, line: bytes) -> None:
        # 0600: a trace holds whole prompts.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as handle:
            handle.write(line)

    async def close(self) -> None:
        """Wait for queued lines, then stop the writer thread."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        self._executor.shutdown(wait=True)
