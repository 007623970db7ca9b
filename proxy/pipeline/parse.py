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
of the new bytes. Likewise the trailing elements a body ends with byte for byte when its edit is
before them (`rawprefix.parse_around`: a new session re-sending a recent conversation under
another first message). Anything else is parsed whole.
"""

from __future__ import annotations

from typing import Final

import orjson

from proxy.exchange import Exchange
from proxy.pipeline.rawprefix import RawMatch, parse_around, parse_tail, reusable, suffix_elements
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
    (`rawprefix.parse_tail`, or `rawprefix.parse_around` when `raw` ends with that body's
    trailing elements too: `RawMatch.suffix`), or `None` when that body's elements are no
    longer kept or `raw` shares none of them (the caller parses it whole)."""
    state, kept = match.state, match.kept
    k = min(reusable(state, match.shared, raw, kept.array_key, True), len(kept.elements)) if state and kept else 0
    if kept is None or k < len(kept.elements):  # an edit before the array's end: its last elements?
        body = _parse_around(raw, match, k)
        if body is not None:
            return body
    if state is None or kept is None:
        return None
    if not k:
        return None
    parsed = parse_tail(raw, state, k, kept.elements, kept.array_key, kept.head)
    if parsed is None:
        return None
    body, kept.head = parsed
    match.head = kept.head
    match.reused = k
    return body


def _parse_around(raw: bytes, match: RawMatch, k: int) -> JSONObject | None:
    """`reused_parse` by `rawprefix.parse_around`: the trailing elements of the kept body whose
    array's end `raw` holds (`RawPrefixIndex.find_around`), with the `k` leading ones of the
    prefix match when that is the same body; `None` when there is none."""
    match.end_digests = {}
    found = match.index.find_around(match.scope, raw, match.end_digests)
    if found is None:
        return None
    around, stop, shared = found
    if around is not match.kept:
        k = 0
    suffix = suffix_elements(raw, around.state, stop, shared, k, around.elements)
    if suffix is None:
        return None
    parsed = parse_around(raw, around.state, k, suffix, around.elements, around.array_key, around.head if k else None)
    if parsed is None:
        return None
    body, head = parsed
    if head is not None:
        around.head = match.head = head
    match.reused, match.around, match.suffix = k, around, suffix
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
