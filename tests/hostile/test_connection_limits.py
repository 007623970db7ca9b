"""Connection limits (issue 11, item 4, in part): an idle keep-alive connection, one that never
sends a byte and one that never finishes its headers are closed after `client_idle_timeout`."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.hostile.conftest import host_port, read_response


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closes the connection (EOF) within 20 s."""
    async with asyncio.timeout(20):
        return await reader.read() == b""


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
