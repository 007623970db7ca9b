"""Request bodies sent with a `Content-Encoding`: decoded whole, or refused (pure, no I/O).

The proxy's server does not let aiohttp inflate request bodies (`auto_decompress=False` in
`proxy.app.limited_runner`): aiohttp accepts a truncated gzip stream (it checks the end of the
stream for `deflate` only) and forwards the part it inflated, and a deflate body whose first
byte looks like a zlib header but is not one inflates to nothing; both went upstream as a
truncated or empty body and came back 200 (attack finding F2). Here a body decodes only when
its whole stream does: every gzip member to its trailer (CRC and length checked by zlib), a
deflate stream to its final block, nothing after it.

- `gzip` / `x-gzip`: one or more gzip members (RFC 1952). Zero bytes after a member's trailer
  are padding and skipped (GNU `gzip -d` ignores trailing zeros, Python's `gzip` module skips
  zeros between and after members); any other byte there must start another member.
- `deflate`: a zlib stream (RFC 1950, as RFC 9110 8.4.1.2 defines the coding). A raw deflate
  stream (RFC 1951, no zlib header) is refused, not guessed at: aiohttp guesses from the low
  four bits of the first byte, and a raw stream that happens to pass inflated to nothing.
- `identity` or no header: the bytes as they are. Anything else (`br`, `zstd`, `compress`) is
  refused: the pipeline cannot read it.
- More than one coding (`gzip, gzip` in one field, or two `Content-Encoding` lines, which
  RFC 9110 5.3 makes one comma-separated list; `identity` entries dropped) is refused with its own
  message (`StackedCodings`, `codings`): a coding stacked on another is valid HTTP (RFC 9110
  8.4, in the order applied) but no client of these APIs sends one and neither aiohttp's server
  (it decodes one known coding, and passes a list through undecoded) nor nginx (it decodes no
  request body) decodes one; a proxy that inflated one layer of two forwarded gzip bytes as JSON.

A body streamed through unchanged (a path outside the pipeline) is inflated as it streams
(`inflating`, as aiohttp did: the bytes go upstream identity-encoded), in pieces of at most
`PIECE_BYTES`; its stream is checked at its end, when its first bytes are already upstream.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from typing import Final

GZIP: Final = frozenset({"gzip", "x-gzip"})
DEFLATE: Final = "deflate"


UNDECODABLE_BODY: Final = "request body could not be decoded as its Content-Encoding says"
"""The 400's message when the request body does not decode (a corrupt or truncated gzip or
deflate stream, bytes after it, an unknown coding; or aiohttp's `web.RequestPayloadError`
where aiohttp inflates bodies itself): `proxy.handlers`, and `proxy.forward` for a body that
failed while it streamed."""


class UndecodableBody(ValueError):
    """A body that does not decode as its `Content-Encoding` says (the handler answers 400)."""


class StackedCodings(UndecodableBody):
    """A body with more than one content coding (the handler answers 400 with this message)."""

    def __init__(self, codings: list[str]) -> None:
        super().__init__(
            f"request body has {len(codings)} content codings ({', '.join(codings)}); "
            "promptcache decodes one (gzip or deflate)"
        )


def codings(values: list[str]) -> str:
    """The request's `Content-Encoding` field lines as one value (`getall`: RFC 9110 5.3 joins
    them with commas), `identity` entries and empty ones dropped; raises `StackedCodings` when
    more than one coding remains (`""` when none does)."""
    found = [c.strip().lower() for value in values for c in value.split(",")]
    found = [c for c in found if c not in ("", "identity")]
    if len(found) > 1:
        raise StackedCodings(found)
    return found[0] if found else ""


def too_large_message(limit: int) -> str:
    """The 413's message for a body over `max_body_bytes` (`limit`), as received or inflated."""
    return f"request body exceeds the limit of {limit} bytes"


class BodyTooLarge(ValueError):
    """A body that inflates past the limit (the handler answers 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"inflates past {limit} bytes")
        self.limit = limit


def is_zlib_header(data: bytes) -> bool:
    """Whether `data` starts with a zlib header (RFC 1950 2.2: `CM` 8, `CINFO` <= 7, the
    16-bit header a multiple of 31)."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and data[0] >> 4 <= 7 and (data[0] * 256 + data[1]) % 31 == 0


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """`data` decoded as `Content-Encoding: encoding` says (case and spaces ignored), at most
    `limit` bytes. Raises `UndecodableBody` (a truncated or corrupt stream, bytes after its
    end, an unknown coding) or `BodyTooLarge`. An empty body stays empty."""
    coding = encoding.strip().lower()
    if coding in ("", "identity") or not data:
        return data
    if coding in GZIP:
        wbits = 16 + zlib.MAX_WBITS
    elif coding == DEFLATE:
        if not is_zlib_header(data):
            raise UndecodableBody("a deflate body without a zlib header (raw deflate is not the deflate coding)")
        wbits = zlib.MAX_WBITS
    else:
        raise UndecodableBody(f"unsupported content coding {coding!r}")
    out: list[bytes] = []
    size = 0
    rest = data
    while rest:
        decoder = zlib.decompressobj(wbits)
        try:
            chunk = decoder.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            raise UndecodableBody(f"corrupt {coding} stream ({exc})") from None
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        out.append(chunk)
        if not decoder.eof:
            raise UndecodableBody(f"truncated {coding} stream")
        rest = decoder.unused_data
        if rest and coding not in GZIP:
            raise UndecodableBody(f"{len(rest)} bytes after the end of the {coding} stream")
        rest = rest.lstrip(b"\x00")  # gzip padding (see the module docstring)
    return b"".join(out)


PIECE_BYTES: Final = 64 * 1024
"""Bytes `inflating` inflates at most per step (a small compressed chunk may inflate to
gigabytes: it is inflated piece by piece as the upstream takes them)."""


def streamable(encoding: str) -> bool:
    """Whether `inflating` decodes a body of this `Content-Encoding` (gzip or deflate)."""
    coding = encoding.strip().lower()
    return coding in GZIP or coding == DEFLATE


async def inflating(chunks: AsyncIterator[bytes], encoding: str) -> AsyncIterator[bytes]:
    """`chunks` of a gzip or deflate body (`streamable`), inflated as they come; raises
    `UndecodableBody` at a corrupt byte, at bytes after a deflate stream or, at the end, for a
    truncated stream. A deflate body without a zlib header is read as raw deflate here
    (aiohttp's guess, kept for bodies that only stream through); the guess waits for the
    body's first two bytes, however the client split them into chunks."""
    coding = encoding.strip().lower()
    is_gzip = coding in GZIP
    decoder: zlib._Decompress | None = None
    head = b""
    """deflate: the body's first bytes while fewer than the two a zlib header takes"""
    is_ended = False
    """deflate: its one stream ended (anything after it is refused)"""
    after_member = False
    """gzip: a member ended (zero bytes before the next one are padding)"""
    async for chunk in chunks:
        data = chunk
        if is_ended and data:
            raise UndecodableBody(f"bytes after the end of the {coding} stream")
        if decoder is None and not is_gzip and not is_ended:
            data, head = head + data, b""
            if len(data) < 2:
                head = data
                continue
        while data:
            if decoder is None and is_gzip and after_member:
                data = data.lstrip(b"\x00")  # padding after a member (see the module docstring)
                if not data:
                    break
            if decoder is None:
                if is_gzip:
                    wbits = 16 + zlib.MAX_WBITS
                else:
                    wbits = zlib.MAX_WBITS if is_zlib_header(data) else -zlib.MAX_WBITS
                decoder = zlib.decompressobj(wbits)
            try:
                piece = decoder.decompress(data, PIECE_BYTES)
            except zlib.error as exc:
                raise UndecodableBody(f"corrupt {coding} stream ({exc})") from None
            if piece:
                yield piece
            data = decoder.unconsumed_tail
            if decoder.eof:
                data = decoder.unused_data
                if not is_gzip:
                    if data:
                        raise UndecodableBody(f"bytes after the end of the {coding} stream")
                    is_ended = True
                decoder = None  # the next gzip member, if any
                after_member = True
    if head:  # one byte in all: no deflate stream is that short
        raise UndecodableBody(f"truncated {coding} stream")
    if decoder is not None:
        while not decoder.eof and (piece := decoder.decompress(b"", PIECE_BYTES)):
            yield piece
        if not decoder.eof:
            raise UndecodableBody(f"truncated {coding} stream")
