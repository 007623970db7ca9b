"""One memory budget for the proxy's in-memory caches (the setting `memory_budget_mb`).

The caches that grow with the number of sessions a process sees are each bounded in bytes by a
fixed share of the budget (`SHARES`), so RSS levels off once they are full whatever the traffic:

- `records`: the decoded session records `proxy.store.RecordStore` keeps, each counted as what
  it holds (`proxy.store._held`: its encoded size plus the decoded sidecars' and offsets'
  object overhead and the record's own; about 1.4x the encoded size for a long conversation,
  about 3x for a 1 KB one), so six or seven 600 KB conversations at the default budget, or
  about 1,400 of 1 KB. Beside it, and not in the budget, the store's
  index of the part names each session's stored value holds (`STORED_PARTS_BYTES`, 1 MiB),
  which keeps a session's write incremental after the memo dropped it;
- `index`: the session inference index (`proxy.session_identity.SessionIndex`), at
  `BOUNDARY_BYTES` per boundary held and `INDEX_SESSION_BYTES` per session;
- `history`: the forensic map's recent sessions (`proxy.history.SessionHistory`, its own
  per-entry estimate), besides its `history_sessions` count;
- `masker`: the replay masker's two digest memos (`proxy.pipeline.replay.Masker`), at
  `MASKER_ENTRY_BYTES` per entry of each;
- `tokens`: the `o200k_base` count memo of the OpenAI predictions (`proxy.sim.tokens.TokenCounter`,
  built by `proxy.tokenizer`), at `TOKEN_COUNT_ENTRY_BYTES` per text counted.

Per-entry sizes are measured with `tracemalloc` on CPython 3.11 (64-bit), rounded up. What the
budget does not cover: the interpreter and its imports (about 53 MB), the `o200k_base`
tokenizer (about 49 MB, `proxy.tokenizer`: built on the first OpenAI request only), the
bounded text caches of `proxy.pipeline.segments` (their own character limits), the parsed
elements of the newest request bodies kept for the incremental parse
(`MemoryBudget.parsed_bytes`: a quarter of the budget in raw bodies, 4 MiB at the default, about
8 MB of objects, shared with the requests that reuse them, and besides them the newest two bodies
the cache turned away, within half as many bytes again) and the requests in flight. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MIB: Final = 1024 * 1024
DEFAULT_BUDGET_MB: Final = 16
SHARES: Final = {"records": 0.35, "index": 0.25, "history": 0.20, "masker": 0.10, "tokens": 0.10}
BOUNDARY_BYTES: Final = 224
"""Measured 205 B per boundary held by `SessionIndex` (the 16-byte digest, its owner-dict slot,
its deque slot)."""
INDEX_SESSION_BYTES: Final = 512
"""Per session of the index (its `_Entry`, deque and LRU slot)."""
MASKER_ENTRY_BYTES: Final = 192
"""Measured 170 B per entry of one masker memo (two 16-byte digests and the LRU slot)."""
PARSED_DIVISOR: Final = 4
"""The budget over the raw body bytes kept parsed (`MemoryBudget.parsed_bytes`)."""
TOKEN_COUNT_ENTRY_BYTES: Final = 192
"""Measured 185 B per entry of the token count memo (a 128-bit int key, its count, the LRU slot)."""


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Bytes per cache out of `total` bytes (`SHARES`)."""

    total: int = DEFAULT_BUDGET_MB * MIB

    @classmethod
    def of_mb(cls, mb: int) -> MemoryBudget:
        return cls(mb * MIB)

    def share(self, cache: str) -> int:
        """Bytes for `cache` (a key of `SHARES`)."""
        return int(self.total * SHARES[cache])

    @property
    def records(self) -> int:
        return self.share("records")

    @property
    def index(self) -> int:
        return self.share("index")

    @property
    def history(self) -> int:
        return self.share("history")

    @property
    def masker_entries(self) -> int:
        """Entries of each of the masker's two memos."""
        return max(1, self.share("masker") // (2 * MASKER_ENTRY_BYTES))

    @property
    def parsed_bytes(self) -> int:
        """Raw bytes of the newest request bodies whose parsed elements, layout and prompt scan
        stay in memory for the incremental parse (`proxy.pipeline.rawprefix.RawPrefixIndex`):
        a quarter of the budget in raw bytes (4 MiB at the default 16 MB, about six 600 KB
        conversations), about twice that in objects, outside the budget's shares. A process
        serving more concurrent long sessions than that keeps the ones that fit
        (`proxy.cache_admission`) and, besides, the newest two bodies it turned away (within
        half of this: `rawprefix.MAX_RECENT`), which the others' turns are read around when
        they re-send the same messages; else it re-parses and re-lays-out their turns in full:
        `memory_budget_mb: 128` keeps 32 MiB (measured, two runs each: 32 sessions of 600 KB,
        0.16-0.17 -> 0.21-0.30 of bare aiohttp's requests/s, peak RSS 166-168 -> 237-258 MB with
        the other shares grown too, `bench/gateway_bench.py --peers bare,optimise --cells grow32`)."""
        return self.total // PARSED_DIVISOR

    @property
    def token_counts(self) -> int:
        """Entries of the token count memo."""
        return max(1, self.share("tokens") // TOKEN_COUNT_ENTRY_BYTES)
