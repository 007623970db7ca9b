"""`proxy.body_encoding`: request bodies decode whole or not at all (attack finding F2)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.body_encoding import (
    PIECE_BYTES,
    BodyTooLarge,
    StackedCodings,
    UndecodableBody,
    codings,
    inflate,
    inflating,
    is_zlib_header,
)

TEXT = b'{"messages":[' + b'{"role":"user","content":"hello"},' * 200 + b"{}]}"


def test_inflate_gives_the_exact_bytes_or_refuses() -> None:
    assert inflate(gzip.compress(TEXT), "gzip", 1 << 20) == TEXT
    assert inflate(gzip.compress(TEXT[:100]) + gzip.compress(TEXT[100:]), " GZIP ", 1 << 20) == TEXT
    assert inflate(zlib.compress(TEXT), "deflate", 1 << 20) == TEXT
    assert inflate(TEXT, "identity", 1 << 20) is TEXT
    assert inflate(b"", "gzip", 1 << 20) == b""
    with pytest.raises(UndecodableBody, match="truncated gzip stream"):
        inflate(gzip.compress(TEXT)[:-1], "gzip", 1 << 20)
    with pytest.raises(UndecodableBody, match="without a zlib header"):
        inflate(zlib.compress(TEXT)[2:], "deflate", 1 << 20)  # the raw deflate stream inside
    with pytest.raises(UndecodableBody, match="2 bytes after the end of the deflate stream"):
        inflate(zlib.compress(TEXT) + b"{}", "deflate", 1 << 20)
    with pytest.raises(UndecodableBody, match="unsupported content coding 'gzip, gzip'"):
        inflate(gzip.compress(gzip.compress(TEXT)), "gzip, gzip", 1 << 20)
    with pytest.raises(BodyTooLarge):
        inflate(gzip.compress(TEXT), "gzip", len(TEXT) - 1)
    assert inflate(gzip.compress(TEXT), "gzip", len(TEXT)) == TEXT


def test_a_zlib_header_is_told_from_raw_deflate() -> None:
    assert is_zlib_header(zlib.compress(b"x")) and is_zlib_header(b"\x78\x01")
    assert not is_zlib_header(b"\x78\x00") and not is_zlib_header(b"\x08") and not is_zlib_header(b"")


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


async def _inflated(data: bytes, encoding: str, size: int = 7) -> list[bytes]:
    return [piece async for piece in inflating(_chunks(data, size), encoding)]


async def test_a_streamed_body_is_inflated_in_bounded_pieces_and_checked_at_its_end() -> None:
    assert b"".join(await _inflated(gzip.compress(TEXT), "gzip")) == TEXT
    two = gzip.compress(TEXT[:100]) + gzip.compress(TEXT[100:])
    assert b"".join(await _inflated(two, "x-gzip")) == TEXT
    assert b"".join(await _inflated(zlib.compress(TEXT), "deflate")) == TEXT
    raw = zlib.compress(TEXT)[2:-4]  # the raw deflate stream inside (no zlib header, no checksum)
    assert b"".join(await _inflated(raw, "deflate")) == TEXT  # streams through, as aiohttp let it
    bomb = zlib.compress(b"\x00" * (5 * PIECE_BYTES + 3))
    assert [len(p) for p in await _inflated(bomb, "deflate", len(bomb))] == [PIECE_BYTES] * 5 + [3]
    with pytest.raises(UndecodableBody, match="truncated gzip stream"):
        await _inflated(gzip.compress(TEXT)[:-8], "gzip")
    with pytest.raises(UndecodableBody, match="corrupt gzip stream"):
        await _inflated(b"\x1f\x8b\x08\x00" + b"\xff" * 40, "gzip")


async def test_a_deflate_stream_is_told_by_its_first_two_bytes_however_they_arrive() -> None:
    """The zlib header (two bytes) split over chunks: still a zlib stream (it was taken for raw
    deflate when the first chunk held one byte); one byte in all is a truncated stream; bytes
    after the stream's end are refused in a later chunk as in the same one."""
    wire = zlib.compress(TEXT)
    assert b"".join(await _inflated(wire, "deflate", 1)) == TEXT
    with pytest.raises(UndecodableBody, match="truncated deflate stream"):
        await _inflated(wire[:1], "deflate")
    with pytest.raises(UndecodableBody, match="bytes after the end of the deflate stream"):
        await _inflated(wire + b"{}", "deflate", len(wire))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.binary(max_size=300), min_size=1, max_size=3),
    st.lists(st.integers(0, 40), min_size=3, max_size=3),
    st.integers(1, 64),
)
async def test_zero_padding_after_a_gzip_member_is_skipped_whole_or_streamed(
    parts: list[bytes], zeros: list[int], size: int
) -> None:
    """F6: `gzip -d` and Python's `gzip` skip zero bytes after a member; so do `inflate` and
    `inflating`, however the body is split, between members and at the end."""
    data = b"".join(gzip.compress(part) + b"\x00" * n for part, n in zip(parts, zeros, strict=False))
    assert gzip.decompress(data) == b"".join(parts)
    assert inflate(data, "gzip", 1 << 20) == b"".join(parts)
    assert b"".join(await _inflated(data, "gzip", size)) == b"".join(parts)


async def test_padding_is_zeros_after_a_member_only() -> None:
    with pytest.raises(UndecodableBody, match="corrupt gzip stream"):
        inflate(b"\x00" * 8 + gzip.compress(TEXT), "gzip", 1 << 20)  # before the first member
    with pytest.raises(UndecodableBody, match="truncated gzip stream"):  # a byte that starts no member
        inflate(gzip.compress(TEXT) + b"\x00\x00\x01", "gzip", 1 << 20)
    with pytest.raises(UndecodableBody, match="truncated gzip stream"):
        await _inflated(gzip.compress(TEXT) + b"\x00\x00\x01", "gzip")
    with pytest.raises(UndecodableBody, match="corrupt gzip stream"):
        await _inflated(gzip.compress(TEXT) + b"\x00\x00junk!", "gzip")
    with pytest.raises(UndecodableBody, match="1 bytes after the end of the deflate stream"):
        inflate(zlib.compress(TEXT) + b"\x00", "deflate", 1 << 20)  # deflate has no padding


def test_codings_join_the_field_lines_and_refuse_a_stack() -> None:
    assert codings([]) == ""
    assert codings([" GZIP "]) == "gzip"
    assert codings(["identity", "deflate"]) == "deflate"
    assert codings(["gzip, identity"]) == "gzip"
    with pytest.raises(StackedCodings) as stacked:
        codings(["gzip", "Gzip"])
    message = "request body has 2 content codings (gzip, gzip); promptcache decodes one (gzip or deflate)"
    assert str(stacked.value) == message
    with pytest.raises(StackedCodings, match=r"3 content codings \(br, gzip, deflate\)"):
        codings(["br, gzip", "deflate"])
