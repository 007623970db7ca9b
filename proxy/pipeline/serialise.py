"""serialise: `exchange.body` back to bytes, only when a stage changed it.

Stages that rewrite replace the body with `Exchange.replace_body`, which marks it dirty; an untouched request keeps the
client's exact bytes. Bodies hold plain JSON values only (replay parses stored bytes; no
`orjson.Fragment`), so the body dumped here equals the upstream bytes parsed back.

`Exchange.serialised = (upstream bytes, body)`: the object those bytes were dumped from, so the
response side (`proxy.measure.sent_body`) reads what was sent without parsing it again (bodies
are copy-on-write: nothing edits `body` after this stage).

Pure core `dumps_reusing(body, array_key, known, raw, start, ends)`: `orjson.dumps(body)`, byte
for byte, where the message-array elements that are the client's own parsed objects (`known`:
bodies are copy-on-write, so such an element holds exactly the value the client sent) are
copied from the client's raw body instead of being serialised again. Their bytes there are
their compact orjson bytes (`proxy.pipeline.rawprefix.locate` found each at its offset), so an
appended turn serialises only what the stages changed (markers, replayed and moved messages)
and the head's members. Everything else is dumped at the depth it has in the body (wrapped in
its key, and an element in its array), so orjson's recursion limit and its errors are the
whole dump's.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, count
from operator import is_not
from typing import Any, Final

import orjson

from proxy.exchange import Exchange
from proxy.providers.base import JSONObject
from proxy.services import Services


def dumps_reusing(
    body: JSONObject, array_key: str, known: Sequence[Any], raw: bytes, start: int, ends: Sequence[int], shift: int = 0
) -> bytes:
    """`orjson.dumps(body)`, copying element `i` of `body[array_key]` from `raw` when it is the
    very object `known[i + shift]`: `known[j]` is the client's element `j`, whose compact bytes
    are `raw[start:ends[0]]` for `j == 0`, else `raw[ends[j - 1] + 1:ends[j]]` (one `,` between
    elements: `proxy.pipeline.rawprefix.locate`). `shift`: how many leading client elements the
    sent array no longer holds (`Exchange.head_dropped`); a wrong one only copies less."""
    dumps = orjson.dumps
    view = memoryview(raw)
    parts: list[bytes | memoryview] = [b"{"]  # joined once: one copy of the copied bytes
    for key, value in body.items():
        if len(parts) > 1:
            parts.append(b",")
        if key != array_key or type(value) is not list or not value:
            parts.append(dumps({key: value})[1:-1])  # `"key":value`, at the body's depth
            continue
        opening = dumps({key: []})[1:-2]  # `"key":[`
        parts.append(opening)
        wrap = len(opening) + 1  # `{"key":[` before an element dumped alone in its array
        n = max(0, min(len(value), len(known) - shift, len(ends) - shift))
        copied = 0  # elements before this index are written (copied or dumped)
        for i in [*compress(count(), map(is_not, value[:n], known[shift : shift + n])), n]:
            if i > copied:  # elements copied .. i - 1 are the client's, contiguous in `raw`
                first, last = copied + shift, i - 1 + shift
                if copied:
                    parts.append(b",")
                parts.append(view[(ends[first - 1] + 1 if first else start) : ends[last]])
            if i < n:
                if i:
                    parts.append(b",")
                parts.append(dumps({key: [value[i]]})[wrap:-2])
            copied = i + 1
        for i in range(n, len(value)):
            if i:
                parts.append(b",")
            parts.append(dumps({key: [value[i]]})[wrap:-2])
        parts.append(b"]")
    parts.append(b"}")
    return b"".join(parts)


def serialised_bytes(exchange: Exchange, body: JSONObject) -> bytes:
    """The upstream bytes of `body`: `dumps_reusing` with the client's elements the session
    stage located in its raw body (`proxy.pipeline.rawprefix.Kept` of this request), else
    `orjson.dumps(body)`."""
    match = exchange.raw_match
    located = match.fresh if match is not None else None
    if located is None or located.state.start < 0 or not located.elements:
        return orjson.dumps(body)
    state = located.state
    return dumps_reusing(
        body, located.array_key, located.elements, exchange.raw, state.start, state.ends, exchange.head_dropped
    )


class SerialiseStage:
    name: Final = "serialise"
    rewrites: Final = True

    async def run(self, exchange: Exchange, services: Services) -> None:
        if exchange.body is not None and exchange.is_body_dirty:
            exchange.upstream_body = serialised_bytes(exchange, exchange.body)
            exchange.serialised = (exchange.upstream_body, exchange.body)


STAGE: Final = SerialiseStage()
