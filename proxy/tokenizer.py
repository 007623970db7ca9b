"""The `o200k_base` counter of the OpenAI read predictions, loaded on first need.

Measurement predicts an OpenAI automatic-cache read in real `o200k_base` tokens
(`ProviderAdapter.counts_tokens`); the encoding's Rust core takes about 49 MB of resident
memory and 0.2 s to build, which a process serving only Anthropic traffic never needs. So
`TokenizerLoader.ensure` is awaited by the handler before the first request whose adapter counts
tokens goes upstream: the first such request waits for the build (in a thread, once per
process; concurrent callers share it, and a caller that is cancelled does not cancel it), every
later one finds `Services.tokens` set. Predictions are the same as with a counter loaded at
start. When the rank file is missing or does not match its hash, the load fails once, is
logged, and measurement keeps its bytes/4 estimate (never retried).

Big texts are counted off the loop (`count_ahead`, awaited by the handler before the request
goes upstream): measurement runs on the event loop after the last byte, and `o200k_base` takes
about 0.15 s per MiB of text (a 2 MiB message held every tenant ~0.3 s). For a body of
`AHEAD_BODY_BYTES` or more with a previous request (measurement predicts a read only then) that
has grown by `AHEAD_TOTAL_CHARS` bytes or more since it (its canonical bytes: an appended turn of
an agent's session is not looked at; a history rewritten at the same size is left to the loop), the
texts the prediction will count that the counter does not hold, of `AHEAD_TEXT_CHARS` or more
each, are encoded on a worker thread (one at a time: tiktoken releases the GIL, and two such
threads would take both cores from the loop) when they add up to `AHEAD_TOTAL_CHARS`; their
counts are put in the counter, so the measurement finds them. Smaller work stays on the loop.
A count is a task of its own: when its client hangs up, a thread already started runs on (it
cannot be stopped) holding the one place, and its counts are kept for a retry; one still waiting
for the place is dropped. Fails open: an error leaves the counting to the measurement, as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from proxy.aio import create_task
from proxy.services import Services

if TYPE_CHECKING:
    import tiktoken

    from proxy.exchange import Exchange
    from proxy.sim.tokens import TokenCounter

AHEAD_BODY_BYTES: Final = 64 * 1024
"""Bodies below this (bytes as they go upstream) are not looked at by `count_ahead`."""
AHEAD_TEXT_CHARS: Final = 1024
"""Texts below this (characters) are counted by the measurement on the loop (memoised)."""
AHEAD_TOTAL_CHARS: Final = 64 * 1024
"""Characters to count (about 10 ms of `o200k_base`) from which the count goes to a thread."""

_log = logging.getLogger("promptcache.app")


class TokenizerLoader:
    """Builds `services.tokens` (a bounded `proxy.sim.tokens.TokenCounter`) once, on demand."""

    def __init__(self, max_counts: int) -> None:
        """`max_counts`: the counter's memo bound (the memory budget's `tokens` share)."""
        self.max_counts = max_counts
        self._task: asyncio.Task[None] | None = None
        self.loads = 0
        """Builds started (0 or 1): tests read it."""
        self._ahead_lock = asyncio.Lock()
        self.counted_ahead = 0
        """Requests whose texts `count_ahead` counted on a worker thread."""
        self.waiting_ahead = 0
        """Counts waiting now for the one place (a thread counting for another request)."""

    async def count_ahead(self, exchange: Exchange, services: Services) -> None:
        """Count the big texts the measurement of `exchange` (its body as sent) will count, on a
        worker thread (module docstring); never raises (an error is logged at debug level)."""
        counter, previous, size = services.tokens, exchange.previous, len(exchange.outgoing)
        if counter is None or previous is None or size < AHEAD_BODY_BYTES:
            return
        if exchange.over_budget is not None or size - _last_end(previous.ends) < AHEAD_TOTAL_CHARS:
            return  # grown by less than that since the previous request: its new texts are few
        try:
            missing = _missing_texts(exchange, counter)
            if sum(map(len, missing)) < AHEAD_TOTAL_CHARS:
                return
        except Exception as exc:  # fail open: the measurement counts them
            _log.debug("count ahead failed (%s): the measurement counts on the loop", type(exc).__name__)
            return
        # The count is a task of its own holding the lock until its thread is done: a client
        # that hangs up (its handler cancelled) neither frees the lock for a second thread while
        # the first still runs, nor loses the counts (its retry finds them); a count still
        # waiting for the lock when its client leaves never starts.
        job = _Count(missing)
        task = create_task(self._count(counter, job), name="promptcache-count-ahead")
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not job.started:
                task.cancel()
            raise

    async def _count(self, counter: TokenCounter, job: _Count) -> None:
        """Count `job`'s texts on a worker thread, one count at a time, and remember them; never
        raises (an error is logged at debug level: the measurement counts them)."""
        try:
            self.waiting_ahead += 1
            try:
                await self._ahead_lock.acquire()
            finally:
                self.waiting_ahead -= 1
            try:
                missing = [text for text in job.texts if not counter.holds(text)]  # counted meanwhile
                if sum(map(len, missing)) < AHEAD_TOTAL_CHARS:
                    return
                job.started = True
                counts = await asyncio.to_thread(_encode_lengths, counter.encoding, missing)
            finally:
                self._ahead_lock.release()
        except Exception as exc:  # fail open
            _log.debug("count ahead failed (%s): the measurement counts on the loop", type(exc).__name__)
            return
        for text, n in zip(missing, counts, strict=True):
            counter.remember(text, n)
        self.counted_ahead += 1

    async def ensure(self, services: Services) -> None:
        """Return once `services.tokens` is set or its build has failed; never raises."""
        if services.tokens is not None:
            return
        if self._task is None:
            self.loads += 1
            self._task = create_task(self._load(services), name="promptcache-tokenizer")
        await asyncio.shield(self._task)

    async def _load(self, services: Services) -> None:
        from proxy.sim.tokens import TokenCounter, load_o200k

        try:
            encoding = await asyncio.to_thread(load_o200k)
        except RuntimeError as exc:
            _log.warning("o200k_base tokenizer unavailable (%s): predictions estimate bytes/4", exc)
            return
        services.tokens = TokenCounter(encoding, max_counts=self.max_counts)


class _Count:
    """One `count_ahead` count: its texts, and whether its thread started."""

    __slots__ = ("texts", "started")

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.started = False


def _last_end(ends: tuple[int, ...]) -> int:
    return ends[-1] if ends else 0


def _missing_texts(exchange: Exchange, counter: TokenCounter) -> list[str]:
    """The texts of `AHEAD_TEXT_CHARS` or more that the prediction of `exchange`'s measurement
    counts and `counter` does not hold, each once, in the order the prediction meets them."""
    from proxy.measure import sent_body, sent_prompt

    body = sent_body(exchange)
    if body is None:
        return []
    seen: dict[str, None] = {}

    def probe(text: str) -> int:
        if len(text) >= AHEAD_TEXT_CHARS and text not in seen and not counter.holds(text):
            seen[text] = None
        return 0

    n_blocks = len(sent_prompt(exchange, body).blocks)
    exchange.adapter.predict_read_tokens(body, probe, n_blocks, 0, 0, (), 0)
    return list(seen)


def _encode_lengths(encoding: tiktoken.Encoding, texts: list[str]) -> list[int]:
    """`o200k_base` counts of `texts` (worker thread: touches nothing but its arguments)."""
    from proxy.sim.tokens import encode_bounded

    return [len(encode_bounded(encoding, text)) for text in texts]
