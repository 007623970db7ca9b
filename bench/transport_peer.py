"""`promptcache serve` with its request and response stages replaced by no-ops (bench only).

`python bench/transport_peer.py serve --port P --upstream URL ...` runs the real command
(`proxy.cli.main`: the same server, connection limits, handler, admission, forward, relay, usage
tee and the handler's own metrics) but every request skips the pipeline: the client's bytes go
upstream and nothing is measured or recorded. The gateway bench's `transport` peer: the cost a
request pays outside the stages and the store (issue 14, area F). No setting does this; a user
never runs it.
"""

from __future__ import annotations

import sys

import proxy.handlers
from proxy.cli import main
from proxy.exchange import Exchange
from proxy.services import Services


async def _no_request_stages(exchange: Exchange, services: Services) -> None:
    return None


def _no_response_stages(exchange: Exchange, services: Services) -> None:
    return None


if __name__ == "__main__":
    proxy.handlers.run_request_stages = _no_request_stages  # type: ignore[assignment]
    proxy.handlers.run_response_stages = _no_response_stages  # type: ignore[assignment]
    sys.exit(main(sys.argv[1:]))
