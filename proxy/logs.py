"""Logging: `configure_logging(level, format)` and the per-request access line.

- `log_format: text` (default) prints `time LEVEL logger: message`; `json` prints one JSON object
  per line: `ts` (ISO 8601, UTC), `level`, `logger`, `message`, plus the access line's fields
  for `promptcache.access` records.
- The access line (`access_fields`) carries provider, method, path (never the query string; a
  path segment holding a credential is `[redacted]` by the caller, `proxy.providers.redact_path`),
  status, duration, tokens read / written / uncached / output, cost in USD, the divergence cause
  and the session id. It never carries a header value, a body or a key: every field is built
  here from typed values, and only these fields are logged.
- Every record passes `RedactCredentials` on the way out: a credential header's value, or a
  provider key shape, quoted in a message or traceback (a library quoting raw request bytes or
  a URL) is replaced by `[redacted]`.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any, Final

import orjson

from proxy.providers import CREDENTIAL_SHAPE, REDACTED

ACCESS_LOGGER: Final = "promptcache.access"
ACCESS_KEY: Final = "access"
"""`LogRecord` attribute holding the access line's fields (`extra={ACCESS_KEY: fields}`)."""
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def access_fields(
    provider: str,
    method: str,
    path: str,
    status: int,
    elapsed_s: float,
    exchange: Any = None,
) -> dict[str, Any]:
    """The access line's fields; tokens, cost and cause come from `exchange` when it has them
    (its `usage` and `measurement`), else are `None`."""
    usage = getattr(exchange, "usage", None)
    measurement = getattr(exchange, "measurement", None)
    fields: dict[str, Any] = {
        "provider": provider,
        "method": method,
        "path": path,
        "status": status,
        "ms": round(elapsed_s * 1000, 1),
        "session": getattr(exchange, "session_id", None),
        "read": usage.cache_read if usage is not None and usage.seen else None,
        "written": usage.cache_write if usage is not None and usage.seen else None,
        "uncached": usage.input_none if usage is not None and usage.seen else None,
        "output": usage.output if usage is not None and usage.seen else None,
        "cost_usd": None,
        "cause": None,
    }
    if measurement is not None:
        cost = getattr(measurement, "cost_usd", None)
        fields["cost_usd"] = round(cost, 6) if cost is not None else None
        fields["cause"] = getattr(measurement, "cause", None)
    return fields


def access_text(fields: dict[str, Any]) -> str:
    """The text-format access line: `anthropic POST /v1/messages -> 200 in 3.1 ms read=... `."""
    head = f"{fields['provider']} {fields['method']} {fields['path']} -> {fields['status']} in {fields['ms']} ms"
    tail = [
        f"{key}={fields[key]}"
        for key in ("read", "written", "uncached", "output", "cost_usd", "cause", "session")
        if fields.get(key) is not None
    ]
    return " ".join([head, *tail])


def log_access(logger: logging.Logger, fields: dict[str, Any]) -> None:
    """Emit one access line at INFO (text message plus the fields for the JSON formatter)."""
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s", access_text(fields), extra={ACCESS_KEY: fields})


class JSONFormatter(logging.Formatter):
    """One JSON object per record: `ts`, `level`, `logger`, `message`, the access fields, and
    `exc` (the formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, ACCESS_KEY, None)
        if isinstance(fields, dict):
            data.update(fields)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exc"] = record.exc_text
        return orjson.dumps(data, default=str).decode()


_CREDENTIAL: Final = re.compile(
    r"(?i)((?:x-api-key|api-key|x-goog-api-key|authorization|proxy-authorization|cookie|x-amz-security-token)"
    r"[\"']?\s*[:=]\s*[\"']?)(?:bearer\s+|basic\s+)?[^\s'\",\\]+"
)
"""A credential header name, its separator, and its value (up to a quote, space, comma or a
backslash of a bytes repr such as `\\x01`)."""


def redact(text: str) -> str:
    """`text` with every credential header value, and every provider key shape anywhere (a key
    a client put in the URL path, quoted by a library: `proxy.providers.CREDENTIAL_SHAPE`),
    replaced by `[redacted]`."""
    return CREDENTIAL_SHAPE.sub(REDACTED, _CREDENTIAL.sub(r"\1[redacted]", text))


class RedactCredentials(logging.Filter):
    """Rewrites a record's message and traceback with `redact` (installed on the handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
            record.exc_text = redact(text)
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def configure_logging(level: str, log_format: str = "text") -> None:
    """Root logging for `serve`: `level` (any case) and `text` or `json` lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RedactCredentials())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
