"""`SessionRecord` encoding: exact round trip, and every malformed input refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.store.codec import RecordError, SessionRecord, Sidecar, decode_record, encode_record

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


def test_round_trip_is_exact() -> None:
    assert decode_record(encode_record(FULL)) == FULL


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
        b'PCR1\x00\x00\x00\x08{"v": 2}',
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
