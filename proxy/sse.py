"""Incremental Server-Sent Events decoding for the response tee.

`SSEDecoder.decode(chunk)` takes raw bytes as they arrive (chunk boundaries anywhere, even inside
a UTF-8 sequence or a CRLF pair) and returns the events completed so far as `(event, data)`
pairs; `flush()` returns an event left unterminated at end of stream. It never performs I/O and
never changes the bytes the client receives: the caller writes the chunk first, then feeds it.

Format: html.spec.whatwg.org "server-sent events" (lines end in CRLF, LF or CR; `data:` lines
are joined with LF; a blank line dispatches; `:` starts a comment).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str
    """The `event:` field, or `message` when absent."""
    data: str
    """The `data:` lines joined with `\\n`."""


class SSEDecoder:
    """Stateful SSE decoder; see the module docstring."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []
        self._pending_cr = False

    def decode(self, chunk: bytes) -> list[SSEEvent]:
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._pending_cr = False
        data = self._buffer + chunk
        events: list[SSEEvent] = []
        start = 0
        length = len(data)
        while True:
            nl = data.find(b"\n", start)
            cr = data.find(b"\r", start)
            if nl < 0 and cr < 0:
                break
            if cr < 0 or (0 <= nl < cr):
                end, nxt = nl, nl + 1
            elif cr == length - 1:
                end, nxt = cr, cr + 1
                self._pending_cr = True
            elif data[cr + 1 : cr + 2] == b"\n":
                end, nxt = cr, cr + 2
            else:
                end, nxt = cr, cr + 1
            self._line(data[start:end], events)
            start = nxt
        self._buffer = data[start:]
        return events

    def flush(self) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if self._buffer:
            self._line(self._buffer, events)
            self._buffer = b""
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if not raw:
            if self._data:
                events.append(SSEEvent(self._event or "message", "\n".join(self._data)))
            self._event = ""
            self._data = []
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
