"""How many new 600 KB sessions a second the SQLite writer stores, before and at the tenant cap,
with `secure_delete` FAST (the store's, `proxy.store.sqlite.SECURE_DELETE`) against ON (Debian's
SQLite default), alternating in one run.

Each session is a head and 38 parts of 16 KiB (`proxy.store.codec.PART_BYTES`; about what a
600 KB conversation's first record is), written through `SqliteStore.put_parts` `--batch` at
a time, back to back, into a fresh file per run: the first ones fill the tenant cap (256 MiB,
the default; about 400 sessions), then `--sessions` more each evict the oldest record. Prints
sessions/s for both phases and the ratio FAST / ON per round, and the process's CPU per session
(the writer thread's, mostly). The writer thread alone, no event loop work beside it: the
gateway bench's first1 cell shows what that does to records dropped. `--shared`: every part but
each session's first is the same bytes in all of them (as the gateway bench's first1 cell: new
sessions re-sending one conversation, which differ in their first message), which the file keeps
once per tenant (`proxy.store.sqlite`, schema 4). Not a test.

    .venv/bin/python bench/store_writer_bench.py [--sessions 400] [--batch 8] [--rounds 2] [--shared]
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


def parts_of(session: int, is_shared: bool = False) -> list[Part]:
    """The session's 38 distinct parts of 16 KiB (incompressible enough: SQLite does not compress);
    `is_shared`: all but the first are the same in every session."""
    out = []
    for n in range(PARTS):
        data = f"{'all' if is_shared and n else session}-{n}-".encode() * (PART_SIZE // 8)
        data = data[:PART_SIZE]
        out.append(Part(xxhash.xxh3_128_digest(data), len(data), data))
    return out


async def run(mode: str, sessions: int, batch: int, is_shared: bool = False) -> tuple[float, float, int, float, float]:
    """Sessions/s before and after the cap is reached, the rows evicted, and the CPU seconds per
    session before and after, with `mode`."""
    sqlite_store.SECURE_DELETE = mode  # read when the writer opens its connection
    tmp = Path(tempfile.mkdtemp(prefix="pc-writer-"))
    store = sqlite_store.SqliteStore(tmp / "s.db", max_bytes=4 * TENANT_CAP, max_tenant_bytes=TENANT_CAP)
    evicted = [0]
    store.on_evict = lambda cap, rows: evicted.__setitem__(0, evicted[0] + rows)
    half = TENANT_CAP // (30_000 + PARTS * PART_SIZE)
    rates = []
    cpu = []
    try:
        for first, last in ((0, half), (half, half + sessions)):
            started, started_cpu = time.perf_counter(), time.process_time()
            for at in range(first, last, batch):
                writes = [
                    store.put_parts("t", f"s{i}", b"h" * 30_000, parts_of(i, is_shared), 3600.0)
                    for i in range(at, min(last, at + batch))
                ]
                assert all(await asyncio.gather(*writes))
            rates.append((last - first) / (time.perf_counter() - started))
            cpu.append((time.process_time() - started_cpu) / (last - first))
    finally:
        await store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return rates[0], rates[1], evicted[0], cpu[0], cpu[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shared", action="store_true", help="all parts but each session's first the same bytes")
    args = parser.parse_args()
    default = sqlite_store.SECURE_DELETE
    with open("/proc/loadavg") as f:
        print(f"load average before: {' '.join(f.read().split()[:3])}")
    for r in range(args.rounds):
        got = {mode: asyncio.run(run(mode, args.sessions, args.batch, args.shared)) for mode in ("ON", default)}
        on, fast = got["ON"], got[default]
        for mode, (below, at_cap, evicted, cpu_below, cpu_at) in got.items():
            print(
                f"round {r} secure_delete={mode}: {below:.0f} sessions/s below the cap, "
                f"{at_cap:.0f} at it ({evicted} evicted); CPU per session {1000 * cpu_below:.2f} ms below, "
                f"{1000 * cpu_at:.2f} ms at it"
            )
        print(f"round {r} {default} / ON: below the cap {fast[0] / on[0]:.2f}x, at it {fast[1] / on[1]:.2f}x")
    with open("/proc/loadavg") as f:
        print(f"load average after: {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
