"""What the recorded model answered: tool call or text, read back from the trace itself.

A trace holds requests, not responses. The simulator answers text unless asked for a tool call
(`x-sim-tool-call`, `proxy/sim/replies.py`), so a replayed agent loop would look to the proxy as
if every response ended the turn. `reply_headers(trace)` recovers each response's kind from the
conversation's next request: the first later request on the same path whose history extends this
request's (its item at this request's last index has the same masked digest, `stable.py`, a string
content counting as one text block); the
items it appends up to the next user-side item are the recorded answer. When they hold a tool call
(Anthropic `tool_use`, Chat `tool_calls`, Responses `function_call` / `custom_tool_call`) of a tool
this request offers, the request gets `x-sim-tool-call: NAME`; otherwise nothing (a text answer).
A request that already carries `x-sim-tool-call` or `x-sim-reply` keeps it (a generated trace
states an abandoned conversation's last answer that way). Pure.
"""

from __future__ import annotations

from typing import Any, Final

from proxy.workloads.script import TOOL_CALL_HEADER
from proxy.workloads.stable import masked_digest
from proxy.workloads.trace import Trace, TraceRequest

REPLY_HEADER: Final = "x-sim-reply"
SEARCH: Final = 64
"""Later requests searched for the continuation of one request."""


def _items(request: TraceRequest) -> list[Any]:
    key = "input" if request.path == "/v1/responses" else "messages"
    items = request.body.get(key)
    return items if isinstance(items, list) else []


def _offered(request: TraceRequest) -> set[str]:
    names: set[str] = set()
    tools = request.body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else tool.get("name")
        if isinstance(name, str):
            names.add(name)
    return names


def _is_user_side(item: Any) -> bool:
    if not isinstance(item, dict):
        return True
    if item.get("type") in ("function_call_output", "custom_tool_call_output"):
        return True
    return item.get("role") in ("user", "tool", "system", "developer")


def _called(item: Any) -> str | None:
    """The name of the first tool an answer item calls, if any."""
    if not isinstance(item, dict):
        return None
    if item.get("type") in ("function_call", "custom_tool_call"):
        name = item.get("name")
        return name if isinstance(name, str) else None
    calls = item.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[0], dict):
        name = (calls[0].get("function") or {}).get("name")
        return name if isinstance(name, str) else None
    content = item.get("content")
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_use" and isinstance(block.get("name"), str):
            return str(block["name"])
    return None


def _digest(item: Any) -> bytes:
    """Masked digest with string content as one text block (the same rendered message)."""
    if isinstance(item, dict) and isinstance(item.get("content"), str) and "role" in item:
        item = {**item, "content": [{"type": "text", "text": item["content"]}]}
    return masked_digest(item)


def recorded_tool_call(trace: Trace, index: int) -> str | None:
    """The tool the answer to request `index` called, per the next request (module docstring)."""
    request = trace.requests[index]
    items = _items(request)
    if not items:
        return None
    n = len(items)
    last = _digest(items[-1])
    for later in trace.requests[index + 1 : index + 1 + SEARCH]:
        if later.path != request.path:
            continue
        following = _items(later)
        if len(following) <= n or _digest(following[n - 1]) != last:
            continue
        for item in following[n:]:
            if _is_user_side(item):
                return None
            name = _called(item)
            if name is not None:
                return name if name in _offered(request) else None
        return None
    return None


def reply_headers(trace: Trace) -> list[dict[str, str]]:
    """Per request, the headers that make the simulator answer as the recorded model did."""
    out: list[dict[str, str]] = []
    for index, request in enumerate(trace.requests):
        lowered = {k.lower() for k in request.headers}
        if TOOL_CALL_HEADER in lowered or REPLY_HEADER in lowered:
            out.append({})
            continue
        name = recorded_tool_call(trace, index)
        out.append({TOOL_CALL_HEADER: name} if name is not None else {})
    return out
