"""What the simulated model answers: a short deterministic text, or a scripted tool call.

Contract (provider-neutral; the wire modules turn a `Reply` into each API's shapes):
- Default: the text `OK from promptcache-sim (turn N)`, N = number of user messages in the request.
- Header `x-sim-tool-call: NAME` forces a call of the offered tool NAME with `{}`, or with the JSON
  object in header `x-sim-tool-input`. NAME not offered, or invalid JSON -> `Rejected` (400), so a
  mistyped script fails loudly.
- Rule: when the last message is a user message whose own text (not tool results) contains
  `[[tool:NAME]]` or `[[tool:NAME {"json": "input"}]]` and the request offers a tool NAME, the reply
  calls it. When the last message carries tool results, the rule does not fire and the reply is
  text, so agent loops finish.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.sim.errors import Rejected

TOOL_HEADER: Final = "x-sim-tool-call"
TOOL_INPUT_HEADER: Final = "x-sim-tool-input"
_MARKER: Final = re.compile(r"\[\[tool:([A-Za-z0-9_.:\-]+)(?:\s+(\{.*?\}))?\]\]", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    input: dict[str, Any] = field(default_factory=dict)

    @property
    def arguments(self) -> str:
        """The input as a JSON string (OpenAI `arguments`)."""
        return orjson.dumps(self.input).decode()


@dataclass(frozen=True, slots=True)
class Reply:
    """Either `text` or `tool_call` is set."""

    text: str | None = None
    tool_call: ToolCall | None = None


@dataclass(frozen=True, slots=True)
class Conversation:
    """The facts about a request that decide the reply."""

    user_turns: int
    """Number of user messages."""
    offered_tools: tuple[str, ...]
    """Names of the tools the request offers, in order."""
    last_user_text: str | None
    """Own text of the last message when it is a user message without tool results, else None."""


def text_reply(turn: int) -> str:
    return f"OK from promptcache-sim (turn {turn})"


def choose_reply(conv: Conversation, headers: Mapping[str, str]) -> Reply:
    """The reply for a request (see the module docstring)."""
    forced = headers.get(TOOL_HEADER)
    if forced:
        name = forced.strip()
        if name not in conv.offered_tools:
            raise Rejected(400, f"{TOOL_HEADER}: the request offers no tool named '{name}'")
        return Reply(tool_call=ToolCall(name, _header_input(headers.get(TOOL_INPUT_HEADER))))
    if conv.last_user_text:
        for match in _MARKER.finditer(conv.last_user_text):
            name, raw = match.group(1), match.group(2)
            if name in conv.offered_tools:
                return Reply(tool_call=ToolCall(name, _marker_input(raw)))
    return Reply(text=text_reply(conv.user_turns))


def _header_input(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Rejected(400, f"{TOOL_INPUT_HEADER}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise Rejected(400, f"{TOOL_INPUT_HEADER}: must be a JSON object")
    return value


def _marker_input(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
