"""A key placed in the URL path (reviewer's gap 2): a client whose base URL carries its key
(`http://proxy/sk-ant-.../v1/messages`), or a gateway key as a path segment, never reaches a log
line: the access line's path has the segment `[redacted]`, text and JSON, before any handler
sees it. Real requests through the proxy in front of the simulator; the log captured from the
handler `serve` installs (its redaction filter included) and from the raw records."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from proxy.logs import ACCESS_LOGGER, JSONFormatter, RedactCredentials
from proxy.providers import redact_path
from tests.sessions.conftest import Proxy, Sim

ANTHROPIC_KEY = "sk-ant-api03-" + "Q" * 40
OPENAI_KEY = "sk-proj-" + "w1" * 24
GATEWAY_KEY = "gw-7f3a9c2e1b"  # no provider shape: the request's own credential
BODY = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, list[logging.LogRecord]]]:
    """The JSON log text (as `serve --log-format json` writes it) and every raw record."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    handler.addFilter(RedactCredentials())
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    root = logging.getLogger()
    old_level = root.level
    root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    root.addHandler(keep)
    try:
        yield stream, records
    finally:
        root.removeHandler(handler)
        root.removeHandler(keep)
        root.setLevel(old_level)


async def test_credential_segments_are_redacted_in_the_access_log(
    start_proxy: Any, sim: Sim, captured: tuple[io.StringIO, list[logging.LogRecord]]
) -> None:
    stream, records = captured
    proxy: Proxy = await start_proxy(upstream=sim.url)
    anthropic = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/{ANTHROPIC_KEY}/v1/messages", json=BODY, headers=anthropic) as r:
            await r.read()
        async with http.get(f"{proxy.url}/v1/models/{OPENAI_KEY}", headers={"authorization": "Bearer x"}) as r:
            await r.read()
        gateway = {"x-api-key": GATEWAY_KEY, "anthropic-version": "2023-06-01"}
        async with http.post(f"{proxy.url}/v1/messages/{GATEWAY_KEY}/x", json=BODY, headers=gateway) as r:
            await r.read()
        async with http.post(f"{proxy.url}/v1/messages", json=BODY, headers=anthropic) as r:
            assert r.status == 200
        async with http.get(f"{proxy.url}/metrics") as r:
            metrics = await r.text()
    await proxy.stop()
    access = [r for r in records if r.name == ACCESS_LOGGER]
    assert [r.access["path"] for r in access] == [  # type: ignore[attr-defined]
        "/[redacted]/v1/messages",
        "/v1/models/[redacted]",
        "/v1/messages/[redacted]/x",
        "/v1/messages",
    ]
    assert access[0].getMessage().startswith("anthropic POST /[redacted]/v1/messages -> ")
    raw = "".join(r.getMessage() + str(r.__dict__) for r in records)
    for key in (ANTHROPIC_KEY, OPENAI_KEY, GATEWAY_KEY):
        assert key not in raw, key
        assert key not in stream.getvalue(), key
        assert key not in metrics, key
    assert '"path":"/[redacted]/v1/messages"' in stream.getvalue()


def test_the_log_filter_redacts_a_key_shape_a_library_quotes() -> None:
    record = logging.LogRecord(
        "aiohttp.server", logging.ERROR, __file__, 1, "bad request %s", (f"GET /{ANTHROPIC_KEY} HTTP/1.1",), None
    )
    RedactCredentials().filter(record)
    assert record.getMessage() == "bad request GET /[redacted] HTTP/1.1"


def test_a_key_split_over_segments_is_redacted_whole() -> None:
    """Review finding (session 4): a key with a `%2F` (decoded to `/`) or split by `/` was logged
    from its second segment on."""
    key = "sk-ant-api03-ABCDEFGH/1234567890abcdefXYZ"
    assert redact_path(f"/{key}/v1/messages") == "/[redacted]/[redacted]/v1/messages"
    assert redact_path("/sk-ant-api/03-Zq9x7Lw2Pv/v1/messages") == "/[redacted]/[redacted]/v1/messages"
    assert redact_path("/v1/messages/count_tokens") == "/v1/messages/count_tokens"
    assert redact_path("/v1/disk-usage/tasks-1") == "/v1/disk-usage/tasks-1"
    assert redact_path("/v1/files/file-abc123/content", "tok-12345678") == "/v1/files/file-abc123/content"
    assert redact_path("/x/tok-12345678/v1/chat/completions", "tok-12345678") == "/x/[redacted]/v1/chat/completions"
