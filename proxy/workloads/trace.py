"""Trace files: one recorded (or generated) conversation workload as JSONL.

Format (one JSON object per line, UTF-8, `\\n`-terminated):
- optional first line, the header: `{"trace": name, "description": text}`;
- then one line per request, in send order:
  `{"gap": seconds, "path": "/v1/messages" | "/v1/chat/completions" | "/v1/responses",
  "headers": {non-secret headers}, "body": {request body}}`.
  `gap` is the time (seconds, >= 0) between the previous request's start and this one's
  (the first request's gap is counted from the start of the trace).

Invariants:
- A trace never holds a credential: a header named `authorization`, `x-api-key`, `api-key` or
  `cookie` is refused when writing and when reading (`TraceError`).
- `dumps_trace` is deterministic: the same `Trace` gives the same bytes (orjson, keys in the
  order the dicts were built), so generators can be compared byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

PATHS: Final = frozenset({"/v1/messages", "/v1/chat/completions", "/v1/responses"})
"""Request paths a trace may use."""
SECRET_HEADERS: Final = frozenset({"authorization", "x-api-key", "api-key", "cookie", "proxy-authorization"})
"""Header names (lower case) that never appear in a trace."""


class TraceError(ValueError):
    """An invalid trace; the message names the file (or trace) and the line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace."""

    gap: float
    """Seconds between the previous request's start and this one's."""
    path: str
    """`/v1/messages`, `/v1/chat/completions` or `/v1/responses`."""
    body: dict[str, Any]
    """The request body, as the client sent it."""
    headers: dict[str, str] = field(default_factory=dict)
    """Non-secret request headers (`x-claude-code-session-id`, `anthropic-beta` ...)."""

    @property
    def provider(self) -> str:
        """`anthropic` for `/v1/messages`, else `openai`."""
        return "anthropic" if self.path == "/v1/messages" else "openai"


@dataclass(frozen=True, slots=True)
class Trace:
    """A named workload: its requests in send order."""

    name: str
    description: str
    requests: tuple[TraceRequest, ...]

    @property
    def duration(self) -> float:
        """Seconds from the trace start to the last request's start."""
        return float(sum(r.gap for r in self.requests))


def with_gaps(trace: Trace, seconds: float) -> Trace:
    """`trace` with every gap after the first request set to `seconds` (uniform pacing), named
    `<name>@<seconds>s`."""
    requests = tuple(
        TraceRequest(r.gap if i == 0 else float(seconds), r.path, r.body, r.headers)
        for i, r in enumerate(trace.requests)
    )
    label = int(seconds) if float(seconds).is_integer() else seconds
    return Trace(f"{trace.name}@{label}s", trace.description, requests)


EARLIER: Final = "(an earlier conversation) "
SESSION_VALUE_HEADERS: Final = ("x-claude-code-session-id", "x-session-id")


def _earlier_body(body: dict[str, Any]) -> dict[str, Any]:
    key = "input" if isinstance(body.get("input"), list) else "messages"
    items = body.get(key)
    if not isinstance(items, list):
        return body
    out = list(items)
    for i, item in enumerate(out):
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            out[i] = {**item, "content": EARLIER + content}
        elif isinstance(content, list):
            parts = list(content)
            for j, part in enumerate(parts):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    parts[j] = {**part, "text": EARLIER + part["text"]}
                    break
            out[i] = {**item, "content": parts}
        break
    new = {**body, key: out}
    for field_name in ("prompt_cache_key", "user"):
        if isinstance(new.get(field_name), str):
            new[field_name] = new[field_name] + "-earlier"
    return new


def earlier_conversation(trace: Trace) -> Trace:
    """The same conversation as an earlier one of the same tenant: its first user message starts
    with `EARLIER` and its session ids (headers, `prompt_cache_key`, `user`) get `-earlier`, so
    it shares the tools and system prompt but no message and no session with `trace`."""
    requests = []
    for r in trace.requests:
        headers = {
            k: v + "-earlier" if k.lower() in SESSION_VALUE_HEADERS else v for k, v in r.headers.items()
        }
        requests.append(TraceRequest(r.gap, r.path, _earlier_body(r.body), headers))
    return Trace(f"{trace.name}-earlier", trace.description, tuple(requests))


def _check_headers(headers: Mapping[str, Any], where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TraceError(f"{where}: headers must map strings to strings")
        if key.lower() in SECRET_HEADERS:
            raise TraceError(f"{where}: header {key!r} carries a credential; traces never hold one")
        out[key] = value
    return out


def dumps_trace(trace: Trace) -> bytes:
    """The JSONL bytes of `trace` (header line first). Raises `TraceError` on a secret header."""
    lines = [orjson.dumps({"trace": trace.name, "description": trace.description})]
    for i, request in enumerate(trace.requests):
        where = f"{trace.name}: request {i}"
        if request.path not in PATHS:
            raise TraceError(f"{where}: unknown path {request.path!r}")
        gap = int(request.gap) if float(request.gap).is_integer() else request.gap
        obj: dict[str, Any] = {"gap": gap, "path": request.path}
        if request.headers:
            obj["headers"] = _check_headers(request.headers, where)
        obj["body"] = request.body
        lines.append(orjson.dumps(obj))
    return b"\n".join(lines) + b"\n"


def loads_trace(data: bytes, name: str = "trace") -> Trace:
    """Parse JSONL bytes; `name` is used when the trace has no header line."""
    description = ""
    requests: list[TraceRequest] = []
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}: line {lineno}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"{where}: invalid JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: each line must be a JSON object")
        if "trace" in obj and "body" not in obj:
            if requests:
                raise TraceError(f"{where}: the header line must come first")
            name = str(obj["trace"])
            description = str(obj.get("description", ""))
            continue
        gap = obj.get("gap", 0)
        if isinstance(gap, bool) or not isinstance(gap, int | float) or gap < 0:
            raise TraceError(f"{where}: gap must be a number of seconds >= 0")
        path = obj.get("path", "/v1/messages")
        if path not in PATHS:
            raise TraceError(f"{where}: path must be one of {sorted(PATHS)}")
        body = obj.get("body")
        if not isinstance(body, dict):
            raise TraceError(f"{where}: body must be a JSON object")
        headers = obj.get("headers") or {}
        if not isinstance(headers, dict):
            raise TraceError(f"{where}: headers must be an object")
        requests.append(TraceRequest(float(gap), path, body, _check_headers(headers, where)))
    if not requests:
        raise TraceError(f"{name}: no requests")
    return Trace(name, description, tuple(requests))


def load_trace(path: str | Path) -> Trace:
    """Read a trace file (blocking); the name defaults to the file name without `.jsonl`."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    return loads_trace(data, p.name.removesuffix(".jsonl"))
