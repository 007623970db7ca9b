"""parse: the client's body bytes to a JSON object (`exchange.body`).

A body that is not a JSON object leaves `exchange.body` as `None`: later stages skip it and the
bytes go upstream unchanged (the upstream answers the error in its own words). One exception:
a body that is not UTF-8 (RFC 8259 8.1: JSON exchanged between systems must be) can succeed
nowhere, and the upstream's parser words it obscurely ("str is not valid UTF-8: surrogates not
allowed"), so the stage sets `Exchange.invalid_utf8 = (offset, byte)` and the handler answers a
400 naming the offending byte in the provider's error shape (`invalid_utf8_message`).

Incremental: when the raw body continues a recent body of its tenant byte for byte
(`Exchange.raw_match`, `proxy.pipeline.rawprefix`) whose parsed elements are still kept, only
the bytes before the message array and after the unchanged elements are parsed, and those
elements are the earlier objects (`reused_parse`): the same value as a full parse, at the cost
of the new bytes. Anything else is parsed whole.
"""

from __future__ import annotations

from typing import Final

import orjson

from proxy.exchange import Exchange
from proxy.pipeline.rawprefix import RawMatch, parse_tail, reusable
from proxy.providers.base import JSONObject
from proxy.services import Services


def invalid_utf8_offset(raw: bytes) -> int | None:
    """Offset of the first byte that is not valid UTF-8 in `raw`, `None` when all of it is."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return int(exc.start)
    return None


def invalid_utf8_message(offset: int, byte: int) -> str:
    """The 400 message for a body that is not UTF-8."""
    return (
        f"request body is not valid UTF-8 (byte 0x{byte:02x} at offset {offset}); "
        "JSON request bodies must be encoded as UTF-8"
    )


def reused_parse(raw: bytes, match: RawMatch) -> JSONObject | None:
    """`orjson.loads(raw)` from the matched recent body's parsed elements and the new bytes
    (`rawprefix.parse_tail`), or `None` when that body's elements are no longer kept or `raw`
    does not continue it (the caller parses it whole)."""
    state, kept = match.state, match.kept
    if state is None or kept is None:
        return None
    k = min(reusable(state, match.shared, raw, kept.array_key, True), len(kept.elements))
    if not k:
        return None
    parsed = parse_tail(raw, state, k, kept.elements, kept.array_key, kept.head)
    if parsed is None:
        return None
    body, kept.head = parsed
    match.head = kept.head
    match.reused = k
    return body


class ParseStage:
    name: Final = "parse"
    rewrites: Final = False

    async def run(self, exchange: Exchange, services: Services) -> None:
        match = exchange.raw_match
        body = reused_parse(exchange.raw, match) if match is not None else None
        if body is not None:
            exchange.body = body
            return
        try:
            body = orjson.loads(exchange.raw)
        except orjson.JSONDecodeError:
            offset = invalid_utf8_offset(exchange.raw)
            if offset is not None:
                exchange.invalid_utf8 = (offset, exchange.raw[offset])
            return
        if isinstance(body, dict):
            exchange.body = body


STAGE: Final = ParseStage()
