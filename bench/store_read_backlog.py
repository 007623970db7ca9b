"""Session record reads after a restart under a busy event loop (session 7 attack finding F3).

`python bench/store_read_backlog.py [--records 140] [--kb 600] [--rounds 3] [--src DIR]`: a
first process writes `--records` conversation records of about `--kb` KB each (in parts, as
`serve` writes them) to a temporary SQLite file and stops; then, `--rounds` times, a fresh
process's `RecordStore` (nothing remembered: a restart) loads all of them at once while the
event loop is kept busy in Python (a task parsing a 600 KB body with `orjson` and walking it,
~1 ms, between yields, as requests do). Prints per round the reads that failed (timeouts of
the 50 ms `GET_TIMEOUT`, which a request goes on without: no replay), the records read back
whole, and the wall time of the burst, with the load average. `--src` runs another checkout's
`proxy` package (the code before a change) in the same way, for a side-by-side figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--records", type=int, default=140)
parser.add_argument("--kb", type=int, default=600)
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--src", help="the checkout whose `proxy` package to run (default: this one)")
ARGS = parser.parse_args()
sys.path.insert(0, str(Path(ARGS.src).resolve() if ARGS.src else Path(__file__).resolve().parents[1]))

import logging  # noqa: E402

import orjson  # noqa: E402
import uvloop  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from proxy.metrics import Metrics  # noqa: E402
from proxy.store import RecordStore  # noqa: E402
from proxy.store.codec import SessionRecord, Sidecar  # noqa: E402
from proxy.store.sqlite import SqliteStore  # noqa: E402


def record(i: int, kb: int) -> SessionRecord:
    """A conversation of 2 KB messages, about `kb` KB encoded."""
    sidecars = tuple(
        Sidecar(n, os.urandom(16), b'{"role":"user","content":"' + f"{i:04d}:{n:04d} ".encode() * 190 + b'"}')
        for n in range(kb // 2)
    )
    return SessionRecord(
        chain=os.urandom(16 * len(sidecars)),
        ends=tuple(range(1, len(sidecars) + 1)),
        model="m",
        params_digest=os.urandom(16),
        sidecars=sidecars,
    )


def counted(metrics: Metrics, name: str, **labels: str) -> int:
    return int(metrics.registry.get_sample_value(name, labels) or 0)


async def busy(stop: asyncio.Event) -> None:
    """The event loop's own work: parse and walk a 600 KB body, yield, again."""
    body = orjson.dumps({"messages": [{"role": "user", "content": "x" * 2000} for _ in range(300)]})
    while not stop.is_set():
        parsed = orjson.loads(body)
        sum(len(m["content"]) for m in parsed["messages"])
        await asyncio.sleep(0)


async def round_(path: Path, records: dict[str, SessionRecord]) -> tuple[int, int, int, float]:
    metrics = Metrics(CollectorRegistry())
    store = RecordStore(SqliteStore(path), metrics)
    stop = asyncio.Event()
    workers = [asyncio.ensure_future(busy(stop)) for _ in range(2)]  # noqa: TID251
    try:
        await store.check()
        started = time.perf_counter()
        loaded = await asyncio.gather(*(store.load("t", key) for key in records))
        wall = time.perf_counter() - started
    finally:
        stop.set()
        await asyncio.gather(*workers)
        await store.close()
    errors = counted(metrics, "promptcache_session_store_errors_total", backend="sqlite", operation="get")
    timeouts = counted(metrics, "promptcache_session_store_faults_total", backend="sqlite", kind="timeout")
    whole = sum(got == want for got, want in zip(loaded, records.values(), strict=True))
    return errors, timeouts, whole, wall


async def main() -> None:
    with tempfile.TemporaryDirectory() as workdir:
        path = Path(workdir) / "sessions.db"
        records = {f"s{i}": record(i, ARGS.kb) for i in range(ARGS.records)}
        writer = RecordStore(SqliteStore(path), Metrics(CollectorRegistry()))
        for key, value in records.items():
            assert await writer.save("t", key, value)
        await writer.close()
        print(f"src={ARGS.src or 'this checkout'} records={ARGS.records} x ~{ARGS.kb} KB")
        for n in range(ARGS.rounds):
            errors, timeouts, whole, wall = await round_(path, records)
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            print(
                f"round {n + 1}: get errors {errors} (timeouts {timeouts}) of {len(records)} reads,"
                f" read whole {whole}, burst {wall * 1000:.0f} ms, load average {load}"
            )


if __name__ == "__main__":
    logging.disable(logging.WARNING)  # the failed reads are counted, not logged one by one
    uvloop.run(main())
