"""Logs: the access line carries status, tokens, cost, cause and session (never content or
keys), in text or JSON; `configure_logging` takes any-case levels."""

from __future__ import annotations

import io
import logging

import aiohttp
import orjson
import pytest

from proxy.logs import ACCESS_LOGGER, JSONFormatter, access_text, configure_logging
from tests.fakes.upstream import FakeUpstream

KEY = "sk-ant-secret-key-for-the-log-scan"
SECRET_TEXT = "the-prompt-text-must-not-be-logged"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "x-session-id": "conv-7"}
BODY = {
    "model": "claude-sonnet-4-6",
    "max_tokens": 16,
    "messages": [{"role": "user", "content": SECRET_TEXT}],
}
USAGE = {
    "input_tokens": 1000,
    "cache_read_input_tokens": 20000,
    "cache_creation_input_tokens": 3000,
    "cache_creation": {"ephemeral_5m_input_tokens": 3000, "ephemeral_1h_input_tokens": 0},
    "output_tokens": 100,
}
# claude-sonnet-4 list prices per million: input 3, 5m write 3.75, read 0.30, output 15.
COST = (1000 * 3 + 3000 * 3.75 + 20000 * 0.30 + 100 * 15) / 1e6


async def test_access_line_fields_text_and_json(
    fake_upstream: FakeUpstream, make_proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    logging.getLogger(ACCESS_LOGGER).addHandler(handler)
    try:
        fake_upstream.anthropic_script = [{"id": "msg_1", "usage": USAGE}]
        proxy = await make_proxy(upstream=fake_upstream.url)
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{proxy.url}/v1/messages?beta=true", json=BODY, headers=HEADERS) as r:
                assert r.status == 200
                await r.read()
    finally:
        logging.getLogger(ACCESS_LOGGER).removeHandler(handler)
    [record] = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    fields = record.access
    session = fields["session"]
    assert isinstance(session, str) and session
    assert {k: v for k, v in fields.items() if k not in ("ms", "session")} == {
        "provider": "anthropic",
        "method": "POST",
        "path": "/v1/messages",
        "status": 200,
        "read": 20000,
        "written": 3000,
        "uncached": 1000,
        "output": 100,
        "cost_usd": round(COST, 6),
        "cause": "first_request",
    }
    assert record.getMessage() == (
        f"anthropic POST /v1/messages -> 200 in {fields['ms']} ms read=20000 written=3000 uncached=1000 "
        f"output=100 cost_usd={round(COST, 6)} cause=first_request session={session}"
    )
    [line] = stream.getvalue().splitlines()
    data = orjson.loads(line)
    assert data["level"] == "INFO" and data["logger"] == ACCESS_LOGGER
    assert data["message"] == record.getMessage()
    assert {k: data[k] for k in fields} == fields
    everything = stream.getvalue() + "".join(r.getMessage() + str(r.__dict__) for r in caplog.records)
    assert KEY not in everything and SECRET_TEXT not in everything and "beta=true" not in everything


def test_access_text_omits_what_a_request_did_not_have() -> None:
    fields = {"provider": "openai", "method": "GET", "path": "/v1/models", "status": 502, "ms": 1.5}
    assert access_text({**fields, "session": None, "read": None}) == "openai GET /v1/models -> 502 in 1.5 ms"


def test_configure_logging_any_case_and_json() -> None:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        configure_logging("debug", "json")
        assert root.level == logging.DEBUG
        [handler] = root.handlers
        assert isinstance(handler.formatter, JSONFormatter)
        configure_logging("Warning", "text")
        assert root.level == logging.WARNING
        assert not isinstance(root.handlers[0].formatter, JSONFormatter)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.setLevel(saved[0])
        for handler in saved[1]:
            root.addHandler(handler)


async def test_serve_lowercase_level_json_lines_and_banner(tmp_path) -> None:
    """`promptcache serve` with `log_level: debug` (lower case) and `log_format: json`: the banner
    names the simulator, every stderr line is JSON, and the access line carries the fields."""
    import asyncio
    import os
    import sys

    env = {
        # the suite's own PROMPTCACHE_* variables (e.g. CLIENTS_DIR) are not settings
        **{k: v for k, v in os.environ.items() if not k.startswith("PROMPTCACHE_")},
        "PROMPTCACHE_LOG_LEVEL": "debug",
        "PROMPTCACHE_LOG_FORMAT": "json",
        "XDG_STATE_HOME": str(tmp_path),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--port",
        "0",
        "--upstream",
        "sim",
        "--store",
        "memory://",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        banner = []
        while not banner or not banner[-1].startswith("  state dir:"):
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            assert line, "serve exited before its banner"
            banner.append(line.rstrip("\n"))
        url = banner[0].split(" listening on ")[1].split(" ")[0]
        assert banner[2].startswith("  upstream anthropic: sim http://127.0.0.1:")
        assert banner[-2] == "  store: memory://"
        headers = {**HEADERS, "x-session-id": "serve-json"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/v1/messages", json=BODY, headers=headers) as r:
                assert r.status == 200
                await r.read()
        while True:
            raw = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert raw, "serve exited before logging the request"
            data = orjson.loads(raw)  # every line is one JSON object
            assert KEY.encode() not in raw and SECRET_TEXT.encode() not in raw
            if data["logger"] == ACCESS_LOGGER:
                break
        assert (data["status"], data["path"], data["cause"], data["level"]) == (
            200,
            "/v1/messages",
            "first_request",
            "INFO",
        )
        assert data["uncached"] + data["written"] + data["read"] > 0 and data["cost_usd"] > 0
    finally:
        proc.terminate()
        await proc.wait()
