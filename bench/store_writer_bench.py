"""How many new 600 KB sessions a second the SQLite writer stores, before and at the tenant cap,
with `secure_delete` FAST (the store's, `proxy.store.sqlite.SECURE_DELETE`) against ON (Debian's
SQLite default), alternating in one run.

Each session is a head and 38 parts of 16 KiB (`proxy.store.codec.PART_BYTES`; about what a
600 KB conversation's first record is), written through `SqliteStore.put_parts` `--batch` at
a time, back to back, into a fresh file per run: the first ones fill the tenant cap (256 MiB,
the default; about 400 sessions), then `--sessions` more each evict the oldest record. Prints
sessions/s for both phases and the ratio FAST / ON per round. The writer thread alone, no event loop work beside it: the
gateway bench's first1 cell shows what that does to records dropped. Not a test.

    .venv/bin/python bench/store_writer_bench.py [--sessions 400] [--batch 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from proxy.store import sqlite as sqlite_store  # noqa: E402
from proxy.store.base import Part  # noqa: E402

TENANT_CAP = 256 * 1024 * 1024
PARTS = 38
PART_SIZE = 16 * 1024


def parts_of(session: int) -> list[Part]:
    """The session's 38 distinct parts of 16 KiB (incompressible enough: SQLite does not compress)."""
    out = []
    for n in range(PARTS):
        data = f"{session}-{n}-".encode() * (PART_SIZE // 8)
        data = data[:PART_SIZE]
        out.append(Part(xxhash.xxh3_128_digest(data), len(data), data))
    return out


async def run(mode: str, sessions: int, batch: int) -> tuple[float, float, int]:
    """Sessions/s before and after the cap is reached, and the rows evicted, with `mode`."""
    sqlite_store.SECURE_DELETE = mode  # read when the writer opens its connection
    tmp = Path(tempfile.mkdtemp(prefix="pc-writer-"))
    store = sqlite_store.SqliteStore(tmp / "s.db", max_bytes=4 * TENANT_CAP, max_tenant_bytes=TENANT_CAP)
    evicted = [0]
    store.on_evict = lambda cap, rows: evicted.__setitem__(0, evicted[0] + rows)
    half = TENANT_CAP // (30_000 + PARTS * PART_SIZE)
    rates = []
    try:
        for first, last in ((0, half), (half, half + sessions)):
            started = time.perf_counter()
            for at in range(first, last, batch):
                writes = [
                    store.put_parts("t", f"s{i}", b"h" * 30_000, parts_of(i), 3600.0)
                    for i in range(at, min(last, at + batch))
                ]
                assert all(await asyncio.gather(*writes))
            rates.append((last - first) / (time.perf_counter() - started))
    finally:
        await store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return rates[0], rates[1], evicted[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    default = sqlite_store.SECURE_DELETE
    with open("/proc/loadavg") as f:
        print(f"load average before: {' '.join(f.read().split()[:3])}")
    for r in range(args.rounds):
        got = {mode: asyncio.run(run(mode, args.sessions, args.batch)) for mode in ("ON", default)}
        on, fast = got["ON"], got[default]
        for mode, (below, at_cap, evicted) in got.items():
            print(
                f"round {r} secure_delete={mode}: {below:.0f} sessions/s below the cap, "
                f"{at_cap:.0f} at it ({evicted} evicted)"
            )
        print(f"round {r} {default} / ON: below the cap {fast[0] / on[0]:.2f}x, at it {fast[1] / on[1]:.2f}x")
    with open("/proc/loadavg") as f:
        print(f"load average after: {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
