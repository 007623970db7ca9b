"""parse: the client's body bytes to a JSON object (`exchange.body`).

A body that is not a JSON object leaves `exchange.body` as `None`: later stages skip it and the
bytes go upstream unchanged (the upstream answers the error in its own words).
"""

from __future__ import annotations

from typing import Final

import orjson

from proxy.exchange import Exchange
from proxy.services import Services


class ParseStage:
    name: Final = "parse"
    rewrites: Final = False

    async def run(self, exchange: Exchange, services: Services) -> None:
        try:
            body = orjson.loads(exchange.raw)
        except orjson.JSONDecodeError:
            return
        if isinstance(body, dict):
            exchange.body = body


STAGE: Final = ParseStage()
