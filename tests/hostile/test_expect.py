"""`Expect: 100-continue` (issue 11, item 5): aiohttp's server answers 100 itself, so the
expectation is hop-by-hop and never forwarded. The fake upstream here never sends 100: it
answers only once the whole body arrived, as an upstream that ignores the expectation does."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

BODY = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = orjson.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
)


class NoContinueUpstream:
    """Reads a request's headers and its body (`Content-Length` or chunked), never sends
    `100 Continue`."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")[1:]
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
                self.headers.append(headers)
                if headers.get("transfer-encoding") == "chunked":
                    while (size := int((await reader.readuntil(b"\r\n")).strip(), 16)) > 0:
                        await reader.readexactly(size + 2)
                    await reader.readuntil(b"\r\n")
                else:
                    await reader.readexactly(int(headers.get("content-length", "0")))
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode()
                    + ANSWER
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_expect_100_continue_is_never_forwarded(make_proxy: Any) -> None:
    upstream = NoContinueUpstream()
    url = await upstream.start()
    try:
        proxy = await make_proxy(upstream=url, read_timeout=5.0)
        headers = {"x-api-key": "key-e", "anthropic-version": "2023-06-01"}
        async with aiohttp.ClientSession() as http:
            for path in ("/v1/messages", "/v1/messages/count_tokens"):  # pipeline and pass-through
                async with http.post(proxy.url + path, data=orjson.dumps(BODY), headers=headers, expect100=True) as r:
                    assert r.status == 200
                    assert orjson.loads(await r.read())["id"] == "msg_1"
        assert len(upstream.headers) == 2
        assert all("expect" not in h for h in upstream.headers)
    finally:
        await upstream.stop()
