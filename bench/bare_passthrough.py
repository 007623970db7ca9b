"""A bare aiohttp pass-through (the baseline promptcache is measured against).

`python bench/bare_passthrough.py PORT UPSTREAM_URL [--reuse-port]`: forwards every request's
method, path, headers and body to UPSTREAM_URL with one pooled ClientSession and streams the
answer back. No pipeline, no metrics, no usage tee. With `--reuse-port` several processes can
listen on PORT (`SO_REUSEPORT`, as `promptcache serve --workers N` does): the gateway bench's
`bare-w2` peer, the machine's ceiling for two processes against one.
"""

from __future__ import annotations

import sys

import aiohttp
import uvloop
from aiohttp import web

DROP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding"}


def make_app(upstream: str) -> web.Application:
    """The pass-through app forwarding to `upstream` (also run in-process by `bench/turn_cpu.py`)."""
    upstream = upstream.rstrip("/")
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app["session"] = aiohttp.ClientSession(auto_decompress=False, connector=aiohttp.TCPConnector(limit=0))
        yield
        await app["session"].close()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROP}
        async with app["session"].request(request.method, upstream + request.path_qs, headers=headers,
                                          data=body) as up:
            response = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in DROP:
                    response.headers.add(k, v)
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def main() -> None:
    port, upstream = int(sys.argv[1]), sys.argv[2]
    reuse_port = "--reuse-port" in sys.argv[3:]
    web.run_app(
        make_app(upstream),
        host="127.0.0.1",
        port=port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
        reuse_port=reuse_port or None,
    )

if __name__ == "__main__":
    main()
