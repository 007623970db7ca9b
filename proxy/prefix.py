"""Prefix digests: where two requests stop sharing a prefix, in blocks, bytes and tokens.

Pure functions over the adapter's `prefix_blocks` (the provider's render order).

- Block bytes: orjson bytes of the block value with marker keys (`cache_control`,
  `prompt_cache_breakpoint`) removed at the block and inside a nested `content` list: markers
  are not part of what a provider caches. Key order is kept (providers hash bytes, so a
  reordered key is a real change).
- Block digest `d_i = xxh3_128(section, role, message boundary, bytes)`; chain digest
  `c_i = xxh3_128(c_{i-1} || d_i)` (DESIGN.md section 2). Two requests share a prefix up to
  block `i` exactly when their chain digests at `i` are equal.
- Offsets are cumulative canonical byte lengths; tokens are estimated as bytes / 4, rounded up
  (`estimate_tokens`), a deliberately simple proxy-side estimate, independent of the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
import xxhash

from proxy.providers.base import Block

MARKER_KEYS: Final = frozenset({"cache_control", "prompt_cache_breakpoint"})
DIGEST_SIZE: Final = 16
BYTES_PER_TOKEN: Final = 4


def estimate_tokens(n_bytes: int) -> int:
    """Rough token estimate of `n_bytes` canonical bytes (ceil(bytes / 4))."""
    return -(-n_bytes // BYTES_PER_TOKEN)


def _strip_markers(value: Any) -> Any:
    if not isinstance(value, dict) or not (MARKER_KEYS & value.keys() or "content" in value):
        return value
    out = {k: v for k, v in value.items() if k not in MARKER_KEYS}
    content = out.get("content")
    if isinstance(content, list) and any(isinstance(p, dict) and MARKER_KEYS & p.keys() for p in content):
        out["content"] = [
            {k: v for k, v in p.items() if k not in MARKER_KEYS} if isinstance(p, dict) else p for p in content
        ]
    return out


def block_bytes(block: Block) -> bytes:
    """Canonical bytes of one block (markers removed, key order kept)."""
    value = block.value
    if isinstance(value, str):
        return orjson.dumps(value)
    if isinstance(value, orjson.Fragment):
        return orjson.dumps(value)
    return orjson.dumps(_strip_markers(value))


@dataclass(frozen=True, slots=True)
class PrefixChain:
    """Chain digests and byte offsets of one request's prefix blocks."""

    chain: bytes
    """Concatenated 16-byte chain digests, one per block."""
    ends: tuple[int, ...]
    """Cumulative canonical byte offset at the end of each block."""

    def __len__(self) -> int:
        return len(self.ends)

    def digest(self, i: int) -> bytes:
        return self.chain[i * DIGEST_SIZE : (i + 1) * DIGEST_SIZE]

    @property
    def total_bytes(self) -> int:
        return self.ends[-1] if self.ends else 0

    def bytes_before(self, i: int) -> int:
        """Canonical bytes in blocks `0 .. i-1`."""
        return self.ends[i - 1] if i > 0 else 0


def chain_blocks(blocks: Sequence[Block]) -> PrefixChain:
    """Digest `blocks` in order (see module docstring)."""
    out = bytearray()
    ends: list[int] = []
    previous = b""
    total = 0
    last_message: int | None = None
    for block in blocks:
        data = block_bytes(block)
        boundary = b"1" if block.message_index != last_message else b"0"
        last_message = block.message_index
        head = f"{block.section}\x00{block.role or ''}\x00".encode() + boundary
        d = xxhash.xxh3_128_digest(head + b"\x00" + data)
        previous = xxhash.xxh3_128_digest(previous + d)
        out += previous
        total += len(data)
        ends.append(total)
    return PrefixChain(bytes(out), tuple(ends))


def shared_blocks(old: PrefixChain, new: PrefixChain) -> int:
    """Number of leading blocks two chains share (binary search on chain digests)."""
    lo, hi = 0, min(len(old), len(new))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if old.digest(mid - 1) == new.digest(mid - 1):
            lo = mid
        else:
            hi = mid - 1
    return lo
