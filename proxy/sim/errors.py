"""Rejections and the providers' error shapes.

Contract: pure request code raises `Rejected(status, message, ...)`; `app.py` renders it with
`anthropic_error_body` (`{"type":"error","error":{"type":...,"message":...}}`, docs/provider-rules.md 1.4)
or `openai_error_body` (`{"error":{"message","type","param","code"}}`) depending on the route.
"""

from __future__ import annotations

from typing import Any

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
}


class Rejected(Exception):
    """A request the simulated upstream refuses with an HTTP error status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def anthropic_error_body(exc: Rejected) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(exc.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def openai_error_body(exc: Rejected) -> dict[str, Any]:
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return {"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code}}
