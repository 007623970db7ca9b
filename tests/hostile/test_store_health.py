"""Store health (issue 11, item 7): the SQLite file deleted mid-run, a full disk and a read-only
mount are seen (`promptcache_session_store_faults_total{kind}`, `..._healthy`, `/readyz` 503
naming the cause) and recovered from, and requests keep flowing meanwhile (200, no replay).
Redis frozen with SIGSTOP reads as `unresponsive` the same way.

A full disk and a read-only mount are real: a small tmpfs mounted for the test (root in a
container that allows `mount`; skipped, saying so, where it does not). The deleted file needs
no privilege."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.appkeys import SERVICES
from proxy.session_identity import explicit_id
from tests.fakes.upstream import FakeUpstream
from tests.store.redis_server import RedisServer

HEADERS = {"x-api-key": "key-h", "anthropic-version": "2023-06-01"}
FAULTS = "promptcache_session_store_faults_total"
HEALTHY = "promptcache_session_store_healthy"


def body(n: int, size: int = 100) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": f"turn {n} " + "x" * size}],
    }


async def post(http: aiohttp.ClientSession, proxy: Any, n: int, session: str, size: int = 100) -> int:
    headers = {**HEADERS, "x-session-id": session}
    async with http.post(proxy.url + "/v1/messages", json=body(n, size), headers=headers) as r:
        await r.read()
        return r.status


async def readyz(http: aiohttp.ClientSession, proxy: Any) -> tuple[int, dict[str, Any]]:
    async with http.get(proxy.url + "/readyz") as r:
        return r.status, await r.json()


def store_of(proxy: Any) -> Any:
    return proxy.runner.app[SERVICES].store


def rows(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM sessions").fetchone()[0]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 4 MiB tmpfs (a real filesystem that fills up and can be remounted read-only)."""
    mount = tmp_path / "volume"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): disk full / read-only untested")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem is full; returns it (delete it to free the space)."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


async def test_a_deleted_file_is_recreated_counted_and_written_again(
    fake_upstream: FakeUpstream, make_proxy: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    proxy = await make_proxy(upstream=fake_upstream.url, store="", state_dir=state)
    db = state / "sessions.db"
    async with aiohttp.ClientSession() as http:
        assert await post(http, proxy, 1, "s-1") == 200
        await store_of(proxy).flush()
        assert rows(db) == 2  # the record and the tenant's pacing
        db.unlink()  # e.g. `rm sessions.db` while it runs: writes would go to the unlinked file
        status, ready = await readyz(http, proxy)
        assert (status, ready["status"], ready["store"]) == (200, "ready", {"backend": "sqlite", "healthy": True})
        assert proxy.sample(FAULTS, backend="sqlite", kind="file_gone") == 1
        assert db.exists() and stat.S_IMODE(db.stat().st_mode) == 0o600
        assert rows(db) == 0  # what was deleted stays deleted
        assert await post(http, proxy, 2, "s-2") == 200
        await store_of(proxy).flush()
    assert rows(db) == 1  # the new record is in the file at the path
    assert proxy.sample(FAULTS, backend="sqlite", kind="file_gone") == 1
    assert proxy.sample(HEALTHY, backend="sqlite") == 1


async def test_a_deleted_wal_is_noticed_like_a_deleted_file(
    fake_upstream: FakeUpstream, make_proxy: Any, tmp_path: Path
) -> None:
    """Adversarial review (session 4): `rm sessions.db-wal sessions.db-shm` went unnoticed; the
    rows that lived only in the WAL (all of them, before the first checkpoint) were written on
    into unlinked files, invisible to any other reader and lost at a crash."""
    state = tmp_path / "state"
    proxy = await make_proxy(upstream=fake_upstream.url, store="", state_dir=state)
    db = state / "sessions.db"
    async with aiohttp.ClientSession() as http:
        assert await post(http, proxy, 1, "s-1") == 200
        await store_of(proxy).flush()
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink()
        assert await post(http, proxy, 2, "s-2") == 200
        await store_of(proxy).flush()
        assert proxy.sample(FAULTS, backend="sqlite", kind="file_gone") == 1
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            query = "SELECT count(*) FROM sessions WHERE session = ?"
            (found,) = conn.execute(query, (explicit_id("s-2"),)).fetchone()
        assert found == 1  # the new record is readable from outside, at the path
    assert proxy.sample(HEALTHY, backend="sqlite") == 1


async def test_a_full_disk_is_unready_naming_it_requests_flow_and_it_recovers(
    fake_upstream: FakeUpstream, make_proxy: Any, tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Also: the full disk is logged once as unhealthy, once as healthy again, and its first
    failed write once at WARNING; the second failed write (s-3) is counted but not logged again
    (attack pass, session 13: a WARNING per failed write)."""
    caplog.set_level(logging.DEBUG, logger="promptcache.store")
    state = tmpfs / "state"
    proxy = await make_proxy(upstream=fake_upstream.url, store="", state_dir=state)
    store = store_of(proxy)
    async with aiohttp.ClientSession() as http:
        assert await post(http, proxy, 1, "s-1") == 200
        await store.flush()
        filler = fill(tmpfs)
        assert await post(http, proxy, 2, "s-2", size=300_000) == 200  # fail open
        await store.flush()
        assert proxy.sample("promptcache_session_store_errors_total", backend="sqlite", operation="put") == 1
        assert proxy.sample(FAULTS, backend="sqlite", kind="disk_full") == 1
        assert proxy.sample(HEALTHY, backend="sqlite") == 0
        status, ready = await readyz(http, proxy)
        assert status == 503
        assert ready["status"] == "store_unhealthy"
        assert {k: v for k, v in ready["store"].items() if k != "detail"} == {
            "backend": "sqlite",
            "healthy": False,
            "problem": "disk_full",
        }
        assert "bytes free on the filesystem of" in ready["store"]["detail"]
        assert proxy.sample(FAULTS, backend="sqlite", kind="disk_full") == 2  # the check saw it too
        assert await post(http, proxy, 3, "s-3") == 200  # requests keep flowing
        await store.flush()
        filler.unlink()
        status, ready = await readyz(http, proxy)
        assert (status, ready["status"], ready["store"]) == (200, "ready", {"backend": "sqlite", "healthy": True})
        assert proxy.sample(HEALTHY, backend="sqlite") == 1
        assert await post(http, proxy, 4, "s-4", size=300_000) == 200
        await store.flush()
    # s-1, its pacing and s-4; s-3's write met the full disk (a WAL frame could not be appended)
    assert rows(state / "sessions.db") == 3
    assert proxy.sample("promptcache_session_store_errors_total", backend="sqlite", operation="put") == 2
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    store_lines = [(level, text.split(" (")[0]) for level, text in messages if "session store" in text]
    assert store_lines == [
        ("WARNING", "session store sqlite unhealthy: disk_full"),
        ("WARNING", "session store sqlite put failed"),
        ("DEBUG", "session store sqlite put failed"),
        ("WARNING", "session store sqlite healthy again"),
    ]


async def test_a_session_replays_through_a_full_disk_from_the_record_its_store_refused(
    fake_upstream: FakeUpstream, make_proxy: Any, tmpfs: Path
) -> None:
    """The one process writing the file keeps the record a full disk refused: it is still the
    session's newest, so the next turn replays it (its first message's bytes as first sent)
    rather than going without, and the write after the disk is freed stores the turn."""
    state = tmpfs / "state"
    proxy = await make_proxy(upstream=fake_upstream.url, store="", state_dir=state)
    store = store_of(proxy)
    first = {"role": "user", "content": [{"type": "text", "text": "Summarise the design, please."}]}
    reordered = {"content": [{"text": "Summarise the design, please.", "type": "text"}], "role": "user"}
    reply = {"role": "assistant", "content": [{"type": "text", "text": "Hello there"}]}
    headers = {**HEADERS, "x-session-id": "s-full"}
    url = proxy.url + "/v1/messages"
    async with aiohttp.ClientSession() as http:
        filler = fill(tmpfs)
        async with http.post(url, json={**body(0), "messages": [first]}, headers=headers) as r:
            assert r.status == 200
        await store.flush()
        # the record's write and the tenant's pacing's met the full disk
        assert proxy.sample("promptcache_session_store_errors_total", backend="sqlite", operation="put") == 2
        turn = {**body(0), "messages": [reordered, reply, {"role": "user", "content": "And the risks?"}]}
        async with http.post(url, json=turn, headers=headers) as r:
            assert r.status == 200
        await store.flush()
        sent = orjson.loads(fake_upstream.received[-1].body)["messages"]
        assert orjson.dumps(sent[0]) == orjson.dumps(first)  # the refused record's bytes, replayed
        assert proxy.sample("promptcache_replayed_messages_total", provider="anthropic") == 1
        filler.unlink()
        async with http.post(url, json={**turn, "messages": [*turn["messages"], reply]}, headers=headers) as r:
            assert r.status == 200
        await store.flush()
    with sqlite3.connect(f"file:{state / 'sessions.db'}?mode=ro", uri=True) as conn:
        query = "SELECT count(*) FROM sessions WHERE session = ?"
        assert conn.execute(query, (explicit_id("s-full"),)).fetchone() == (1,)


async def test_a_read_only_mount_is_unready_naming_it_and_recovers_when_writable(
    fake_upstream: FakeUpstream, make_proxy: Any, tmpfs: Path
) -> None:
    state = tmpfs / "state"
    state.mkdir(mode=0o700)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    proxy = await make_proxy(upstream=fake_upstream.url, store="", state_dir=state)
    async with aiohttp.ClientSession() as http:
        status, ready = await readyz(http, proxy)
        assert status == 503
        assert ready["status"] == "store_unhealthy"
        assert ready["store"]["problem"] == "read_only"
        assert "Read-only file system" in ready["store"]["detail"]
        assert proxy.sample(FAULTS, backend="sqlite", kind="read_only") == 2  # at start, at /readyz
        assert proxy.sample(HEALTHY, backend="sqlite") == 0
        assert await post(http, proxy, 1, "s-1") == 200  # fail open: no replay, no failed request
        await store_of(proxy).flush()
        subprocess.run(["mount", "-o", "remount,rw", str(tmpfs)], check=True)
        status, ready = await readyz(http, proxy)
        assert (status, ready["store"]) == (200, {"backend": "sqlite", "healthy": True})
        assert await post(http, proxy, 2, "s-2") == 200
        await store_of(proxy).flush()
    assert rows(state / "sessions.db") == 1  # s-2 (s-1 and its pacing met the read-only mount)
    assert proxy.sample(HEALTHY, backend="sqlite") == 1


async def test_frozen_redis_is_unresponsive_in_readyz_and_recovers(
    fake_upstream: FakeUpstream, make_proxy: Any, redis_server: RedisServer
) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, store=redis_server.url, secret="s" * 32)
    async with aiohttp.ClientSession() as http:
        status, ready = await readyz(http, proxy)
        assert (status, ready["store"]) == (200, {"backend": "redis", "healthy": True})
        assert redis_server.process is not None
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        try:
            assert await post(http, proxy, 1, "s-1") == 200  # the reads time out: no replay
            await store_of(proxy).flush()
            # record and pacing, read and written: each call timed out, none is a verdict
            assert proxy.sample(FAULTS, backend="redis", kind="timeout") == 4
            assert proxy.sample(HEALTHY, backend="redis") == 1
            status, ready = await readyz(http, proxy)  # the check's PING is: unresponsive
            assert status == 503
            assert ready["store"]["problem"] == "unresponsive"
            assert proxy.sample(FAULTS, backend="redis", kind="unresponsive") == 1
            assert proxy.sample(HEALTHY, backend="redis") == 0
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)
        status, ready = await readyz(http, proxy)
        assert (status, ready["store"]) == (200, {"backend": "redis", "healthy": True})
        assert proxy.sample(HEALTHY, backend="redis") == 1


async def test_redis_gone_is_one_warning_per_failure_and_no_error(
    fake_upstream: FakeUpstream, make_proxy: Any, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stopped (connection refused): requests flow, every failed call is counted, and the
    log says so at WARNING, once per failure; the bounded read's task does not log it again at
    ERROR as a crashed background task (`proxy.aio.create_task(..., is_awaited=True)`)."""
    proxy = await make_proxy(upstream=fake_upstream.url, store=redis_server.url, secret="s" * 32)
    redis_server.stop()
    caplog.set_level(logging.DEBUG, logger="promptcache")
    async with aiohttp.ClientSession() as http:
        assert await post(http, proxy, 1, "s-1") == 200
        await store_of(proxy).flush()
    loud = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [
        ("promptcache.store", "WARNING", "session store redis unhealthy: unavailable (Connection closed by server.)"),
        ("promptcache.store", "WARNING", "session store redis get failed (ConnectionError, unavailable)"),
    ]
    # the record and the pacing were each read and written: two reads, two writes failed
    assert proxy.sample("promptcache_session_store_errors_total", backend="redis", operation="get") == 2
    assert proxy.sample("promptcache_session_store_errors_total", backend="redis", operation="put") == 2
    assert proxy.sample(HEALTHY, backend="redis") == 0


async def test_frozen_redis_is_not_a_warning_per_request(
    fake_upstream: FakeUpstream, make_proxy: Any, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Review (session 15, user/hostile pass): a frozen Redis (SIGSTOP: connected, never
    answering) once reported unhealthy (`unresponsive`, the check's PING) still logged one
    WARNING per timed-out read and write, for every request while it stayed frozen (409
    WARNING lines in 15 s with one slow client): `timeout` is a transient kind, never the
    known problem, so it was never lowered to DEBUG. One WARNING per cause, as a
    stopped Redis (`unavailable`) gets."""
    proxy = await make_proxy(upstream=fake_upstream.url, store=redis_server.url, secret="s" * 32)
    assert redis_server.process is not None
    async with aiohttp.ClientSession() as http:
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        try:
            caplog.set_level(logging.DEBUG, logger="promptcache")
            for n in range(6):
                assert await post(http, proxy, n, f"s-{n}") == 200
                await store_of(proxy).flush()
                if n == 0:
                    status, _ = await readyz(http, proxy)  # the check's PING: unresponsive
                    assert status == 503
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    timeouts = [m for m in loud if "(TimeoutError, timeout)" in m]
    assert proxy.sample(FAULTS, backend="redis", kind="timeout") >= 12  # every one counted (14 here)
    assert len(timeouts) <= 2, loud  # at most one per operation, not one per request
