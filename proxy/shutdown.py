"""Graceful stop of `promptcache serve` (SIGTERM / SIGINT): drain, then close.

`drain(runner, grace)`:
1. `services.draining` is set: `/readyz` answers 503 `draining` (a load balancer stops routing
   here) and every response from now on carries `Connection: close` (`close_when_draining`, an
   `on_response_prepare` hook), so a keep-alive client sends its next request elsewhere.
2. The listening sockets close: no new connection is accepted (the kernel refuses them).
3. Requests arriving on connections already open are answered as usual, for at most `grace`
   seconds (`shutdown_grace_seconds`), or until every connection has closed.
Then the caller's `runner.cleanup()` waits for the requests still in flight (aiohttp's
`shutdown_timeout`) and closes what is left. A client idle through the whole grace period
whose next request crosses the final close still sees the connection end: HTTP/1.1 has no way
to tell an idle keep-alive client to go away.
"""

from __future__ import annotations

from aiohttp import web

from proxy.appkeys import SERVICES
from proxy.connections import LimitedRunner


async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare` hook: once draining, the response closes its connection."""
    if request.app[SERVICES].draining:
        response.force_close()  # the connection closes after this response
        response.headers["Connection"] = "close"  # aiohttp wrote its headers before this hook


async def drain(runner: web.AppRunner, grace: float) -> None:
    """Steps 1-3 of the module docstring on `runner` (a started `LimitedRunner`); `grace` in
    seconds. Returns when no client connection is open or after `grace`."""
    runner.app[SERVICES].draining = True
    for site in list(runner.sites):
        await site.stop()
    if isinstance(runner, LimitedRunner):
        await runner.limits.wait_closed(grace)
