"""Requests aiohttp cannot parse: answered 400 in the provider's shape, counted, and never
logged with their raw bytes (aiohttp's own error line quotes the head, credential included).

No sleeps: each test waits on the socket (a response, then EOF) under a generous outer bound."""

from __future__ import annotations

import asyncio
import io
import logging
import signal
from typing import Any

import orjson
import pytest

from proxy.logs import configure_logging, redact
from tests.hostile.conftest import host_port, read_response

OUTER = 20  # seconds
KEY = "sk-ant-FAKEKEY-zzq123456789"


async def _send(url: str, head: bytes) -> tuple[int, Any]:
    host, port = host_port(url)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head)
        async with asyncio.timeout(OUTER):
            response = await read_response(reader)
            assert await reader.read() == b""
    finally:
        writer.close()
    return response.status, orjson.loads(response.body)


@pytest.mark.parametrize(
    ("path", "header", "shape"),
    [
        ("/v1/messages", f"x-api-key: {KEY}\x01", "anthropic"),
        ("/v1/messages", f"x-api-key {KEY}", "anthropic"),
        ("/v1/chat/completions", f"Authorization: Bearer {KEY}\x00x", "openai"),
    ],
)
async def test_a_malformed_head_is_answered_in_the_provider_shape_and_never_logged(
    make_proxy: Any, caplog: pytest.LogCaptureFixture, path: str, header: str, shape: str
) -> None:
    proxy = await make_proxy(upstream="http://127.0.0.1:9")
    head = f"POST {path} HTTP/1.1\r\nHost: proxy\r\n{header}\r\nContent-Length: 2\r\n\r\n{{}}".encode("latin-1")
    with caplog.at_level(logging.DEBUG):
        status, body = await _send(proxy.url, head)
    assert status == 400
    if shape == "anthropic":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith("malformed HTTP request (")
    else:
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith("malformed HTTP request (")
    logged = "\n".join(r.getMessage() + str(r.exc_info or "") + (r.exc_text or "") for r in caplog.records)
    assert "FAKEKEY" not in logged
    assert [r.levelname for r in caplog.records if r.name == "aiohttp.server"] == ["WARNING"]
    assert proxy.sample("promptcache_connections_closed_total", reason="bad_request") == 1


def test_redact_replaces_credential_values() -> None:
    text = f"b'x-api-key: {KEY}\\x01' b'Authorization: Bearer {KEY}\\x00x' {{'api-key': '{KEY}'}} cookie=a1"
    assert redact(text) == (
        "b'x-api-key: [redacted]\\x01' b'Authorization: [redacted]\\x00x' {'api-key': '[redacted]'} cookie=[redacted]"
    )
    assert redact("model: claude, tokens: 12") == "model: claude, tokens: 12"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_log_handler_redacts_messages_and_tracebacks(log_format: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("info", log_format)
        log = logging.getLogger("some.library")
        log.warning("head %r", f"x-api-key: {KEY}".encode())
        try:
            raise ValueError(f"bad header b'Authorization: Bearer {KEY}'")
        except ValueError:
            log.exception("error handling request")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    out = stream.getvalue()
    assert "FAKEKEY" not in out
    # the message, the traceback's source line, the exception's text
    assert out.count("[redacted]") == 3
    assert "ValueError: bad header b'Authorization: [redacted]'" in out



def test_the_openai_credential_shape_is_one_rule() -> None:
    from multidict import CIMultiDict

    from proxy.providers import is_openai_credential_shape

    assert is_openai_credential_shape({"authorization"}) is True
    assert is_openai_credential_shape({"authorization", "x-api-key"}) is False
    assert is_openai_credential_shape({"authorization", "anthropic-version"}) is False
    assert is_openai_credential_shape(set()) is False
    assert is_openai_credential_shape(CIMultiDict({"Authorization": "Bearer k"})) is True


async def test_empty_bodies_on_one_connection_are_refused_and_the_loop_goes_on(make_proxy: Any) -> None:
    """Attack pass (session 12): a POST with `Content-Length: 0` hung the whole process on a
    kept-alive connection: aiohttp's empty payload answers every `readchunk()` with the end of
    an HTTP chunk, and the body reader waited for the next one on the event loop for ever.
    The empty body goes on as sent (fail open), and the simulated API refuses it."""
    proxy = await make_proxy(upstream="sim")
    host, port = host_port(proxy.url)

    def stuck(signum: int, frame: Any) -> None:  # the loop never yields: only a signal gets in
        raise TimeoutError("the event loop did not come back")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(OUTER)
    try:
        await _empty_bodies(host, port)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


async def _empty_bodies(host: str, port: int) -> None:
    head = (
        f"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nx-api-key: {KEY}\r\nanthropic-version: 2023-06-01\r\n"
        "content-type: application/json\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        async with asyncio.timeout(OUTER):
            statuses = []
            for _ in range(3):
                writer.write(head)
                response = await read_response(reader)
                statuses.append((response.status, orjson.loads(response.body)["error"]["type"]))
            assert statuses == [(400, "invalid_request_error")] * 3
            health_reader, health_writer = await asyncio.open_connection(host, port)
            health_writer.write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n")
            assert (await read_response(health_reader)).status == 200
            health_writer.close()
    finally:
        writer.close()
