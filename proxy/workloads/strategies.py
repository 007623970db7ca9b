"""Replay strategies: what goes upstream for each recorded request.

- `none`: the client's bytes, straight to the upstream.
- `naive`: the common gateway strategy, straight to the upstream: on Anthropic requests a
  5-minute `{"type": "ephemeral"}` marker on the last system block (a string system becomes one
  text block) and on the last block of the last message, each only where the block has no
  marker yet; the client's markers stay (so a client with four markers may end up with more,
  and the API refuses it, as it would behind such a gateway). OpenAI requests unchanged.
- `promptcache`: the client's bytes, sent through a promptcache proxy in front of the same
  upstream.
Pure: `upstream_body` never mutates its input.
"""

from __future__ import annotations

import copy
from typing import Any, Final

STRATEGIES: Final = ("none", "naive", "promptcache")
_MARKER: Final = {"type": "ephemeral"}


def naive_body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The `naive` strategy's body (see the module docstring)."""
    if path != "/v1/messages":
        return body
    out = copy.deepcopy(body)
    system = out.get("system")
    if isinstance(system, str) and system:
        out["system"] = system = [{"type": "text", "text": system}]
    if isinstance(system, list) and system and isinstance(system[-1], dict):
        system[-1].setdefault("cache_control", dict(_MARKER))
    messages = out.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        last = messages[-1]
        content = last.get("content")
        if isinstance(content, str) and content:
            last["content"] = content = [{"type": "text", "text": content}]
        if isinstance(content, list) and content and isinstance(content[-1], dict):
            content[-1].setdefault("cache_control", dict(_MARKER))
    return out


def upstream_body(strategy: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body a strategy sends for a recorded request."""
    if strategy == "naive":
        return naive_body(path, body)
    return body
