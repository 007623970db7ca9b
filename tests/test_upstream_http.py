"""The lean upstream HTTP/1.1 client (`proxy/upstream_http.py`) against real loopback servers
that answer with exact bytes: framing, reuse, failures as aiohttp's exception types."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from proxy.upstream_http import HIGH_WATER, UpstreamPool, UpstreamResponse

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Upstream:
    """A loopback server; `answer(reader, writer, connection_index)` runs per connection.
    `requests` holds each request head and body read by `read_request`, per connection."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[tuple[int, bytes]] = []
        self.server: asyncio.Server | None = None
        self.hold = asyncio.Event()

    async def __aenter__(self) -> Upstream:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            index = self.connections
            self.connections += 1
            try:
                await self.answer(reader, writer, index)
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.hold.set()
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def read_request(self, reader: asyncio.StreamReader, index: int) -> bool:
        """One request (head and Content-Length body) into `requests`; False at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
        self.requests.append((index, head + await reader.readexactly(length)))
        return True


async def chunks_until(failure: type[BaseException], response: UpstreamResponse) -> list[bytes]:
    """The body chunks read before reading raised `failure` (it must raise it)."""
    got = []
    with pytest.raises(failure):
        async for chunk in response.content.iter_any():
            got.append(chunk)
    return got


async def body_of(response: UpstreamResponse) -> bytes:
    return b"".join([chunk async for chunk in response.content.iter_any()])


def keep_alive(*answers: bytes) -> Callable[[Upstream], Answer]:
    """Answer each request on a connection with the next of `answers` (cycled)."""

    def build(up: Upstream) -> Answer:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
            n = 0
            while await up.read_request(reader, index):
                writer.write(answers[n % len(answers)])
                await writer.drain()
                n += 1

        return answer

    return build


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    lean = UpstreamPool(connect_timeout=5.0, read_timeout=5.0)
    yield lean
    lean.close()


@contextlib.asynccontextmanager
async def serving(build: Callable[[Upstream], Answer]) -> AsyncIterator[Upstream]:
    """A loopback upstream answering with `build(upstream)`, closed on exit."""
    up = Upstream(lambda r, w, i: asyncio.sleep(0))
    up.answer = build(up)
    async with up:
        yield up


def once(answer: bytes, hold: bool = False) -> Callable[[Upstream], Answer]:
    """Read one request, answer `answer`, then close (or, with `hold`, keep the connection
    silent until the test ends)."""

    def build(up: Upstream) -> Answer:
        async def single(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
            await up.read_request(reader, index)
            writer.write(answer)
            await writer.drain()
            if hold:
                await up.hold.wait()

        return single

    return build


async def test_request_bytes_and_a_content_length_answer_on_one_kept_connection(pool: UpstreamPool) -> None:
    answer = b"HTTP/1.1 201 Made\r\nX-Twice: a\r\nx-twice: b\r\nContent-Length: 5\r\n\r\nhello"
    async with serving(keep_alive(answer)) as up:
        port = up.url.rsplit(":", 1)[1]
        seen = []
        for body in (b"abc", b"de"):
            response = await pool.request("POST", up.url + "/v1/messages?beta=true", [("x-api-key", "k")], body)
            seen.append((response.status, response.reason, list(response.headers.items()), await body_of(response)))
            response.release()
        assert seen == [(201, "Made", [("X-Twice", "a"), ("x-twice", "b"), ("Content-Length", "5")], b"hello")] * 2
        assert up.connections == 1
        assert up.requests == [
            (
                0,
                f"POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-api-key: k\r\n"
                f"Content-Length: 3\r\n\r\nabc".encode(),
            ),
            (
                0,
                f"POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-api-key: k\r\n"
                f"Content-Length: 2\r\n\r\nde".encode(),
            ),
        ]


async def test_chunked_answer_after_an_interim_100(pool: UpstreamPool) -> None:
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ndata\r\n3\r\n: x\r\n0\r\n\r\n"
    )
    async with serving(keep_alive(answer)) as up:
        for _ in range(2):
            response = await pool.request("POST", up.url + "/", [], b"{}")
            assert (response.status, await body_of(response)) == (200, b"data: x")
            response.release()
        assert up.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end",  # close-delimited
        b"HTTP/1.0 200 OK\r\nContent-Length: 13\r\n\r\nuntil the end",  # HTTP/1.0: no keep-alive
        b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\nuntil the end",
    ],
)
async def test_a_single_use_answer_is_read_whole_and_its_connection_not_reused(
    pool: UpstreamPool, answer: bytes
) -> None:
    async with serving(once(answer)) as up:
        for _ in range(2):
            response = await pool.request("POST", up.url + "/", [], b"{}")
            assert (response.status, await body_of(response)) == (200, b"until the end")
            response.release()
        assert up.connections == 2


async def test_a_body_cut_short_raises_payload_error(pool: UpstreamPool) -> None:
    async with serving(once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")) as up:
        response = await pool.request("POST", up.url + "/", [], b"{}")
        got = await chunks_until(aiohttp.ClientPayloadError, response)
        assert b"".join(got) == b"only ten b"
        response.close()


async def test_refused_connection_is_aiohttps_connector_error(pool: UpstreamPool) -> None:
    async with serving(keep_alive(b"")) as up:
        url = up.url
    await up.server.wait_closed()  # type: ignore[union-attr]
    with pytest.raises(aiohttp.ClientConnectorError):
        await pool.request("POST", url + "/", [], b"{}")


async def test_a_reused_connection_closed_unanswered_is_not_sent_again(pool: UpstreamPool) -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    def build(up: Upstream) -> Answer:
        async def racy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
            await up.read_request(reader, index)
            writer.write(ok)
            await writer.drain()
            await up.read_request(reader, index)  # the second request is read, then the connection ends

        return racy

    async with serving(build) as up:
        response = await pool.request("POST", up.url + "/", [], b"one")
        assert await body_of(response) == b"ok"
        response.release()
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await pool.request("POST", up.url + "/", [], b"two")
        assert [(index, raw[-3:]) for index, raw in up.requests] == [(0, b"one"), (0, b"two")]
        assert up.connections == 1


async def test_a_new_connection_closed_unanswered_is_not_retried(pool: UpstreamPool) -> None:
    def build(up: Upstream) -> Answer:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
            await up.read_request(reader, index)

        return silent

    async with serving(build) as up:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await pool.request("POST", up.url + "/", [], b"{}")
        assert (up.connections, len(up.requests)) == (1, 1)


async def test_a_header_with_a_line_break_is_refused_before_any_byte_is_sent(pool: UpstreamPool) -> None:
    async with serving(keep_alive(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) as up:
        with pytest.raises(aiohttp.InvalidURL):
            await pool.request("POST", up.url + "/", [("x-a", "1\r\nx-injected: 2")], b"{}")
        assert up.connections == 0


async def test_a_large_body_pauses_reading_until_the_client_takes_it(pool: UpstreamPool) -> None:
    size = 4 * HIGH_WATER
    payload = bytes(range(256)) * (size // 256)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + payload
    async with serving(keep_alive(answer)) as up:
        response = await pool.request("POST", up.url + "/", [], b"{}")
        connection = response._connection
        while not connection._paused and not connection.complete:  # the upstream writes on its own
            await connection.arrival()
        assert (connection._paused, connection.complete) == (True, False)
        assert await body_of(response) == payload
        response.release()
        assert up.connections == 1


async def test_an_upstream_silent_mid_body_times_out_as_a_socket_timeout() -> None:
    lean = UpstreamPool(connect_timeout=5.0, read_timeout=0.2)

    async with serving(once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", hold=True)) as up:
        response = await lean.request("POST", up.url + "/", [], b"{}")
        got = await chunks_until(aiohttp.SocketTimeoutError, response)
        assert got == [b"half"]
        response.close()
    lean.close()


async def test_a_client_query_cannot_add_a_header_or_a_request(pool: UpstreamPool) -> None:
    async with serving(keep_alive(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) as up:
        url = up.url + "/v1/messages?beta=true\r\nX-Injected: yes caf\u00e9"
        response = await pool.request("POST", url, [], b"{}")
        response.release()
        assert up.requests[0][1].split(b"\r\n")[0] == (
            b"POST /v1/messages?beta=true%0D%0AX-Injected:%20yes%20caf%C3%A9 HTTP/1.1"
        )


async def test_header_values_go_as_the_bytes_the_client_sent(pool: UpstreamPool) -> None:
    async with serving(keep_alive(b"HTTP/1.1 200 OK\r\nX-U: caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n")) as up:
        sent = "caf\u00e9 \u20ac " + b"\xff".decode("utf-8", "surrogateescape")  # as aiohttp's server decodes
        response = await pool.request("POST", up.url + "/", [("x-user", sent)], b"{}")
        assert response.headers["X-U"] == "caf\u00e9"
        response.release()
        assert b"\r\nx-user: caf\xc3\xa9 \xe2\x82\xac \xff\r\n" in up.requests[0][1]


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X-N: 1\r\n" * 300 + b"Content-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nok",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        b"not http at all\r\n\r\n",
    ],
    ids=["head-over-64k", "300-fields", "length-and-chunked", "upgrade", "garbage"],
)
async def test_a_bad_response_head_is_a_response_error(pool: UpstreamPool, head: bytes) -> None:
    async with serving(keep_alive(head)) as up:
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            await pool.request("POST", up.url + "/", [], b"{}")
        assert raised.value.message.startswith("bad upstream HTTP: ")
        assert up.connections == 1


@pytest.mark.parametrize(
    ("answer", "status", "body"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nEVIL",
            200,
            b"ok",
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\nextra", 204, b""),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok and more", 200, b"ok"),
    ],
    ids=["second-response", "body-on-204", "longer-than-length"],
)
async def test_bytes_after_a_complete_response_end_the_connection_not_the_response(
    pool: UpstreamPool, answer: bytes, status: int, body: bytes
) -> None:
    async with serving(keep_alive(answer)) as up:
        for _ in range(2):
            response = await pool.request("POST", up.url + "/", [], b"{}")
            assert (response.status, await body_of(response)) == (status, body)
            assert "EVIL" not in str(list(response.headers.items()))
            response.release()
        assert up.connections == 2


async def test_a_bad_chunk_after_the_head_ends_the_body_as_a_payload_error(pool: UpstreamPool) -> None:
    async with serving(keep_alive(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ndata\r\nzz\r\n")) as up:
        response = await pool.request("POST", up.url + "/", [], b"{}")
        got = await chunks_until(aiohttp.ClientPayloadError, response)
        assert got == [b"data"]
        response.close()
