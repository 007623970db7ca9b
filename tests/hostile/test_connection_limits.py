"""Connection limits (issue 11, item 4) over real loopback sockets: idle and half-sent
connections are closed, a stalled head or body is answered 408, an oversized head 431, the
connection over `max_connections` 503, each in the provider's error shape and counted in
`promptcache_connections_closed_total{reason}`.

No sleeps: each test waits on the socket (a response, or EOF) under a generous outer bound."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from tests.hostile.conftest import host_port, read_response

CLOSED = "promptcache_connections_closed_total"
OUTER = 20  # seconds: generous bound on anything the server does in a fraction of that
LINGERING = 10.0  # seconds: aiohttp's lingering close (`RequestHandler`'s `lingering_time`)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closes the connection (EOF) within `OUTER` seconds."""
    async with asyncio.timeout(OUTER):
        return await reader.read() == b""


async def response_then_eof(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], Any]:
    """The one response the server sends, and proof that it then closed the connection."""
    async with asyncio.timeout(OUTER):
        response = await read_response(reader)
        assert await reader.read() == b""
    return response.status, response.headers, orjson.loads(response.body)


async def test_idle_and_half_sent_connections_are_closed(make_proxy: Any) -> None:
    proxy = await make_proxy(upstream="http://127.0.0.1:9", client_idle_timeout=0.5)
    host, port = host_port(proxy.url)
    silent = await asyncio.open_connection(host, port)
    half = await asyncio.open_connection(host, port)
    half[1].write(b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nx-api-key: k\r\n")
    idle = await asyncio.open_connection(host, port)
    idle[1].write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
    assert (await read_response(idle[0])).status == 200
    try:
        assert await closed_by_server(silent[0])
        assert await closed_by_server(half[0])
        assert await closed_by_server(idle[0])
    finally:
        for _, writer in (silent, half, idle):
            writer.close()
    assert proxy.sample(CLOSED, reason="idle") == 3


async def test_half_sent_headers_get_408_in_the_provider_shape(make_proxy: Any) -> None:
    proxy = await make_proxy(upstream="http://127.0.0.1:9", client_header_timeout=0.3)
    host, port = host_port(proxy.url)
    anthropic = await asyncio.open_connection(host, port)
    anthropic[1].write(b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nx-api-key: k\r\n")
    openai = await asyncio.open_connection(host, port)
    openai[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer k\r\n")
    no_line = await asyncio.open_connection(host, port)
    no_line[1].write(b"POST /v1/chat/compl")
    try:
        status, headers, body = await response_then_eof(anthropic[0])
        assert (status, headers["connection"], headers["content-type"]) == (408, "close", "application/json")
        assert body == {
            "type": "error",
            "error": {"type": "timeout_error", "message": "request headers not received within 0.3 s"},
        }
        status, _, body = await response_then_eof(openai[0])
        assert status == 408
        assert body == {
            "error": {
                "message": "request headers not received within 0.3 s",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        status, _, body = await response_then_eof(no_line[0])  # no path yet: the Anthropic shape
        assert (status, body["type"], body["error"]["type"]) == (408, "error", "timeout_error")
    finally:
        for _, writer in (anthropic, openai, no_line):
            writer.close()
    assert proxy.sample(CLOSED, reason="header_timeout") == 3
    assert proxy.sample(CLOSED, reason="idle") == 0


async def test_half_sent_body_gets_408_and_the_upstream_sees_nothing(make_proxy: Any, fake_upstream: Any) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, client_body_timeout=0.3)
    host, port = host_port(proxy.url)
    pipeline = await asyncio.open_connection(host, port)
    pipeline[1].write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer k\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"model": "gpt-5", "mess'
    )
    passthrough = await asyncio.open_connection(host, port)
    passthrough[1].write(
        b"POST /v1/files HTTP/1.1\r\nHost: proxy\r\nx-api-key: k\r\nanthropic-version: 2023-06-01\r\n"
        b"Content-Length: 100\r\n\r\n" + b"partial"
    )
    try:
        status, headers, body = await response_then_eof(pipeline[0])
        assert (status, headers["connection"]) == (408, "close")
        assert body == {
            "error": {
                "message": "no request body byte received for 0.3 s",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        status, _, body = await response_then_eof(passthrough[0])
        assert status == 408
        assert body == {
            "type": "error",
            "error": {"type": "timeout_error", "message": "no request body byte received for 0.3 s"},
        }
    finally:
        for _, writer in (pipeline, passthrough):
            writer.close()
    assert proxy.sample(CLOSED, reason="body_timeout") == 2
    assert [r.path for r in fake_upstream.received if r.path == "/v1/chat/completions"] == []
    assert proxy.sample("promptcache_requests_total", provider="openai", outcome="client_error") == 1
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="client_error") == 1


async def test_a_body_that_keeps_arriving_is_not_timed_out(make_proxy: Any, fake_upstream: Any) -> None:
    """A body written in many small parts is served (the body timer re-arms on every read)."""
    proxy = await make_proxy(upstream=fake_upstream.url, client_body_timeout=5)
    host, port = host_port(proxy.url)
    reader, writer = await asyncio.open_connection(host, port)
    body = orjson.dumps({"model": "claude-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    writer.write(
        b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nx-api-key: k\r\nanthropic-version: 2023-06-01\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    for i in range(0, len(body), 7):
        writer.write(body[i : i + 7])
        await writer.drain()
    try:
        async with asyncio.timeout(OUTER):
            response = await read_response(reader)
    finally:
        writer.close()
    assert response.status == 200
    assert proxy.sample(CLOSED, reason="body_timeout") == 0


async def test_oversized_headers_get_431_with_the_exact_body(make_proxy: Any) -> None:
    proxy = await make_proxy(upstream="http://127.0.0.1:9", max_header_bytes=2048)
    host, port = host_port(proxy.url)
    in_one = await asyncio.open_connection(host, port)  # the whole head in one write
    in_one[1].write(b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nx-big: " + b"a" * 3000 + b"\r\n\r\n{}")
    many = await asyncio.open_connection(host, port)  # many small headers, none too long alone
    many[1].write(
        b"POST /v1/responses HTTP/1.1\r\nAuthorization: Bearer k\r\n"
        + b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 90) for i in range(30))
    )
    try:
        status, headers, body = await response_then_eof(in_one[0])
        assert (status, headers["connection"]) == (431, "close")
        assert body == {
            "type": "error",
            "error": {"type": "request_too_large", "message": "request headers exceed the limit of 2048 bytes"},
        }
        status, _, body = await response_then_eof(many[0])
        assert status == 431
        assert body == {
            "error": {
                "message": "request headers exceed the limit of 2048 bytes",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    finally:
        for _, writer in (in_one, many):
            writer.close()
    assert proxy.sample(CLOSED, reason="header_too_large") == 2


async def test_headers_just_under_the_limit_pass(make_proxy: Any) -> None:
    """A 6 KB header line over aiohttp's 8190-byte default field limit passes when under ours."""
    proxy = await make_proxy(upstream="http://127.0.0.1:9", max_header_bytes=16384)
    reader, writer = await asyncio.open_connection(*host_port(proxy.url))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\nx-big: " + b"a" * 10000 + b"\r\n\r\n")
    try:
        async with asyncio.timeout(OUTER):
            assert (await read_response(reader)).status == 200
    finally:
        writer.close()
    assert proxy.sample(CLOSED, reason="header_too_large") == 0


async def test_connection_over_max_connections_gets_503_and_is_closed(make_proxy: Any) -> None:
    proxy = await make_proxy(upstream="http://127.0.0.1:9", max_connections=2, max_connections_per_client=2)
    host, port = host_port(proxy.url)
    first = await asyncio.open_connection(host, port)
    second = await asyncio.open_connection(host, port)
    for reader, writer in (first, second):  # both accepted and served: the server holds them
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
        assert (await read_response(reader)).status == 200
    third = await asyncio.open_connection(host, port)
    third[1].write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer k\r\nContent-Length: 2\r\n\r\n{}"
    )
    try:
        status, headers, body = await response_then_eof(third[0])
        assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
        assert body == {
            "error": {
                "message": "promptcache has 2 connections open (max_connections); retry",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }
        # the first two still work; once one has closed, a new connection is served again
        first[1].write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
        assert (await read_response(first[0])).status == 200
        second[1].write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n")
        assert (await read_response(second[0])).status == 200
        assert await closed_by_server(second[0])
        fourth = await asyncio.open_connection(host, port)
        fourth[1].write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
        assert (await read_response(fourth[0])).status == 200
        fourth[1].close()
    finally:
        for _, writer in (first, second, third):
            writer.close()
    assert proxy.sample(CLOSED, reason="too_many_connections") == 1


def test_defaults() -> None:
    from proxy.settings import Settings

    s = Settings()
    assert (s.client_header_timeout, s.client_body_timeout, s.max_header_bytes, s.max_connections) == (
        30.0,
        60.0,
        32768,
        512,
    )


HALF_SENT = b"POST /v1/messages HTTP/1.1\r\n"  # a request line, then nothing


async def test_one_client_address_cannot_take_every_connection(make_proxy: Any) -> None:
    """`max_connections_per_client`: a third connection from 127.0.0.1 while two of its
    half-sent requests are open is refused (503 in the path's shape); a probe on such a
    connection is served; one that sends nothing is closed after `LINGER_SECONDS`."""
    proxy = await make_proxy(upstream="http://127.0.0.1:9", max_connections=16, max_connections_per_client=2)
    host, port = host_port(proxy.url)
    held = [await asyncio.open_connection(host, port) for _ in range(2)]
    try:
        for _, writer in held:
            writer.write(HALF_SENT)
        over = await asyncio.open_connection(host, port)
        over[1].write(b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nx-api-key: k\r\nContent-Length: 2\r\n\r\n{}")
        status, headers, body = await response_then_eof(over[0])
        assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
        assert body == {
            "type": "error",
            "error": {
                "type": "overloaded_error",
                "message": "promptcache has 2 connections open from this client address "
                "(max_connections_per_client); retry",
            },
        }
        probe = await asyncio.open_connection(host, port)
        probe[1].write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
        status, headers, body = await response_then_eof(probe[0])
        assert (status, headers["connection"], body) == (200, "close", {"status": "ok"})
        silent = await asyncio.open_connection(host, port)
        assert await closed_by_server(silent[0])
        for _, writer in (over, probe, silent):
            writer.close()
    finally:
        for _, writer in held:
            writer.close()
    assert proxy.sample(CLOSED, reason="too_many_client_connections") == 3
    assert proxy.sample(CLOSED, reason="too_many_connections") == 0


async def test_probes_are_served_over_max_connections(make_proxy: Any) -> None:
    """A flood holding every connection slot (each sending only a request line) does not
    lock out `/healthz`, `/readyz` or `/metrics`; other paths still get the 503."""
    proxy = await make_proxy(upstream="http://127.0.0.1:9", max_connections=3, max_connections_per_client=3)
    host, port = host_port(proxy.url)
    held = [await asyncio.open_connection(host, port) for _ in range(3)]
    try:
        for _, writer in held:
            writer.write(HALF_SENT)
        statuses = {}
        for path in ("/healthz", "/readyz", "/metrics", "/v1/models"):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: proxy\r\n\r\n".encode())
            async with asyncio.timeout(OUTER):
                response = await read_response(reader)
                assert await reader.read() == b""
            statuses[path] = (response.status, response.headers["connection"])
            writer.close()
    finally:
        for _, writer in held:
            writer.close()
    assert statuses == {
        "/healthz": (200, "close"),
        "/readyz": (200, "close"),
        "/metrics": (200, "close"),
        "/v1/models": (503, "close"),
    }
    assert proxy.sample(CLOSED, reason="too_many_connections") == 4


def test_client_cap_default_is_a_quarter_of_max_connections() -> None:
    from proxy.connections import client_connection_cap
    from proxy.settings import Settings

    assert client_connection_cap(Settings()) == 128
    assert client_connection_cap(Settings(max_connections=2)) == 1
    assert client_connection_cap(Settings(max_connections=512, max_connections_per_client=300)) == 300


def many_headers(path: bytes, credential: bytes, n: int, body: bytes = b"") -> bytes:
    """A request head with `n` header lines in all (credential, Host, Content-Length among them)."""
    fixed = [b"Host: proxy", credential, b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    extra = [b"x-h%d: v" % i for i in range(n - len(fixed))]
    return b"POST " + path + b" HTTP/1.1\r\n" + b"\r\n".join(fixed + extra) + b"\r\n\r\n" + body


async def test_more_headers_than_max_header_count_get_431_in_the_provider_shape(
    make_proxy: Any, fake_upstream: Any
) -> None:
    """129 header lines (aiohttp's parser would answer its own plain 400): 431 in the shape of
    the path's provider, closed and counted; 128 pass."""
    proxy = await make_proxy(upstream=fake_upstream.url)
    host, port = host_port(proxy.url)
    body = orjson.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]})
    over = await asyncio.open_connection(host, port)
    over[1].write(many_headers(b"/v1/chat/completions", b"Authorization: Bearer k", 129, body))
    anthropic = await asyncio.open_connection(host, port)
    anthropic[1].write(many_headers(b"/v1/messages", b"x-api-key: k", 200, b"{}"))
    at = await asyncio.open_connection(host, port)
    at[1].write(many_headers(b"/v1/chat/completions", b"Authorization: Bearer k", 128, body))
    try:
        status, headers, answer = await response_then_eof(over[0])
        assert (status, headers["connection"]) == (431, "close")
        assert answer == {
            "error": {
                "message": "request has more than 128 header lines (max_header_count)",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        status, _, answer = await response_then_eof(anthropic[0])
        assert (status, answer["error"]["type"]) == (431, "request_too_large")
        async with asyncio.timeout(OUTER):
            assert (await read_response(at[0])).status == 200
    finally:
        for _, writer in (over, anthropic, at):
            writer.close()
    assert proxy.sample(CLOSED, reason="too_many_headers") == 2
    assert proxy.sample(CLOSED, reason="bad_request") == 0
    assert [r.path for r in fake_upstream.received] == ["/v1/chat/completions"]  # the 128-header one


async def test_the_admin_listener_has_the_same_limits(make_proxy: Any, fake_upstream: Any) -> None:
    """The admin listener (`admin_port`): an idle or half-sent connection is closed, a stalled
    head answered 408, an oversized one 431, and the connection over `max_connections` 503."""
    from proxy.app import start_admin

    proxy = await make_proxy(
        upstream=fake_upstream.url,
        admin_port=0,
        client_idle_timeout=0.5,
        client_header_timeout=0.3,
        max_header_bytes=2048,
        max_connections=3,
        max_connections_per_client=3,
    )
    admin, admin_url = await start_admin(proxy.runner.app, "127.0.0.1", 0)
    host, port = host_port(admin_url)
    try:
        idle = await asyncio.open_connection(host, port)
        idle[1].write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
        assert (await read_response(idle[0])).status == 200
        assert await closed_by_server(idle[0])
        idle[1].close()
        half = await asyncio.open_connection(host, port)
        half[1].write(b"GET /debug/sessions HTTP/1.1\r\nHost: proxy\r\nx-api-key: k\r\n")
        status, _, body = await response_then_eof(half[0])
        assert (status, body["error"]["type"]) == (408, "timeout_error")
        half[1].close()
        big = await asyncio.open_connection(host, port)
        big[1].write(b"GET /metrics HTTP/1.1\r\nHost: proxy\r\nx-big: " + b"a" * 3000 + b"\r\n\r\n")
        status, _, body = await response_then_eof(big[0])
        assert status == 431
        big[1].close()
        held = [await asyncio.open_connection(host, port) for _ in range(3)]
        for _, writer in held:  # each holds a slot with a finished request (served, kept alive)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
        for reader, _ in held:
            assert (await read_response(reader)).status == 200
        over = await asyncio.open_connection(host, port)
        over[1].write(b"GET /debug/sessions HTTP/1.1\r\nHost: proxy\r\n\r\n")
        status, headers, body = await response_then_eof(over[0])
        assert (status, headers["retry-after"]) == (503, "1")
        over[1].close()
        for _, writer in held:
            writer.close()
    finally:
        await admin.cleanup()
    assert proxy.sample(CLOSED, reason="idle") == 1
    assert proxy.sample(CLOSED, reason="header_timeout") == 1
    assert proxy.sample(CLOSED, reason="header_too_large") == 1
    assert proxy.sample(CLOSED, reason="too_many_connections") == 1


async def test_a_declared_length_over_max_body_bytes_is_413_before_any_body_byte(
    make_proxy: Any, fake_upstream: Any
) -> None:
    """Leftover of session 9's attack pass: a pipeline route whose `Content-Length` is over
    `max_body_bytes` was read until the limit or the body timeout (a client that sent the head
    and waited got a 408 seconds later, or nothing). Now the head alone gets the 413 in the
    provider's shape (the text of a read that meets the bound), `Connection: close`, and no
    `100 Continue` when the client asked for one. A pass-through path with the same length is
    not refused (uploads stay unbounded)."""
    proxy = await make_proxy(upstream=fake_upstream.url, max_body_bytes=4096, client_body_timeout=5)
    host, port = host_port(proxy.url)
    over = b"Content-Type: application/json\r\nContent-Length: 4097\r\n"
    anthropic = await asyncio.open_connection(host, port)
    anthropic[1].write(b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nx-api-key: k\r\n" + over + b"\r\n")
    openai = await asyncio.open_connection(host, port)
    openai[1].write(
        b"POST /v1/responses HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer k\r\nExpect: 100-continue\r\n"
        + over
        + b"\r\n"
    )
    huge = await asyncio.open_connection(host, port)
    huge[1].write(
        b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer k\r\n"
        b"Content-Length: 99999999999999\r\n\r\n{"
    )
    at_limit = await asyncio.open_connection(host, port)
    at_limit[1].write(
        b"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nx-api-key: k\r\nExpect: 100-continue\r\n"
        b"Content-Length: 4096\r\n\r\n"
    )
    try:
        async with asyncio.timeout(OUTER):
            response = await read_response(anthropic[0])
            assert (response.status, response.headers["connection"]) == (413, "close")
            assert response.json() == {
                "type": "error",
                "error": {"type": "request_too_large", "message": "request body exceeds the limit of 4096 bytes"},
            }
            response = await read_response(openai[0])  # the first response line: no 100 Continue
            assert (response.status, response.headers["connection"]) == (413, "close")
            assert response.json() == {
                "error": {
                    "message": "request body exceeds the limit of 4096 bytes",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
            response = await read_response(huge[0])
            assert response.status == 413
        # the client that asked for 100 Continue sends no body: its connection closes at once,
        # not after aiohttp's lingering close (10 s); the others' bodies may be on their way
        async with asyncio.timeout(LINGERING / 2):
            assert await openai[0].read() == b""
        async with asyncio.timeout(OUTER):
            # at the limit the client is told to go on (and then served as usual)
            assert await at_limit[0].readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    finally:
        for _, writer in (anthropic, openai, huge, at_limit):
            writer.close()
    assert proxy.sample("promptcache_request_body_too_large_total", provider="anthropic") == 1
    assert proxy.sample("promptcache_request_body_too_large_total", provider="openai") == 2
    assert proxy.sample("promptcache_requests_total", provider="openai", outcome="client_error") == 2
    assert proxy.sample(CLOSED, reason="body_timeout") == 0
    assert fake_upstream.received == []
