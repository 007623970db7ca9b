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
"""

from __future__ import annotations

import asyncio
import logging

from proxy.aio import create_task
from proxy.services import Services

_log = logging.getLogger("promptcache.app")


class TokenizerLoader:
    """Builds `services.tokens` (a bounded `proxy.sim.tokens.TokenCounter`) once, on demand."""

    def __init__(self, max_counts: int) -> None:
        """`max_counts`: the counter's memo bound (the memory budget's `tokens` share)."""
        self.max_counts = max_counts
        self._task: asyncio.Task[None] | None = None
        self.loads = 0
        """Builds started (0 or 1): tests read it."""

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
