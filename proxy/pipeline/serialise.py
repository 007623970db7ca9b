"""serialise: `exchange.body` back to bytes, only when a stage changed it.

Stages that rewrite set `exchange.notes["dirty"] = True`; an untouched request keeps the
client's exact bytes. Replayed messages are `orjson.Fragment`s and are emitted verbatim.
"""

from __future__ import annotations

from typing import Final

import orjson

from proxy.exchange import Exchange
from proxy.services import Services


class SerialiseStage:
    name: Final = "serialise"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        if exchange.body is not None and exchange.notes.get("dirty"):
            exchange.upstream_body = orjson.dumps(exchange.body)


STAGE: Final = SerialiseStage()
