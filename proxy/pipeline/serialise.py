"""serialise: `exchange.body` back to bytes, only when a stage changed it.

Stages that rewrite replace the body with `Exchange.replace_body`, which marks it dirty; an untouched request keeps the
client's exact bytes. Bodies hold plain JSON values only (replay parses stored bytes; no
`orjson.Fragment`), so the body dumped here equals the upstream bytes parsed back.

`Exchange.serialised = (upstream bytes, body)`: the object those bytes were dumped from, so the
response side (`proxy.measure.sent_body`) reads what was sent without parsing it again (bodies
are copy-on-write: nothing edits `body` after this stage).
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
        if exchange.body is not None and exchange.is_body_dirty:
            exchange.upstream_body = orjson.dumps(exchange.body)
            exchange.serialised = (exchange.upstream_body, exchange.body)


STAGE: Final = SerialiseStage()
