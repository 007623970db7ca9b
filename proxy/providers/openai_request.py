"""OpenAI Chat Completions and Responses, request side: marker policy, layout, rewriters.

The pure functions behind the request-side methods of `OpenAIChatAdapter` and
`OpenAIResponsesAdapter` (each delegates here with its `OpenAIAPI`: `CHAT` or `RESPONSES`, the
data in which the two APIs differ). Copy-on-write like every rewriter: the caller's objects are
never changed.

Provider rules (developers.openai.com/api/docs/guides/prompt-caching; SDK types
`chat_completion_content_part_text_param.py`, `response_create_params.py`; docs/provider-rules.md 2.1-2.3):

- caching is automatic and prefix based; `prompt_cache_key` is combined with the routing hash of
  the first ~256 tokens (2.1), so requests sharing a prefix should share a key;
- GPT-5.6 and later accept `prompt_cache_breakpoint: {"mode": "explicit"}` on content parts
  (Chat: text, image_url, input_audio, file; Responses: input_text, input_image, input_file),
  honoured on user / system / developer / tool messages, not on assistant output (2.3). Up to 4
  breakpoint writes; `implicit` mode (the default) adds one automatic breakpoint and writes the
  latest 3 explicit ones, `explicit` mode the latest 4. No lookback limit; markers inherit the
  request TTL (`prompt_cache_options.ttl`), so they have none of their own;
- older models take no markers: the proxy sets only `prompt_cache_key`;
- the system prompt is the head of the array: leading `system` / `developer` messages, and for
  Responses also `instructions` (a string, which can hold no marker and stays one block).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from proxy.malformed import skipped
from proxy.providers.base import JSONObject, MarkerPolicy, Run, Section, SystemPart, SystemUnit, ToolShape

CHAT_PATH: Final = "/v1/chat/completions"
RESPONSES_PATH: Final = "/v1/responses"
MARKER_KEY: Final = "prompt_cache_breakpoint"
SYSTEM_ROLES: Final = frozenset({"system", "developer"})
ITEM_ID_KEY: Final = "id"
"""A Responses input item's id: unique within `input` (docs/provider-rules.md 9: a duplicate is a 400)."""
_MODEL_VERSION: Final = re.compile(r"gpt-(\d+)(?:\.(\d+))?")
_BREAKPOINTS_SINCE: Final = (5, 6)

_COMMON: Final[dict[str, Any]] = {
    "key": MARKER_KEY,
    "forbidden_kinds": frozenset({"tool", "tool_call"}),
    "roles": frozenset({"user", "system", "developer", "tool"}),
    "tool_roles": frozenset({"tool"}),
    "tool_kinds": frozenset({"function_call_output"}),
    "template": (("mode", "explicit"),),
    "cache_key_field": "prompt_cache_key",
    "cache_key_tokens": 1024,
}
_CHAT_KINDS: Final = frozenset({"text", "image_url", "input_audio", "file"})
_RESPONSES_KINDS: Final = frozenset({"text", "input_text", "input_image", "input_file"})


@dataclass(frozen=True, slots=True)
class OpenAIAPI:
    """Where Chat Completions and Responses bodies differ (`CHAT`, `RESPONSES`; SDK types
    `completion_create_params.py`, `response_create_params.py`)."""

    path: str
    """The API's request path."""
    array_key: str
    """The top-level array of messages / items: `messages` (Chat) or `input` (Responses)."""
    instructions_key: str | None
    """Top-level system string outside the array (Responses `instructions`), else `None`."""
    has_string_input: bool
    """The array may be a string (Responses `input: "..."`, one user message)."""
    text_type: str
    """Type of a text content part the proxy writes: `text` (Chat) or `input_text` (Responses)."""
    marker_kinds: frozenset[str]
    """Content part kinds a `prompt_cache_breakpoint` may go on (docs/provider-rules.md 2.3)."""
    text_kinds: frozenset[str]
    """Text part kinds (an empty one can carry no marker)."""
    tool_shape: ToolShape
    """Chat tools nest the function (`function.parameters`); Responses tools are flat."""
    output_item: str | None
    """Item type of a tool output that takes text parts (`function_call_output`), else `None`."""

    @property
    def prefix_keys(self) -> tuple[str, ...]:
        """Top-level keys of the prefix, in render order."""
        keys = ("tools",) if self.instructions_key is None else ("tools", self.instructions_key)
        return (*keys, self.array_key)


CHAT: Final = OpenAIAPI(
    path=CHAT_PATH,
    array_key="messages",
    instructions_key=None,
    has_string_input=False,
    text_type="text",
    marker_kinds=_CHAT_KINDS,
    text_kinds=frozenset({"text"}),
    tool_shape=ToolShape(name_path=("function", "name"), schema_path=("function", "parameters")),
    output_item=None,
)
RESPONSES: Final = OpenAIAPI(
    path=RESPONSES_PATH,
    array_key="input",
    instructions_key="instructions",
    has_string_input=True,
    text_type="input_text",
    marker_kinds=_RESPONSES_KINDS,
    text_kinds=frozenset({"text", "input_text"}),
    tool_shape=ToolShape(name_path=("name",), schema_path=("parameters",)),
    output_item="function_call_output",
)


CLAUDE_CHAT_POLICY: Final = MarkerPolicy(
    key="cache_control",
    max_markers=4,
    kinds=_CHAT_KINDS,
    forbidden_kinds=frozenset({"tool", "tool_call"}),
    roles=frozenset({"user", "system", "developer", "assistant"}),
    tool_roles=frozenset({"tool"}),
    lookback=20,
    has_ttl=True,
    template=(("type", "ephemeral"),),
)
"""Chat Completions to a Claude model behind an OpenAI-wire gateway (LiteLLM, OpenRouter):
Anthropic `cache_control` on content parts (a string content becomes one text part), at most 4,
never on a `role: tool` message (LiteLLM copies those parts into `tool_result.content`, which
the Messages API rejects: docs/provider-rules.md 6, 7), with Anthropic's 20-position lookback (1.5)."""


def has_breakpoints(model: Any) -> bool:
    """True for GPT-5.6 and later (`gpt-5.6`, `gpt-5.6-mini`, `gpt-6` ...), docs/provider-rules.md 2.3."""
    if not isinstance(model, str):
        return False
    match = _MODEL_VERSION.match(model)
    if match is None:
        return False
    version = (int(match.group(1)), int(match.group(2) or 0))
    return version >= _BREAKPOINTS_SINCE


def marker_policy(api: OpenAIAPI, body: JSONObject) -> MarkerPolicy:
    """The policy for this request's model; `max_markers` 0 before GPT-5.6."""
    kinds, text_kinds = api.marker_kinds, api.text_kinds
    if not has_breakpoints(body.get("model")):
        return MarkerPolicy(max_markers=0, kinds=kinds, text_kinds=text_kinds, **_COMMON)
    options = body.get("prompt_cache_options")
    mode = options.get("mode") if isinstance(options, dict) else None
    return MarkerPolicy(max_markers=4 if mode == "explicit" else 3, kinds=kinds, text_kinds=text_kinds, **_COMMON)


def layout(api: OpenAIAPI, body: JSONObject) -> list[Run]:
    """Runs in render order; flattened they are the adapter's `prefix_blocks`."""
    runs: list[Run] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        runs.append(Run("tools", ("tools",), tools, True, "tool"))
    if api.instructions_key is not None:
        instructions = body.get(api.instructions_key)
        if isinstance(instructions, str):
            runs.append(Run("system", (api.instructions_key,), instructions, False, "text"))
    array_key = api.array_key
    items = body.get(array_key)
    if api.has_string_input and isinstance(items, str):
        runs.append(Run("messages", (array_key,), items, False, "text", "user", 0))
        return runs
    if not isinstance(items, list):
        return runs
    in_head = True
    for m, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        role = item.get("role")
        role = role if isinstance(role, str) else None
        in_head = in_head and role in SYSTEM_ROLES
        section: Section = "system" if in_head else "messages"
        item_type = item.get("type")
        if role is None and isinstance(item_type, str):
            runs.append(Run(section, (array_key, m), item, False, item_type, None, m))
            continue
        content = item.get("content")
        if isinstance(content, list):
            runs.append(Run(section, (array_key, m, "content"), content, True, None, role, m))
        elif content is not None:
            runs.append(Run(section, (array_key, m, "content"), content, False, "text", role, m))
        tool_calls = item.get("tool_calls")
        if isinstance(tool_calls, list):
            runs.append(Run(section, (array_key, m, "tool_calls"), tool_calls, True, "tool_call", role, m))
    return runs


def as_block_list(api: OpenAIAPI, run: Run) -> tuple[Any, tuple[str | int, ...]] | None:
    """String content as one text part; a string Responses `input` as one user message."""
    if run.is_list or not isinstance(run.value, str) or run.key == (api.instructions_key,):
        return None
    part = {"type": api.text_type, "text": run.value}
    if run.key == (api.array_key,):
        return [{"role": "user", "content": [part]}], (0, "content", 0)
    return [part], (0,)


def _array(api: OpenAIAPI, body: JSONObject) -> tuple[str, Any]:
    return api.array_key, body.get(api.array_key)


def _instructions(api: OpenAIAPI, body: JSONObject) -> str | None:
    """The API's top-level system string (Responses `instructions`), when the body has one."""
    if api.instructions_key is None:
        return None
    value = body.get(api.instructions_key)
    return value if isinstance(value, str) else None


def _head(items: Any) -> int | None:
    """End of the leading system/developer messages; `None` if a non-object sits inside it."""
    if not isinstance(items, list):
        return 0
    for m, item in enumerate(items):
        if not isinstance(item, dict):
            return None
        role = item.get("role")
        if type(role) is not str:  # no role, or a malformed one: not a system message
            if role is not None:
                skipped("role")
            return m
        if role not in SYSTEM_ROLES:
            return m
    return len(items)


def _unit_sources(api: OpenAIAPI, body: JSONObject) -> list[tuple[int, int | None]] | None:
    """Per system unit: `(message index, part index)`; `(-1, None)` is `instructions`."""
    sources: list[tuple[int, int | None]] = []
    if _instructions(api, body) is not None:
        sources.append((-1, None))
    _, items = _array(api, body)
    head = _head(items)
    if head is None:
        return None
    for m in range(head):
        content = items[m].get("content")
        if isinstance(content, list):
            sources.extend((m, c) for c in range(len(content)))
        elif content is not None:
            sources.append((m, None))
    return sources


def system_units(api: OpenAIAPI, body: JSONObject) -> list[SystemUnit]:
    """`instructions` (not splittable), then each part of the head messages."""
    sources = _unit_sources(api, body)
    if sources is None:
        return []
    _, items = _array(api, body)
    text_kinds = ("text", "input_text")
    units = []
    for m, c in sources:
        if m < 0:
            units.append(SystemUnit(_instructions(api, body), splittable=False))
            continue
        content = items[m]["content"]
        if c is None:
            units.append(SystemUnit(content if isinstance(content, str) else None))
            continue
        part = content[c]
        if isinstance(part, dict):
            text = part.get("text")
            is_text = part.get("type") in text_kinds and isinstance(text, str)
            units.append(SystemUnit(text if is_text else None, part.get(MARKER_KEY)))
        else:
            units.append(SystemUnit(None))
    return units


def _part(api: OpenAIAPI, items: list[Any], source: tuple[int, int | None], part: SystemPart) -> Any:
    m, c = source
    if c is None:
        block: JSONObject = {"type": api.text_type, "text": part.text}
    else:
        original = items[m]["content"][c]
        if part.whole:
            return original
        block = {k: v for k, v in original.items() if k != MARKER_KEY}
        block["text"] = part.text
    if part.marker is not None:
        block[MARKER_KEY] = part.marker
    return block


def with_system(api: OpenAIAPI, body: JSONObject, parts: Sequence[SystemPart]) -> JSONObject:
    """Head messages rebuilt from `parts`: consecutive parts of one message form one message
    (string content stays a string when it stays one unmarked part); a message split into
    several keeps its `id` on its first part only (item ids are unique, docs/provider-rules.md 9); parts of
    `instructions` are joined back into it; head items with no text units keep their place
    (`_merge_head`)."""
    sources = _unit_sources(api, body)
    if sources is None:
        return body
    array_key, items = _array(api, body)
    head = _head(items) or 0
    instructions: list[str] = []
    messages: list[Any] = []
    group: list[SystemPart] = []

    used: set[int] = set()

    def flush() -> None:
        if not group:
            return
        m = sources[group[0].source][0]
        original = items[m]
        if m in used and ITEM_ID_KEY in original:  # a second part of a split item: no second id
            original = {k: v for k, v in original.items() if k != ITEM_ID_KEY}
        used.add(m)
        if len(group) == 1 and sources[group[0].source][1] is None and group[0].marker is None:
            part = group[0]
            messages.append(original if part.whole else {**original, "content": part.text})
        else:
            content = [_part(api, items, sources[p.source], p) for p in group]
            messages.append({**original, "content": content})
        group.clear()

    for part in parts:
        m = sources[part.source][0]
        if m < 0:
            instructions.append(part.text)
            continue
        if group and sources[group[0].source][0] != m:
            flush()
        group.append(part)
    flush()
    new_body = dict(body)
    if api.instructions_key is not None and _instructions(api, body) is not None:
        if instructions:
            new_body[api.instructions_key] = "".join(instructions)
        else:
            del new_body[api.instructions_key]
    if isinstance(items, list):
        with_units = {m for m, _ in sources if m >= 0}
        new_body[array_key] = [*_merge_head(items[:head], messages, with_units), *items[head:]]
    return new_body


def _merge_head(original: list[Any], rebuilt: list[Any], with_units: set[int]) -> list[Any]:
    """The head: items without system units (Codex's `additional_tools` item, a message with no
    content) stay as they are at their index (unknown items pass through in
    place); the rebuilt messages fill the other positions in order, any left over follow."""
    out: list[Any] = []
    fill = iter(rebuilt)
    for m, item in enumerate(original):
        if m not in with_units:
            out.append(item)
            continue
        message = next(fill, None)
        if message is not None:
            out.append(message)
    out.extend(fill)
    return out


def _with_leading_parts(value: Any, parts: list[JSONObject], text_type: str) -> list[Any] | None:
    """`parts` then the content `value` (a string becomes one text part; `""` none)."""
    if isinstance(value, str):
        return [*parts, {"type": text_type, "text": value}] if value else parts
    if isinstance(value, list):
        return [*parts, *value]
    return None


def with_user_text(api: OpenAIAPI, body: JSONObject, texts: Sequence[str]) -> JSONObject | None:
    """`texts` as the first parts of the last item: a user message, or a tool output when a tool
    turn is last (Chat `role: tool` content, Responses `function_call_output.output`; both take
    a list of text parts: `ChatCompletionToolMessageParam`, `ResponseFunctionCallOutputItemList`).
    A string Responses `input` becomes one user message. `None` otherwise (an assistant turn is
    last: inserting into an older message would rewrite history every turn)."""
    text_type = api.text_type
    parts = [{"type": text_type, "text": text} for text in texts]
    array_key, items = _array(api, body)
    if isinstance(items, str) and api.has_string_input:
        original = [{"type": text_type, "text": items}] if items else []
        return {**body, array_key: [{"role": "user", "content": [*parts, *original]}]}
    if not isinstance(items, list) or not items:
        return None
    last = items[-1]
    if not isinstance(last, dict):
        return None
    if last.get("role") in ("user", "tool"):
        key = "content"
    elif api.output_item is not None and last.get("type") == api.output_item:
        key = "output"
    else:
        return None
    new_value = _with_leading_parts(last.get(key), parts, text_type)
    if new_value is None:
        return None
    return {**body, array_key: [*items[:-1], {**last, key: new_value}]}
