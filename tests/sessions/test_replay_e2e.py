"""Replay end to end: proxy -> recording fake upstream, real HTTP. Replay is triggered by a
client that re-sends an earlier message with its JSON keys in another order (the masked digest
sorts keys), so these tests do not depend on the rule files."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from proxy.pipeline.session import masker_for
from proxy.session_identity import explicit_id
from proxy.store.codec import SessionRecord, Sidecar
from tests.fakes.upstream import FakeUpstream
from tests.sessions.conftest import Client, Proxy
from tests.store.redis_server import RedisServer

MODEL = "claude-sonnet-4-6"
FIRST = {"role": "user", "content": [{"type": "text", "text": "Summarise the design document, please."}]}
FIRST_REORDERED = {
    "content": [{"text": "Summarise the design document, please.", "type": "text"}],
    "role": "user",
}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "Hello there"}]}
SESSION = {"x-session-id": "conversation-1"}


def turn(*messages: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": list(messages)}


def sent_messages(fake: FakeUpstream, i: int) -> list[bytes]:
    """The upstream's view of request `i`: each message as orjson bytes (key order kept)."""
    return [orjson.dumps(m) for m in orjson.loads(fake.received[i].body)["messages"]]


def replayed(proxy: Proxy) -> float:
    return proxy.sample("promptcache_replayed_messages_total", provider="anthropic")


async def test_earlier_message_is_replayed_with_first_bytes(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url)
    status, _ = await client.messages(proxy, turn(FIRST), headers=SESSION)
    assert status == 200
    status, _ = await client.messages(
        proxy, turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "And the risks?"}), headers=SESSION
    )
    assert status == 200
    assert sent_messages(fake_upstream, 1)[0] == orjson.dumps(FIRST)
    assert sent_messages(fake_upstream, 1)[1:] == [
        orjson.dumps(REPLY),
        b'{"role":"user","content":"And the risks?"}',
    ]
    assert replayed(proxy) == 1


async def test_unchanged_history_is_forwarded_byte_for_byte(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url)
    await client.messages(proxy, turn(FIRST), headers=SESSION)
    await client.messages(proxy, turn(FIRST, REPLY, {"role": "user", "content": "More"}), headers=SESSION)
    assert fake_upstream.received[1].body == client.sent[1]
    assert replayed(proxy) == 0


async def test_tenants_never_receive_each_others_bytes(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url)
    state, store = proxy.services.sessions, proxy.services.store
    tenant_a = state.tenant_of("anthropic", {"x-api-key": "key-a"})
    tenant_b = state.tenant_of("anthropic", {"x-api-key": "key-b"})
    assert tenant_a != tenant_b
    planted = orjson.dumps({**FIRST, "planted_for": "tenant-a"})
    digest = masker_for(state, proxy.services).digest(FIRST)
    record = SessionRecord(b"", (), MODEL, b"", sidecars=(Sidecar(0, digest, planted),))
    assert await store.save(tenant_a, explicit_id("conversation-1"), record)

    conversation = turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "next"})
    await client.messages(proxy, conversation, key="key-b", headers=SESSION)
    await client.messages(proxy, conversation, key="key-a", headers=SESSION)

    assert fake_upstream.received[0].body == client.sent[0]  # tenant B: its own bytes, untouched
    assert b"planted_for" not in fake_upstream.received[0].body
    assert sent_messages(fake_upstream, 1)[0] == planted  # tenant A: its planted sidecar


async def test_sqlite_restart_between_turns_keeps_replaying(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, tmp_path: Path
) -> None:
    settings = {"upstream": fake_upstream.url, "store": "", "state_dir": tmp_path / "state"}
    first = await start_proxy(**settings)
    await client.messages(first, turn(FIRST), headers=SESSION, key="sk-ant-secret-key-123")
    await first.stop()

    second = await start_proxy(**settings)
    await client.messages(
        second,
        turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "again"}),
        headers=SESSION,
        key="sk-ant-secret-key-123",
    )
    assert sent_messages(fake_upstream, 1)[0] == orjson.dumps(FIRST)
    assert replayed(second) == 1

    secret = tmp_path / "state" / "secret"
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    for path in (tmp_path / "state").iterdir():  # the raw key is stored nowhere
        assert b"sk-ant-secret-key-123" not in path.read_bytes()


async def test_two_proxies_share_sessions_through_redis(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = {"upstream": fake_upstream.url, "store": redis_server.url, "secret": "s" * 64}
    proxy_a = await start_proxy(**settings, state_dir=tmp_path / "a")
    proxy_b = await start_proxy(**settings, state_dir=tmp_path / "b")
    await client.messages(proxy_a, turn(FIRST), headers=SESSION)
    await client.settle(proxy_a)
    await client.messages(
        proxy_b, turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "b"}), headers=SESSION
    )
    assert sent_messages(fake_upstream, 1)[0] == orjson.dumps(FIRST)
    assert replayed(proxy_a) == 0 and replayed(proxy_b) == 1


async def test_redis_stopped_mid_conversation_fails_no_request(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, redis_server: RedisServer
) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url, store=redis_server.url)
    conversation = [FIRST]
    status, _ = await client.messages(proxy, turn(*conversation), headers=SESSION)
    assert status == 200
    # the first turn's background writes (its record, the tenant's pacing after its first
    # response) land before Redis stops; left racing the stop, the pacing write failed or not,
    # and the record write too on a slow machine (4 or 5 put errors)
    await client.settle(proxy)
    redis_server.stop()
    for n in range(3):
        conversation += [REPLY, {"role": "user", "content": f"turn {n}"}]
        status, body = await client.messages(proxy, turn(*conversation), headers=SESSION)
        assert status == 200 and body["id"] == "msg_fake_1"
        assert fake_upstream.received[-1].body == client.sent[-1]  # forwarded as sent, no replay
        # each turn's writes fail before the next turn: none is superseded while pending
        await client.settle(proxy)
    assert proxy.sample("promptcache_session_store_errors_total", backend="redis", operation="get") == 3
    # the three session records written with Redis stopped
    assert proxy.sample("promptcache_session_store_errors_total", backend="redis", operation="put") == 3
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="ok") == 4
    assert proxy.sample("promptcache_stage_errors_total", stage="session") == 0


async def test_locked_sqlite_fails_no_request(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, tmp_path: Path
) -> None:
    import sqlite3

    proxy = await start_proxy(upstream=fake_upstream.url, store=f"sqlite://{tmp_path}/s.db")
    await client.messages(proxy, turn(FIRST), headers=SESSION)
    await client.settle(proxy)
    holder = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    status, _ = await client.messages(
        proxy, turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "x"}), headers=SESSION
    )
    assert status == 200
    await client.settle(proxy)
    # Both writes of the turn fail (the session record and the tenant's pacing entry).
    assert proxy.sample("promptcache_session_store_errors_total", backend="sqlite", operation="put") == 2
    assert proxy.sample("promptcache_session_store_errors_total", backend="sqlite", operation="get") == 0
    assert sent_messages(fake_upstream, 1)[0] == orjson.dumps(FIRST)  # WAL: reads go on
    holder.execute("ROLLBACK")
    holder.close()


async def test_corrupt_sqlite_file_fails_no_request(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, tmp_path: Path
) -> None:
    db = tmp_path / "s.db"
    db.write_bytes(b"garbage" * 4096)
    proxy = await start_proxy(upstream=fake_upstream.url, store=f"sqlite://{db}")
    status, _ = await client.messages(proxy, turn(FIRST), headers=SESSION)
    assert status == 200
    status, _ = await client.messages(
        proxy, turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "x"}), headers=SESSION
    )
    assert status == 200
    assert sent_messages(fake_upstream, 1)[0] == orjson.dumps(FIRST)  # moved aside, fresh file, replay works


async def test_inferred_session_appends_and_replays(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url)
    await client.messages(proxy, turn(FIRST))
    await client.messages(proxy, turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "more"}))
    assert sent_messages(fake_upstream, 1)[0] == orjson.dumps(FIRST)
    await client.settle(proxy)
    backend = proxy.services.store.backend
    assert len(backend) == 2  # one session (two turns) and the tenant's pacing


async def test_openai_chat_replay_skips_system_messages(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url)
    system = {"role": "system", "content": "You are terse."}
    user = {"role": "user", "content": [{"type": "text", "text": "List the files."}]}
    user_reordered = {"content": [{"text": "List the files.", "type": "text"}], "role": "user"}
    reply = {"role": "assistant", "content": "a.py b.py"}
    headers = {"authorization": "Bearer sk-openai", "content-type": "application/json"}

    async def chat(messages: list[dict[str, Any]]) -> None:
        raw = orjson.dumps({"model": "gpt-5.1", "messages": messages, "prompt_cache_key": "conv-7"})
        async with client.session.post(proxy.url + "/v1/chat/completions", data=raw, headers=headers) as r:
            assert r.status == 200
            await r.read()

    await chat([system, user])
    await client.settle(proxy)
    await chat([system, user_reordered, reply, {"role": "user", "content": "Only .py?"}])
    sent = orjson.loads(fake_upstream.received[1].body)["messages"]
    assert orjson.dumps(sent[0]) == orjson.dumps(system)
    assert orjson.dumps(sent[1]) == orjson.dumps(user)
    assert proxy.sample("promptcache_replayed_messages_total", provider="openai") == 1


async def test_inferred_session_survives_a_restart(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, tmp_path: Path
) -> None:
    settings = {"upstream": fake_upstream.url, "store": "", "state_dir": tmp_path / "state"}
    first = await start_proxy(**settings)
    await client.messages(first, turn(FIRST))  # no session id anywhere: inferred
    await first.stop()
    second = await start_proxy(**settings)
    await client.messages(second, turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "and?"}))
    assert sent_messages(fake_upstream, 1)[0] == orjson.dumps(FIRST)  # same root id, record found


async def test_a_restart_replays_once_the_sole_writer_has_listed_the_file_s_keys(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, tmp_path: Path
) -> None:
    """After a restart the single `serve` process lists the file's keys (`learn_keys`) and skips
    the read of any key not listed; the session written before the restart is listed, so its
    next turn is read and replayed with the bytes sent before the restart. (Replay counts a
    message only when the client's bytes differ from the stored ones: a client re-sending the
    very bytes has nothing spliced, and `promptcache_replayed_messages_total` stays 0.)"""
    settings = {"upstream": fake_upstream.url, "store": "", "state_dir": tmp_path / "state"}
    first = await start_proxy(**settings)
    await client.messages(first, turn(FIRST), headers=SESSION)
    await first.stop()
    second = await start_proxy(**settings)
    store = second.services.store
    assert store is not None and store.is_sole_writer
    await store.learn_keys()  # the listing `store_ctx` started, done (or done again)
    assert store._keys is not None
    await client.messages(second, turn(FIRST, REPLY, {"role": "user", "content": "same bytes"}), headers=SESSION)
    await client.settle(second)
    # read from the file: the record written before the restart (and the tenant's pacing)
    assert second.sample("promptcache_session_store_local_reads_total", backend="sqlite") == 0
    await client.messages(
        second, turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "reordered"}), headers=SESSION
    )
    assert [sent_messages(fake_upstream, i)[0] for i in (1, 2)] == [orjson.dumps(FIRST)] * 2
    assert replayed(second) == 1  # the reordered turn only
    # the third turn's previous record is the one this process wrote: no read
    assert second.sample("promptcache_session_store_local_reads_total", backend="sqlite") == 1


async def test_a_client_hanging_up_mid_response_keeps_the_session_s_record_and_replay(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, tmp_path: Path
) -> None:
    """Turn 2's client closes after the first SSE event. Its response never ended, so it writes
    no record; turn 3 (the client retrying) is replayed from turn 1's record, and its own
    record is written: two turns."""
    proxy = await start_proxy(upstream=fake_upstream.url, store="", state_dir=tmp_path / "state")
    await client.messages(proxy, turn(FIRST), headers=SESSION)
    await client.settle(proxy)
    fake_upstream.mode = "hang_stream"
    headers = {**SESSION, "anthropic-version": "2023-06-01", "x-api-key": "key-a"}
    body = {**turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "streamed"}), "stream": True}
    async with aiohttp.ClientSession() as http:
        response = await http.post(proxy.url + "/v1/messages", json=body, headers=headers)
        assert (await response.content.readuntil(b"\n\n")).startswith(b"event: message_start")
        response.close()
    await fake_upstream.client_gone.wait()
    for _ in range(1000):  # the handler's own unwinding runs on this loop: yield to it
        if proxy.sample("promptcache_requests_in_flight", provider="anthropic") == 0:
            break
        await asyncio.sleep(0)
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="client_error") == 1
    fake_upstream.mode = "normal"
    await client.messages(proxy, turn(FIRST_REORDERED, REPLY, {"role": "user", "content": "again"}), headers=SESSION)
    await client.settle(proxy)
    assert [sent_messages(fake_upstream, i)[0] for i in (1, 2)] == [orjson.dumps(FIRST)] * 2
    assert replayed(proxy) == 2
    store = proxy.services.store
    assert store is not None
    (key,) = [k for k in await store.backend.keys() if k[1] == explicit_id("conversation-1")]
    record = await store.load(*key)
    assert record is not None and record.turns == 2


async def test_a_session_encoded_against_a_donor_replays_after_a_restart_as_one_without(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, tmp_path: Path
) -> None:
    """A new session re-sending the conversation another session of its tenant just sent is
    encoded against that one's record (the donor: `RecordStore._donors`). After a restart on the
    same state dir its next turn is replayed and measured exactly as in a process that never
    had a donor (attack pass, session 16: held)."""
    history = [FIRST, REPLY]
    for i in range(40):  # ~40 KB of messages: the record is written in parts
        history.append({"role": "user", "content": f"step {i}: " + "lorem ipsum " * 80})
        history.append({"role": "assistant", "content": [{"type": "text", "text": f"done {i}"}]})
    history.append({"role": "user", "content": "and now?"})
    later = [FIRST_REORDERED, *history[1:], REPLY, {"role": "user", "content": "then?"}]

    async def run(state: Path, donor: bool) -> tuple[bytes, float, list[float]]:
        settings = {"upstream": fake_upstream.url, "store": "", "state_dir": state}
        proxy = await start_proxy(**settings)
        if donor:
            await client.messages(proxy, turn(*history), headers={"x-session-id": "donor-1"})
            await client.settle(proxy)
            assert len(proxy.services.store._donors) == 1  # the tenant's donor: donor-1's record
        status, _ = await client.messages(proxy, turn(*history), headers=SESSION)
        assert status == 200
        await proxy.stop()
        proxy = await start_proxy(**settings)
        status, _ = await client.messages(proxy, turn(*later), headers=SESSION)
        assert status == 200
        names = ("promptcache_replayed_messages_total", "promptcache_prompt_bytes_total")
        return fake_upstream.received[-1].body, replayed(proxy), [proxy.sample(n, provider="anthropic") for n in names]

    with_donor = await run(tmp_path / "a", True)
    without = await run(tmp_path / "b", False)
    assert with_donor == without
    sent = orjson.loads(with_donor[0])["messages"]
    # the reordered first message and the one the turn before ended with (its marker gone)
    assert with_donor[1] == 2
    assert sent[0] == FIRST


async def test_concurrent_new_sessions_re_sending_one_conversation_are_all_kept(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, tmp_path: Path
) -> None:
    """32 new sessions of one tenant at once, each re-sending the same ~40 KB conversation (the
    gateway bench's first1 cell; their records encoded against the tenant's donor): every
    request answered, and after a restart every session's next turn is replayed from its own
    record (attack pass, session 16: held)."""
    history = [FIRST, REPLY]
    for i in range(40):
        history.append({"role": "user", "content": f"step {i}: " + "lorem ipsum " * 80})
        history.append({"role": "assistant", "content": [{"type": "text", "text": f"done {i}"}]})
    history.append({"role": "user", "content": "and now?"})
    settings = {"upstream": fake_upstream.url, "store": "", "state_dir": tmp_path / "state"}
    proxy = await start_proxy(**settings)
    answers = await asyncio.gather(
        *(client.messages(proxy, turn(*history), headers={"x-session-id": f"s-{i}"}) for i in range(32))
    )
    assert [status for status, _ in answers] == [200] * 32
    await proxy.stop()
    proxy = await start_proxy(**settings)
    later = [FIRST_REORDERED, *history[1:], REPLY, {"role": "user", "content": "then?"}]
    for i in range(32):
        status, _ = await client.messages(proxy, turn(*later), headers={"x-session-id": f"s-{i}"})
        assert status == 200
        assert sent_messages(fake_upstream, -1)[0] == orjson.dumps(FIRST)
    assert replayed(proxy) == 2 * 32
