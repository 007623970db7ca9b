"""A fast fake upstream for overhead benchmarks: answers every POST with a fixed small JSON.

`python bench/fake_upstream.py PORT [DELAY]` serves on 127.0.0.1:PORT under uvloop until killed;
with DELAY (seconds) each answer comes that long after the body was read, as a model's does
(requests then wait on the upstream, not on the proxy: `bench/peak_ab.py --upstream-delay`).
"""

from __future__ import annotations

import asyncio
import sys

import uvloop
from aiohttp import web

ANSWER = (
    b'{"id":"msg_b","type":"message","role":"assistant","model":"claude-sonnet-4-6",'
    b'"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,'
    b'"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}'
)


DELAY = 0.0
"""Seconds each answer waits after the body was read; set by `main` from the command line (not
at import: `bench/turn_cpu.py` imports `ANSWER` with its own arguments in `sys.argv`)."""


async def handle(request: web.Request) -> web.Response:
    await request.read()
    if DELAY:
        await asyncio.sleep(DELAY)
    return web.Response(body=ANSWER, content_type="application/json")


def main() -> None:
    global DELAY
    DELAY = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
