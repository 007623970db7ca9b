"""`SessionRecord` encoding: exact round trip, and every malformed input refused."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.store import codec
from proxy.store.codec import VERSION, RecordError, SessionRecord, Sidecar, decode_record, encode_record

FULL = SessionRecord(
    chain=bytes(range(48)),
    ends=(10, 25, 40),
    model="claude-sonnet-4-6",
    params_digest=b"\x01" * 16,
    breakpoints=(0, 2),
    ttls=("1h", "5m"),
    arrivals=(1_800_000_000.25, 1_800_000_003.5),
    last_response_id="msg_01",
    sidecars=(
        Sidecar(0, b"\x02" * 16, b'{"role":"user","content":"hi"}', b"\x05" * 16),
        Sidecar(2, b"\x03" * 16, b'{"content":[{"type":"text","text":"\\u00e9"}],"role":"user"}'),
    ),
    pins={"tool_order": ["b", "a"]},
    turns=3,
    head=b"\x04" * 16,
)


def unchecked(data: bytes) -> bytes:
    """`data` as a record written before heads had a checksum (`codec.UNCHECKED_MAGIC`, no trailer)."""
    return codec.UNCHECKED_MAGIC + data[4:-8]


def with_header(data: bytes, header: dict[str, object]) -> bytes:
    """An unchecked record of `data`'s blob under another `header` (as older writers wrote)."""
    size = int.from_bytes(data[4:8], "big")
    head = orjson.dumps(header)
    return codec.UNCHECKED_MAGIC + len(head).to_bytes(4, "big") + head + data[8 + size : -8]


def decodes(data: bytes, parts: dict[bytes, bytes] | None = None) -> bool:
    try:
        codec.decode_layout(data, parts or {})
    except RecordError:
        return False
    return True


def bit_flips(data: bytes) -> list[bytes]:
    """Every copy of `data` with one bit flipped."""
    return [data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1 :] for i in range(len(data)) for bit in range(8)]


def test_a_bit_flipped_anywhere_in_a_head_is_a_record_error() -> None:
    """Leftover of session 9's attack pass: a stored head with a flipped bit decoded to another
    chain, other offsets or another sidecar value (replayed as sent) with nothing to tell. A
    head now ends with the xxh3-64 of its bytes: each of the flips of a plain record and of the
    head of a record in parts is a `RecordError` (a counted miss for `RecordStore`); the parts
    were checked by their names already."""
    data = encode_record(FULL)
    assert data[:4] == b"PCR2" and decodes(data)
    assert [i for i, flipped in enumerate(bit_flips(data)) if decodes(flipped)] == []
    long = replace(FULL, sidecars=tuple(Sidecar(n, bytes([n]) * 16, b'"' + b"m" * 3000 + b'"') for n in range(8)))
    layout = codec.encode_layout(long)
    parts = {p.key: p.data for p in layout.parts if p.data is not None}
    assert len(parts) == 1 and decodes(layout.head, parts)
    assert [i for i, flipped in enumerate(bit_flips(layout.head)) if decodes(flipped, parts)] == []


def test_a_record_written_before_the_checksum_still_decodes() -> None:
    """Records of earlier sessions (`PCR1`, no checksum) are read as they are, so an upgrade
    costs no session its state; the next save writes them checked. A checked record cut to
    the old magic, or an old one given a trailer, is a `RecordError`."""
    data = encode_record(FULL)
    assert decode_record(unchecked(data)) == FULL
    layout = codec.encode_layout(replace(FULL, sidecars=(Sidecar(0, b"\x02" * 16, b'"' + b"m" * 20000 + b'"'),)))
    parts = {p.key: p.data for p in layout.parts if p.data is not None}
    assert codec.decode_layout(unchecked(layout.head), parts)[0] == codec.decode_layout(layout.head, parts)[0]
    for bad in (codec.UNCHECKED_MAGIC + data[4:], unchecked(data) + data[-8:]):
        assert not decodes(bad)


def test_round_trip_is_exact() -> None:
    assert decode_record(encode_record(FULL)) == FULL


def test_delivered_notes_round_trip_in_version_2() -> None:
    record = replace(FULL, delivered=(("move\x1fusage-counters\x1f0", "Context used: 546 tokens", 4),))
    data = encode_record(record)
    assert orjson.loads(data[8 : 8 + int.from_bytes(data[4:8], "big")])["v"] == VERSION == 2
    assert decode_record(data) == record


def test_version_1_records_still_decode_without_delivered_notes() -> None:
    data = encode_record(FULL)
    size = int.from_bytes(data[4:8], "big")
    header = orjson.loads(data[8 : 8 + size])
    header["v"] = 1
    del header["dl"]
    v1 = with_header(data, header)
    assert decode_record(v1) == FULL and decode_record(v1).delivered == ()


def test_malformed_delivered_entries_are_left_out() -> None:
    data = encode_record(replace(FULL, delivered=(("a", "x", 1),)))
    size = int.from_bytes(data[4:8], "big")
    header = orjson.loads(data[8 : 8 + size])
    header["dl"] = [["a", "x", 1], ["b", 2, 3], ["c", "y", True], "d", ["e", "z"]]
    record = decode_record(with_header(data, header))
    assert record.delivered == (("a", "x", 1),)


def test_the_session_start_round_trips_and_is_left_out_when_unknown() -> None:
    record = replace(FULL, started=1_800_000_000.25)
    data = encode_record(record)
    assert orjson.loads(data[8 : 8 + int.from_bytes(data[4:8], "big")])["st"] == 1_800_000_000.25
    assert decode_record(data) == record
    unknown = encode_record(FULL)
    assert "st" not in orjson.loads(unknown[8 : 8 + int.from_bytes(unknown[4:8], "big")])
    assert decode_record(unknown).started == 0.0


def test_a_malformed_session_start_reads_as_unknown() -> None:
    data = encode_record(replace(FULL, started=5.0))
    header = orjson.loads(data[8 : 8 + int.from_bytes(data[4:8], "big")])
    for bad in ("5", True, -1.0, None, [5]):
        header["st"] = bad
        assert decode_record(with_header(data, header)).started == 0.0, bad
    header["st"] = 7
    assert decode_record(with_header(data, header)).started == 7.0


def test_minimal_record_round_trips() -> None:
    record = SessionRecord(chain=b"", ends=(), model="", params_digest=b"")
    assert decode_record(encode_record(record)) == record


def test_sidecar_values_stay_raw_bytes() -> None:
    data = encode_record(FULL)
    assert FULL.sidecars[1].value in data  # not re-encoded (no base64, no escaping)


@given(
    values=st.lists(st.binary(max_size=64), max_size=5),
    chain=st.binary(max_size=80),
    arrivals=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=4),
)
def test_round_trip_property(values: list[bytes], chain: bytes, arrivals: list[float]) -> None:
    record = SessionRecord(
        chain=chain,
        ends=tuple(range(len(values))),
        model="m",
        params_digest=b"p",
        arrivals=tuple(arrivals),
        sidecars=tuple(Sidecar(i, bytes([i]) * 16, v) for i, v in enumerate(values)),
    )
    assert decode_record(encode_record(record)) == record


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"PCR",
        b"XXXX" + encode_record(FULL)[4:],
        encode_record(FULL)[:-1],
        encode_record(FULL) + b"x",
        encode_record(FULL)[:12],
        b"PCR1\x00\x00\x00\x02{}",
        b'PCR1\x00\x00\x00\x08{"v": 3}',
    ],
)
def test_malformed_records_raise_record_error(data: bytes) -> None:
    with pytest.raises(RecordError):
        decode_record(data)


def test_decoded_sidecars_know_their_value_digest() -> None:
    import xxhash

    decoded = decode_record(encode_record(FULL))
    assert all(s.value_digest == xxhash.xxh3_128_digest(s.value) for s in decoded.sidecars)
    assert all(s.sent_digest() == xxhash.xxh3_128_digest(s.value) for s in FULL.sidecars)  # computed
    assert FULL.sidecars[0] == Sidecar(0, b"\x02" * 16, b'{"role":"user","content":"hi"}', b"\x05" * 16, b"x")
