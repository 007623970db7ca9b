"""AWS event-stream framing (`application/vnd.amazon.eventstream`), decoded incrementally.

Bedrock's `invoke-with-response-stream` and `converse-stream` answer with binary frames, not SSE
(docs/provider-rules.md 9). One message (AWS "Event stream encoding" in the Transcribe / S3 Select docs,
the same format botocore's `eventstream.py` parses):

    prelude   total length (uint32 BE, whole message) | headers length (uint32 BE)
              | prelude CRC (CRC-32 of the first 8 bytes)
    headers   repeated: name length (uint8) | name (UTF-8) | value type (uint8) | value
    payload   total - headers - 16 bytes
    trailer   message CRC (CRC-32 of everything before it)

Header value types: 0 true, 1 false, 2 byte, 3 int16, 4 int32, 5 int64, 6 bytes (uint16
length), 7 string (uint16 length), 8 timestamp (int64 ms), 9 UUID (16 bytes).

`EventStreamDecoder.decode(chunk)` returns the complete messages so far; it never raises on a
short chunk and raises `ValueError` on a bad CRC or an impossible length (the caller stops
reading usage; the bytes themselves are forwarded untouched by `proxy.forward`).
`bedrock_chunk(message)` is the JSON event inside a Bedrock `chunk` event (`{"bytes": base64}`).
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Final

import orjson

PRELUDE: Final = 12
TRAILER: Final = 4
MAX_MESSAGE: Final = 16 * 1024 * 1024
"""The largest message accepted (AWS caps event-stream messages at 16 MiB)."""
_FIXED: Final = {2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
_INTS: Final = {2: ">b", 3: ">h", 4: ">i", 5: ">q", 8: ">q"}


@dataclass(frozen=True, slots=True)
class Message:
    headers: dict[str, Any]
    payload: bytes


def parse_headers(data: bytes) -> dict[str, Any]:
    """The header block of one message as `{name: value}`; raises `ValueError` when malformed."""
    out: dict[str, Any] = {}
    i, end = 0, len(data)
    while i < end:
        size = data[i]
        name = data[i + 1 : i + 1 + size].decode("utf-8")
        i += 1 + size
        if i >= end:
            raise ValueError("event-stream header without a value type")
        kind = data[i]
        i += 1
        value: Any
        if kind in (0, 1):
            value = kind == 0
        elif kind in _FIXED:
            width = _FIXED[kind]
            raw = data[i : i + width]
            if len(raw) != width:
                raise ValueError("event-stream header value cut short")
            value = raw if kind == 9 else struct.unpack(_INTS[kind], raw)[0]
            i += width
        elif kind in (6, 7):
            (length,) = struct.unpack(">H", data[i : i + 2])
            raw = data[i + 2 : i + 2 + length]
            if len(raw) != length:
                raise ValueError("event-stream header value cut short")
            value = raw.decode("utf-8") if kind == 7 else raw
            i += 2 + length
        else:
            raise ValueError(f"event-stream header value type {kind} unknown")
        out[name] = value
    return out


class EventStreamDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole `Message`s back."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def decode(self, chunk: bytes) -> list[Message]:
        self._buffer += chunk
        messages: list[Message] = []
        buf = self._buffer
        while len(buf) >= PRELUDE:
            total, headers_len, prelude_crc = struct.unpack_from(">III", buf, 0)
            if zlib.crc32(bytes(buf[:8])) != prelude_crc:
                raise ValueError("event-stream prelude CRC mismatch")
            if total > MAX_MESSAGE or headers_len > total - PRELUDE - TRAILER:
                raise ValueError("event-stream message length impossible")
            if len(buf) < total:
                break
            (message_crc,) = struct.unpack_from(">I", buf, total - TRAILER)
            if zlib.crc32(bytes(buf[: total - TRAILER])) != message_crc:
                raise ValueError("event-stream message CRC mismatch")
            headers = parse_headers(bytes(buf[PRELUDE : PRELUDE + headers_len]))
            messages.append(Message(headers, bytes(buf[PRELUDE + headers_len : total - TRAILER])))
            del buf[:total]
        return messages

    def flush(self) -> list[Message]:
        """Nothing is complete after the end of the stream: a partial message is dropped."""
        self._buffer.clear()
        return []


def bedrock_chunk(message: Message) -> Any:
    """The decoded JSON of a Bedrock `chunk` event (`{"bytes": "<base64 JSON>"}`), else `None`
    (other event types, exceptions, malformed payloads)."""
    if message.headers.get(":message-type") != "event" or message.headers.get(":event-type") != "chunk":
        return None
    try:
        outer = orjson.loads(message.payload)
        raw = outer.get("bytes") if isinstance(outer, dict) else None
        return orjson.loads(base64.b64decode(raw, validate=True)) if isinstance(raw, str) else None
    except (orjson.JSONDecodeError, binascii.Error, ValueError):
        return None
