"""`promptcache serve --workers 2`: two processes on one port, /metrics summed, sessions shared.

Real processes (`python -m proxy serve`), the built-in simulator upstream, the default SQLite
store in a temp state dir; which worker served a request is read from
`promptcache_worker_requests_total{worker}` on /metrics (which any worker answers for all).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.sim.app import start_sim

HEADERS = {"x-api-key": "sk-ant-workers-test", "anthropic-version": "2023-06-01"}
MODEL = "claude-sonnet-4-6"
WAIT = 60.0


def _env(tmp_path: object) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PROMPTCACHE_", "PROMETHEUS_"))},
        "XDG_STATE_HOME": str(tmp_path),
        "PROMPTCACHE_LOG_FORMAT": "json",
    }


async def _spawn(tmp_path: object, *options: str) -> asyncio.subprocess.Process:
    """`promptcache serve --port 0 --workers 2 OPTIONS...` with piped output."""
    argv = [sys.executable, "-m", "proxy", "serve", "--port", "0", "--workers", "2", *options]
    pipe = asyncio.subprocess.PIPE
    return await asyncio.create_subprocess_exec(*argv, stdout=pipe, stderr=pipe, env=_env(tmp_path))


async def _start(tmp_path: object, upstream: str = "sim") -> tuple[asyncio.subprocess.Process, str, list[str]]:
    proc = await _spawn(tmp_path, "--upstream", upstream)
    assert proc.stdout is not None
    banner: list[str] = []
    while not banner or not banner[-1].startswith("  workers:"):
        line = (await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode()
        assert line, "serve exited before its banner"
        banner.append(line.rstrip("\n"))
    assert banner[-1] == "  workers: 2 processes on one port (SO_REUSEPORT)"
    return proc, banner[0].split(" listening on ")[1].split(" ")[0], banner


@pytest.fixture
async def served(tmp_path: object) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    # one simulator for both workers (each worker's built-in one would keep its own cache)
    sim_runner, sim_url = await start_sim("127.0.0.1", 0)
    proc, url, _ = await _start(tmp_path, sim_url)
    # both workers listen: the second may still be starting when the first printed the banner
    await _until(url, lambda m: True)
    try:
        yield proc, url
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), WAIT)
        await sim_runner.cleanup()


async def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http, http.get(f"{url}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _by_worker(m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    return {dict(labels)["worker"]: v for (name, labels), v in m.items() if name == "promptcache_worker_requests_total"}


def _total(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in m.items() if n == name and all(dict(ls).get(k) == x for k, x in labels.items()))


async def _until(url: str, done: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics once `done(metrics)` holds (the workers write samples after the response)."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                m = await _metrics(url)
            except aiohttp.ClientError:
                m = None
            if m is not None and done(m):  # type: ignore[operator]
                return m
            await asyncio.sleep(0.05)


def _body(turns: int, tag: str) -> dict[str, object]:
    messages: list[dict[str, object]] = [{"role": "user", "content": f"Task {tag}: read the files. " * 300}]
    for k in range(turns):
        messages.append({"role": "assistant", "content": f"Reading file {k} of {tag}."})
        messages.append({"role": "user", "content": f"Here is file {k}: " + "x = 1\n" * 60})
    return {"model": MODEL, "max_tokens": 16, "messages": messages}


async def test_two_workers_share_the_port_and_metrics_sum_both(served) -> None:
    proc, url = served
    n = 40
    for i in range(n):
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection: the kernel picks a worker
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.post(f"{url}/v1/messages", json=_body(0, f"one-{i}"), headers=HEADERS) as r:
                assert r.status == 200
                await r.read()
    # /metrics reads each metric's file in turn, while a worker may be between its gauge's
    # decrement and its counter's increment: one scrape can show the count done and the
    # request still in flight, so the wait is for both (a gauge stuck at 1 still fails)
    m = await _until(
        url,
        lambda m: (
            _total(m, "promptcache_requests_total", provider="anthropic") == n
            and _total(m, "promptcache_requests_in_flight", provider="anthropic") == 0
        ),
    )
    workers = _by_worker(m)
    assert set(workers) == {"0", "1"}
    assert workers["0"] > 0 and workers["1"] > 0  # requests landed on both workers
    assert workers["0"] + workers["1"] == n  # and /metrics, answered by one, sums both


async def test_a_session_continues_on_the_other_worker(served) -> None:
    proc, url = served
    assert proc.stderr is not None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.post(f"{url}/v1/messages", json=_body(1, "shared"), headers=HEADERS) as r:
            assert r.status == 200
            await r.read()
    m = await _until(
        url,
        lambda m: (
            sum(_by_worker(m).values()) == 1
            and _total(
                m, "promptcache_session_store_operation_duration_seconds_count", backend="sqlite", operation="put"
            )
            >= 1
        ),
    )
    first = next(w for w, v in _by_worker(m).items() if v == 1)
    # the next turn on a connection held by the other worker (a probe request tells which)
    for _ in range(100):
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        try:
            before = _by_worker(await _metrics(url))
            async with http.get(f"{url}/v1/models", headers=HEADERS) as r:
                await r.read()
            after = _by_worker(await _metrics(url))
            served_by = next(w for w in after if after[w] != before.get(w, 0))
            if served_by == first:
                continue
            async with http.post(f"{url}/v1/messages", json=_body(2, "shared"), headers=HEADERS) as r:
                assert r.status == 200
                await r.read()
            break
        finally:
            await http.close()
    else:
        pytest.fail("no connection reached the other worker")
    access = []
    while len(access) < 2:
        line = await asyncio.wait_for(proc.stderr.readline(), WAIT)
        assert line, "serve exited"
        data = orjson.loads(line)
        if data.get("path") == "/v1/messages":
            access.append(data)
    one, two = access
    assert one["cause"] == "first_request"
    assert two["session"] == one["session"]  # the same session, on the other worker
    assert two["cause"] != "first_request"  # measured against turn 1, read from the shared store
    assert two["read"] > 0  # and the simulator read turn 1's cache: the prefix bytes were identical


async def test_sigterm_stops_every_worker(tmp_path) -> None:
    proc, url, banner = await _start(tmp_path)
    await _until(url, lambda m: True)
    # the forensic map's generated token is one for the set: every worker takes it
    [line] = [line for line in banner if line.startswith("  forensic map: ")]
    page = line.removeprefix("  forensic map: ")
    assert page.startswith(f"{url}/ui/?token=")
    for _ in range(8):
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection: the kernel picks a worker
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.get(page) as r:
                assert r.status == 200
            async with http.get(f"{url}/ui/") as r:
                assert r.status == 401
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), WAIT) == 0
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            async with http.get(f"{url}/healthz") as r:
                await r.read()


async def test_memory_store_is_refused_with_workers(tmp_path) -> None:
    proc = await _spawn(tmp_path, "--store", "memory://")
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 2
    assert err.decode() == "promptcache: workers > 1 needs a shared store (sqlite:// or redis://), not memory://\n"
