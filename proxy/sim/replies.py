"""What the simulated model answers: a short deterministic text, a scripted text, or a tool call.

Contract (provider-neutral; the wire modules turn a `Reply` into each API's shapes and build the
`Conversation` from each API's body):
- Default: the text `OK from promptcache-sim (turn N)`, N = number of user messages in the request.
- Header `x-sim-tool-call: NAME` forces a call of the offered tool NAME with `{}`, or with the JSON
  object in header `x-sim-tool-input`. NAME not offered, or invalid JSON -> `Rejected` (400), so a
  mistyped script fails loudly.
- Header `x-sim-reply: TEXT` forces the reply text. A header value cannot hold a line break, so a
  value that is a JSON string literal (`"line 1\\nline 2"`) is decoded; any other value is the text
  as is. Both `x-sim-tool-call` and `x-sim-reply` -> `Rejected` (400).
- Markers, read in `Conversation.last_user_text` (the last user-authored text; `None` when the
  last user turn carries tool results, so agent loops finish with a text reply), first applicable
  one in text order wins:
  * `[[tool:NAME]]`, `[[tool:NAME {"json": "input"}]]`, `[[tool:NAME free text]]`: applies when
    the request offers a tool NAME. A function tool gets the JSON object (`{}` if the payload is
    not one); a custom tool (OpenAI Responses `type: custom`) gets the payload verbatim as its
    input string (`""` when absent).
  * `[[reply:TEXT]]`: always applies; TEXT runs to the first `]]` and is used verbatim, or, when
    it is a JSON string literal (`[[reply:"a\\nb"]]`), decoded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from proxy.sim.errors import Rejected

TOOL_HEADER: Final = "x-sim-tool-call"
TOOL_INPUT_HEADER: Final = "x-sim-tool-input"
REPLY_HEADER: Final = "x-sim-reply"
_MARKER: Final = re.compile(
    r"\[\[(?:"
    r"tool:(?P<name>[A-Za-z0-9_.:\-]+)(?:\s+(?P<payload>\{.*?\}|.*?))?"
    r'|reply:(?:(?P<quoted>"(?:[^"\\\n]|\\.)*")|(?P<text>.*?))'
    r")\]\]",
    re.DOTALL,
)

ToolKind = Literal["function", "custom"]


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the request offers the model."""

    name: str
    kind: ToolKind = "function"
    """`function` (JSON object input) or `custom` (free-form string input, OpenAI Responses)."""
    namespace: str | None = None
    """The enclosing namespace (OpenAI Responses `type: namespace`), if any."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    input: dict[str, Any] | str = field(default_factory=dict)
    """JSON object for a function tool; the raw input string for a custom tool."""
    namespace: str | None = None

    @property
    def is_custom(self) -> bool:
        return isinstance(self.input, str)

    @property
    def arguments(self) -> str:
        """The input as a string: JSON for a function tool (OpenAI `arguments`), else verbatim."""
        if isinstance(self.input, str):
            return self.input
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
    offered_tools: tuple[Tool, ...]
    """The tools the request offers, in order (first of a name wins)."""
    last_user_text: str | None
    """Own text of the last user-authored message, trailing system/developer messages skipped;
    `None` when that message carries tool results or the conversation ends elsewhere."""

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.offered_tools if t.name == name), None)


def functions(*names: str) -> tuple[Tool, ...]:
    """Function tools by name (a convenience for callers and tests)."""
    return tuple(Tool(n) for n in names)


def text_reply(turn: int) -> str:
    return f"OK from promptcache-sim (turn {turn})"


def choose_reply(conv: Conversation, headers: Mapping[str, str]) -> Reply:
    """The reply for a request (see the module docstring)."""
    forced = headers.get(TOOL_HEADER)
    scripted = headers.get(REPLY_HEADER)
    if forced and scripted is not None:
        raise Rejected(400, f"{TOOL_HEADER} and {REPLY_HEADER} cannot be combined")
    if forced:
        name = forced.strip()
        tool = conv.tool(name)
        if tool is None:
            raise Rejected(400, f"{TOOL_HEADER}: the request offers no tool named '{name}'")
        raw = headers.get(TOOL_INPUT_HEADER)
        if tool.kind == "custom":
            return Reply(tool_call=ToolCall(name, raw or "", tool.namespace))
        return Reply(tool_call=ToolCall(name, _header_input(raw), tool.namespace))
    if scripted is not None:
        return Reply(text=_decode_text(scripted))
    if conv.last_user_text:
        for reply in _marker_replies(conv, _MARKER.finditer(conv.last_user_text)):
            return reply
    return Reply(text=text_reply(conv.user_turns))


def _marker_replies(conv: Conversation, matches: Iterable[re.Match[str]]) -> Iterable[Reply]:
    """The replies the markers ask for, in text order (tool markers for unoffered tools skipped)."""
    for match in matches:
        name = match.group("name")
        if name is None:
            quoted = match.group("quoted")
            yield Reply(text=_decode_text(quoted) if quoted is not None else match.group("text"))
            continue
        tool = conv.tool(name)
        if tool is None:
            continue
        payload = match.group("payload")
        if tool.kind == "custom":
            yield Reply(tool_call=ToolCall(name, payload or "", tool.namespace))
        else:
            yield Reply(tool_call=ToolCall(name, _marker_input(payload), tool.namespace))


def _decode_text(raw: str) -> str:
    """A JSON string literal decoded, anything else verbatim."""
    if len(raw) >= 2 and raw.startswith('"') and raw.endswith('"'):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        if isinstance(value, str):
            return value
    return raw


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
