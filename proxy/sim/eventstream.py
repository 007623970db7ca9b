"""AWS event-stream encoding for the simulator's Bedrock streams (`invoke-with-response-stream`).

A message is: total length (uint32 BE), headers length (uint32 BE), CRC-32 of those 8 bytes,
the headers (name length uint8, name, type 7 = string, value length uint16, value), the payload,
and the CRC-32 of everything before it. Bedrock sends each Anthropic stream event as a `chunk`
event whose payload is `{"bytes": "<base64 of the event JSON>"}`. Written independently of the
proxy's decoder (`proxy.eventstream`), which the simulator judges.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import orjson


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message with string headers."""
    block = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        block += bytes([len(raw_name)]) + raw_name + b"\x07" + struct.pack(">H", len(raw_value)) + raw_value
    total = 12 + len(block) + len(payload) + 4
    prelude = struct.pack(">II", total, len(block))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + block + payload
    return head + struct.pack(">I", zlib.crc32(head))


def chunk_event(data: Any) -> bytes:
    """A Bedrock `chunk` event carrying one JSON stream event."""
    payload = orjson.dumps({"bytes": base64.b64encode(orjson.dumps(data)).decode()})
    headers = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, payload)
