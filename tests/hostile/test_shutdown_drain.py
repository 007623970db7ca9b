"""SIGTERM drains instead of dropping (`proxy.shutdown`): a keep-alive client whose next
request arrives after the signal gets its answer, with `Connection: close`; `/readyz` answers
503 meanwhile; no new connection is accepted; the process exits 0 once the connections closed.

Before, `serve` called `runner.cleanup()` at once: keep-alive connections were closed under
their clients (ServerDisconnectedError, the request never processed). The test runs the real
`promptcache serve` (built-in simulator) and synchronises on the server's observable state
(`/readyz` turning 503 on an already open connection), never on time."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import orjson

from tests.hostile.conftest import host_port, read_response, request_bytes

HEADERS = {"x-api-key": "key-drain", "anthropic-version": "2023-06-01", "content-type": "application/json"}
BODY = orjson.dumps({"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
READYZ = b"GET /readyz HTTP/1.1\r\nHost: proxy\r\n\r\n"


async def start_serve(tmp_path: Path, *options: str) -> tuple[asyncio.subprocess.Process, str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PROMPTCACHE_")},
        "XDG_STATE_HOME": str(tmp_path),
        "PROMPTCACHE_SHUTDOWN_GRACE_SECONDS": "120",  # the test ends long before: connections close
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        *("--port", "0", "--upstream", "sim", *(options or ("--store", "memory://"))),
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    last = "  workers:" if "--workers" in options else "  state dir:"
    while not lines or not lines[-1].startswith(last):
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line, "serve exited before its banner"
        lines.append(line.rstrip("\n"))
    return proc, lines[0].split(" listening on ")[1].split(" ")[0]


async def test_a_keep_alive_request_after_sigterm_is_answered_with_connection_close(tmp_path: Path) -> None:
    proc, url = await start_serve(tmp_path)
    host, port = host_port(url)
    try:
        probe_r, probe_w = await asyncio.open_connection(host, port)
        client_r, client_w = await asyncio.open_connection(host, port)
        client_w.write(request_bytes("/v1/messages", BODY, HEADERS))
        first = await read_response(client_r)
        assert (first.status, first.headers.get("connection")) == (200, None)  # kept alive

        proc.send_signal(signal.SIGTERM)
        while True:  # the probe's connection stays open while /readyz answers 200
            probe_w.write(READYZ)
            ready = await asyncio.wait_for(read_response(probe_r), 60)
            if ready.status != 200:
                break
        assert (ready.status, orjson.loads(ready.body)["status"]) == (503, "draining")
        assert ready.headers["connection"] == "close"
        assert await probe_r.read() == b""
        probe_w.close()

        client_w.write(request_bytes("/v1/messages", BODY, HEADERS))
        second = await asyncio.wait_for(read_response(client_r), 60)
        assert (second.status, second.headers["connection"]) == (200, "close")
        assert orjson.loads(second.body)["type"] == "message"
        assert await client_r.read() == b""
        client_w.close()

        refused = False
        try:
            await asyncio.open_connection(host, port)
        except ConnectionRefusedError:
            refused = True
        assert refused, "a new connection was accepted while draining"
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_with_two_workers_every_keep_alive_request_after_sigterm_is_answered(tmp_path: Path) -> None:
    """`--workers 2`: the supervisor passes SIGTERM to each worker, each drains. The client
    keeps sending on its open connection until a response says `Connection: close`: every
    request is answered 200 (none dropped), and the connection then ends."""
    proc, url = await start_serve(tmp_path, "--workers", "2", "--store", f"sqlite:///{tmp_path}/sessions.db")
    host, port = host_port(url)
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request_bytes("/v1/messages", BODY, HEADERS))
        assert (await read_response(reader)).headers.get("connection") is None
        proc.send_signal(signal.SIGTERM)
        statuses = []
        while True:
            writer.write(request_bytes("/v1/messages", BODY, HEADERS))
            response = await asyncio.wait_for(read_response(reader), 60)
            statuses.append(response.status)
            if response.headers.get("connection") == "close":
                break
        assert set(statuses) == {200}
        assert await reader.read() == b""
        writer.close()
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
