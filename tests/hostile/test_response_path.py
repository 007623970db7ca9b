"""The response path (issue 11, items 2 and 3): once the last byte is out, the client leaving
cancels nothing (outcome as received, usage counted once, the record saved by a background task
that outlives the handler and is drained on shutdown), and the record save never sits in the
next request's path, even with the store frozen (a real redis-server stopped with SIGSTOP)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis

from proxy.session_identity import explicit_id
from proxy.store.codec import MAGIC, decode_record
from tests.hostile.conftest import post_and_hang_up
from tests.sessions.conftest import Proxy, Sim
from tests.store.redis_server import RedisServer

MODEL = "claude-sonnet-4-6"
HEADERS = {
    "x-api-key": "key-hostile",
    "anthropic-version": "2023-06-01",
    "content-type": "application/json",
    "x-session-id": "conversation-7",
}


def conversation(turns: int) -> list[dict[str, Any]]:
    """The body of each turn of one conversation that grows turn by turn."""
    system = "You are a careful assistant. " * 200
    messages: list[dict[str, Any]] = []
    bodies = []
    for n in range(turns):
        messages = [*messages, {"role": "user", "content": f"question {n}: " + "detail " * 50}]
        bodies.append({"model": MODEL, "max_tokens": 32, "system": system, "messages": messages})
        messages = [*messages, {"role": "assistant", "content": f"answer {n}"}]
    return bodies


def usage_total(responses: list[Any]) -> dict[str, int]:
    out = {"none": 0, "read": 0, "write": 0, "output": 0}
    for body in responses:
        usage = body["usage"]
        out["none"] += usage["input_tokens"]
        out["read"] += usage["cache_read_input_tokens"]
        out["write"] += usage["cache_creation_input_tokens"]
        out["output"] += usage["output_tokens"]
    return out


async def test_client_hanging_up_after_the_body_cancels_nothing(start_proxy: Any, sim: Sim, tmp_path: Path) -> None:
    """Default SQLite store; every turn's client closes the moment it has the body."""
    proxy: Proxy = await start_proxy(upstream=sim.url, store=f"sqlite://{tmp_path}/sessions.db")
    turns = 12
    answers = []
    for body in conversation(turns):
        response = await post_and_hang_up(proxy.url, "/v1/messages", orjson.dumps(body), HEADERS)
        assert response.status == 200
        answers.append(response.json())
    await proxy.stop()  # drains the background record writes
    sample = proxy.sample
    assert sample("promptcache_requests_total", provider="anthropic", outcome="ok") == turns
    assert sample("promptcache_requests_total", provider="anthropic", outcome="client_error") == 0
    expected = usage_total(answers)
    assert expected["read"] > 0
    for cache in ("none", "read", "write"):
        got = sample("promptcache_input_tokens_total", provider="anthropic", cache=cache)
        assert got == expected[cache], cache
    assert sample("promptcache_output_tokens_total", provider="anthropic") == expected["output"]
    assert sample("promptcache_stage_duration_seconds_count", stage="observe") == turns
    # Every turn's record was written: the last one counts all the turns.
    import sqlite3

    with sqlite3.connect(tmp_path / "sessions.db") as db:
        rows = db.execute("SELECT value FROM sessions").fetchall()
    rows = [r for r in rows if bytes(r[0]).startswith(MAGIC)]  # the tenant's pacing is the other row
    assert len(rows) == 1
    assert decode_record(bytes(rows[0][0])).turns == turns


async def test_frozen_redis_never_delays_the_next_request(
    start_proxy: Any, sim: Sim, redis_server: RedisServer
) -> None:
    """With Redis stopped (SIGSTOP), the next request on the same keep-alive connection is
    answered while the previous record's write is still pending; the pending record serves
    this replica's next turn (read-your-writes); once Redis runs again the shutdown drain
    writes the newest record."""
    proxy: Proxy = await start_proxy(upstream=sim.url, store=redis_server.url)
    store = proxy.services.store
    store.put_timeout = 60.0  # a frozen store would hold an in-path write for a minute
    bodies = conversation(4)
    assert redis_server.process is not None
    pid = redis_server.process.pid
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=20)) as http:

        async def send(body: dict[str, Any]) -> Any:
            async with http.post(proxy.url + "/v1/messages", data=orjson.dumps(body), headers=HEADERS) as r:
                assert r.status == 200
                return await r.json()

        await send(bodies[0])
        await store.flush()
        os.kill(pid, signal.SIGSTOP)
        try:
            for body in bodies[1:]:
                await send(body)
            # Three turns answered on one connection, none waited for the frozen store.
            assert store.pending_writes == 1
            assert proxy.sample("promptcache_session_store_errors_total", backend="redis", operation="put") == 0
            assert proxy.sample("promptcache_session_store_pending_writes", backend="redis") == 1
            # Turn 2 waited for the bounded read (50 ms) and went on; turns 3 and 4 read the
            # pending record, not the frozen store.
            assert proxy.sample("promptcache_session_store_errors_total", backend="redis", operation="get") == 1
        finally:
            os.kill(pid, signal.SIGCONT)
    await proxy.stop()  # drains the pending write, Redis running again
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    keys = [k for k in client.keys("promptcache:*") if not k.endswith(b":pacing")]  # the tenant's pacing
    assert len(keys) == 1
    record = decode_record(client.get(keys[0]))
    client.close()
    # Turn 2 went on without its previous record (the frozen read), so it started the count
    # again; turns 3 and 4 built on the pending records: 3 turns, the newest written.
    assert record.turns == 3
    assert keys[0].decode().endswith(":" + explicit_id("conversation-7"))
