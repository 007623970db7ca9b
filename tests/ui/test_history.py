"""The recent-sessions index (`proxy.history`) and the JSON listing `/debug/sessions`: bounded, per
tenant, no credential, only short excerpts; `/debug/sessions/{id}` finds the provider itself."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from proxy.forensics import EXCERPT_CHARS
from proxy.history import SessionHistory
from proxy.session_identity import explicit_id
from proxy.ui.page import index_page, session_page, session_view
from tests.ui.conftest import KEY, SESSION, drive_session


class _Usage:
    cache_read, cache_write_5m, cache_write_1h, input_none, output = 10, 5, 0, 3, 1


class _Divergence:
    section, block_index, tokens = "none", 0, 0


class _Measurement:
    provider, family, cause, block_path, prompt_bytes, predicted_read_tokens = "anthropic", "x", "none", None, 80, 0
    usage, divergence, cost_usd, uncached_cost_usd = _Usage(), _Divergence(), 0.5, 1.0


def test_bounds_per_tenant_total_and_rows() -> None:
    history = SessionHistory(max_sessions=5, max_per_tenant=2, requests_per_session=3)
    for i in range(4):
        history.add("tenant-a", f"a{i}", _Measurement(), path="/v1/messages", now=float(i))
    assert [e.session_id for e in history.recent()] == ["a3", "a2"]
    for i in range(6):
        history.add(f"tenant-{i}", "s", _Measurement(), path="/v1/messages", now=10.0 + i)
    assert len(history) == 5
    assert [e.tenant for e in history.recent()] == [f"tenant-{i}" for i in (5, 4, 3, 2, 1)]
    for i in range(5):
        history.add("tenant-5", "s", _Measurement(), path="/v1/messages", now=20.0 + i)
    entry = history.entry("tenant-5", "s")
    assert entry is not None
    assert [r.n for r in entry.rows] == [4, 5, 6]
    # Totals cover every request, also the dropped rows.
    assert (entry.requests, entry.read_tokens, entry.prompt_tokens) == (6, 60, 108)
    assert entry.summary()["savings_usd"] == 3.0 and entry.summary()["hit_ratio"] == round(60 / 108, 4)


class _NoUsage(_Measurement):
    usage, cost_usd, uncached_cost_usd = None, None, None


def test_a_session_whose_usage_was_never_seen_reads_unknown_not_zero() -> None:
    """A Chat stream without `stream_options.include_usage` carries no usage: its hit ratio,
    cost and savings are unknown (`None` in the listing, `-` on the pages), not 0% and $0."""
    history = SessionHistory()
    entry = history.add("tenant-a", "s", _NoUsage(), path="/v1/chat/completions", now=1.0)
    history.add("tenant-a", "s", _NoUsage(), path="/v1/chat/completions", now=2.0)
    summary = entry.summary()
    assert (summary["requests"], summary["hit_ratio"], summary["cost_usd"], summary["savings_usd"]) == (
        2,
        None,
        None,
        None,
    )
    row = index_page([entry]).split("<td>2</td>", 1)[1]
    assert row.startswith("<td>-</td><td>-</td>")
    assert session_view(entry)["subtitle"].endswith(" · 2 requests, hit ratio -, savings -")
    history.add("tenant-a", "s", _Measurement(), path="/v1/chat/completions", now=3.0)
    summary = entry.summary()
    assert (summary["hit_ratio"], summary["cost_usd"], summary["savings_usd"]) == (round(10 / 18, 4), 0.5, 0.5)


async def test_listing_is_the_callers_sessions_only(admin_proxy) -> None:
    proxy = await admin_proxy()
    await drive_session(proxy.url, turns=3)
    await drive_session(proxy.url, turns=1, key="sk-ant-other-tenant", session="other")
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.admin_url + "/debug/sessions", headers={"x-api-key": KEY}) as r:
            mine = (await r.json())["sessions"]
        async with http.get(proxy.admin_url + "/debug/sessions", headers={"x-api-key": "sk-ant-other-tenant"}) as r:
            theirs = (await r.json())["sessions"]
        async with http.get(proxy.admin_url + "/debug/sessions", headers={"x-api-key": "sk-nobody"}) as r:
            nobody = (await r.json())["sessions"]
    assert [(s["session_id"], s["requests"], s["last_cause"]) for s in mine] == [
        (explicit_id(SESSION), 3, "none"),
    ]
    assert mine[0]["hit_ratio"] > 0.5 and mine[0]["savings_usd"] > 0
    assert [s["session_id"] for s in theirs] == [explicit_id("other")]
    assert nobody == []


async def test_session_provider_found_without_query(admin_proxy) -> None:
    proxy = await admin_proxy()
    headers = {"Authorization": "Bearer sk-openai-ui-test", "x-session-id": "oa-1"}
    body = {
        "model": "gpt-5.4",
        "messages": [{"role": "system", "content": "Be brief. " * 400}, {"role": "user", "content": "hi"}],
    }
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(proxy.url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers) as r:
                assert r.status == 200, await r.text()
                await r.read()
        caller = {"Authorization": "Bearer sk-openai-ui-test"}
        async with http.get(proxy.admin_url + "/debug/sessions/oa-1", headers=caller) as r:
            assert r.status == 200
            found = await r.json()
        async with http.get(
            proxy.admin_url + "/debug/sessions/oa-1", params={"provider": "openai"}, headers=caller
        ) as r:
            assert r.status == 200
        async with http.get(proxy.admin_url + "/debug/sessions/oa-1", params={"provider": "x"}, headers=caller) as r:
            assert r.status == 400
        async with http.get(proxy.admin_url + "/debug/sessions/oa-1", headers={"Authorization": "Bearer sk-x"}) as r:
            assert r.status == 404
        async with http.get(proxy.admin_url + "/debug/sessions", headers=caller) as r:
            listed = (await r.json())["sessions"]
    assert found["provider"] == "openai"
    assert found["record"]["turns"] == 2
    assert found["summary"]["requests"] == 2
    assert found["last_request"]["divergence"]["cause"] == "none"
    assert [(s["provider"], s["requests"]) for s in listed] == [("openai", 2)]


async def test_no_key_and_only_short_excerpts(admin_proxy) -> None:
    proxy = await admin_proxy(mode="observe")
    await drive_session(proxy.url, turns=3)
    history = proxy.services.last_measurements
    entry = history.find(explicit_id(SESSION))
    assert entry is not None
    everything: Any = [entry.summary(), [r for r in entry.rows], list(entry.blocks), entry._head]
    dumped = repr(everything) + index_page(history.recent()) + session_page(session_view(entry))
    assert KEY not in dumped
    for row in entry.rows:
        for text in (row.before, row.after):
            assert text is None or len(text) <= 2 * EXCERPT_CHARS + 6
    assert [r.after for r in entry.rows][1:] == [
        "Current time: 2026-12-01T09:01:00Z",
        "Current time: 2026-12-01T09:02:00Z",
    ]
    async with aiohttp.ClientSession() as http:
        for path in ("/debug/sessions", f"/debug/sessions/{SESSION}", "/ui/", f"/ui/sessions/{SESSION}"):
            params = {"token": proxy.services.ui_token} if path.startswith("/ui") else {}
            async with http.get(proxy.admin_url + path, headers={"x-api-key": KEY}, params=params) as r:
                assert r.status == 200, path
                assert KEY not in await r.text()


def test_message_excerpt_comes_from_the_previous_sidecar() -> None:
    from proxy.history import divergence_excerpts
    from proxy.prefix import scan_prompt
    from proxy.providers import ANTHROPIC
    from proxy.store.codec import Sidecar

    old_message = {"role": "user", "content": [{"type": "text", "text": "Fix the bug in parser.py line 12 please"}]}
    new_message = {"role": "user", "content": [{"type": "text", "text": "Fix the bug in parser.py line 13 please"}]}
    body = {"model": "m", "system": "s", "messages": [new_message, {"role": "assistant", "content": "ok"}]}
    prompt = scan_prompt(ANTHROPIC.layout(body))
    sidecars = [Sidecar(0, b"d" * 16, orjson.dumps(old_message))]
    assert divergence_excerpts("messages", 1, prompt, body, None, sidecars) == (
        "messages[0].content[0].text",
        "Fix the bug in parser.py line 12 please",
        "Fix the bug in parser.py line 13 please",
    )
    # Without the previous text only this side is shown; a system block needs the kept head.
    assert divergence_excerpts("messages", 1, prompt, body, None, []) == (
        "messages[0]",
        None,
        orjson.dumps(new_message).decode()[:80] + "...",
    )
    head = (orjson.dumps("t"),)
    assert divergence_excerpts("system", 0, prompt, body, head, []) == ("system", "t", "s")


async def _raw_exchange(url: str, request: bytes) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
    body = await reader.readexactly(length)
    writer.close()
    return int(head.split(b" ")[1]), body


async def test_a_credential_that_is_not_utf8_is_a_tenant_of_its_own(admin_proxy) -> None:
    proxy = await admin_proxy()
    key = b"sk-ant-\xe9\xff-ui"
    body = orjson.dumps(
        {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "hello there"}]}
    )
    head = b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nx-api-key: " + key
    head += b"\r\nanthropic-version: 2023-06-01\r\nx-session-id: latin\r\ncontent-type: application/json"
    status, _ = await _raw_exchange(proxy.url, head + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    assert status == 200
    registry = proxy.services.metrics.registry
    for stage in ("session", "usage", "measure"):
        assert registry.get_sample_value("promptcache_stage_errors_total", {"stage": stage}) in (None, 0.0)
    listing = b"GET /debug/sessions HTTP/1.1\r\nHost: proxy\r\nx-api-key: " + key + b"\r\n\r\n"
    status, answer = await _raw_exchange(proxy.admin_url, listing)
    assert status == 200
    assert [s["session_id"] for s in orjson.loads(answer)["sessions"]] == [explicit_id("latin")]
