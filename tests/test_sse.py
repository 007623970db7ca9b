"""SSEDecoder: events survive any chunking and every line ending."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.sse import SSEDecoder, SSEEvent

STREAM = (
    b"event: message_start\r\ndata: {\"a\": 1}\r\n\r\n"
    b": keep-alive comment\n\n"
    b"event: ping\rdata: x\rdata: y\r\r"
    b"data: [DONE]\n\n"
)
EXPECTED = [SSEEvent("message_start", '{"a": 1}'), SSEEvent("ping", "x\ny"), SSEEvent("message", "[DONE]")]


def test_decodes_all_line_endings_in_one_chunk() -> None:
    decoder = SSEDecoder()
    assert decoder.decode(STREAM) + decoder.flush() == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    points = sorted(set(cuts))
    start = 0
    for point in [*points, len(STREAM)]:
        events += decoder.decode(STREAM[start:point])
        start = point
    assert events + decoder.flush() == EXPECTED


def test_flush_dispatches_an_unterminated_event() -> None:
    decoder = SSEDecoder()
    assert decoder.decode(b"event: e\ndata: tail") == []
    assert decoder.flush() == [SSEEvent("e", "tail")]
