"""Fixtures of the hostile-traffic tests: raw loopback sockets speaking HTTP/1.1 by hand (a
client that hangs up the moment it has the body, half-sent requests), so the tests control
exactly when the connection closes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import orjson

from tests.sessions.conftest import client, redis_server, sim, start_proxy

__all__ = ["client", "redis_server", "sim", "start_proxy"]


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return orjson.loads(self.body)


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def request_bytes(path: str, body: bytes, headers: dict[str, str], *, version: str = "1.1") -> bytes:
    lines = [f"POST {path} HTTP/{version}", "Host: proxy", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    """One response with a `Content-Length` or chunked body, read to its last byte."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        if line:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = bytearray(await reader.readexactly(int(headers.get("content-length", "0"))))
    return RawResponse(int(status_line.split()[1]), headers, bytes(body))


async def post_and_hang_up(url: str, path: str, body: bytes, headers: dict[str, str]) -> RawResponse:
    """POST on a fresh connection, read the response to its last byte, and close at once (as
    curl, urllib or an HTTP/1.0 client do), without waiting for anything else."""
    reader, writer = await asyncio.open_connection(*host_port(url))
    try:
        writer.write(request_bytes(path, body, headers))
        return await read_response(reader)
    finally:
        writer.transport.abort()
