"""OpenAI Chat Completions and Responses: prompt rendering and cache accounting (pure core).

Contract (docs/provider-rules.md section 2):
- `render_chat(body, counter)` / `render_responses(body, counter)` turn a request into one token
  sequence (`Rendered`): tool definitions (JSON each), then the output schema, then each message
  as `<start> role [name | tool_call_id] <message> content [calls] <end>` (Responses:
  `instructions` first as a system message; `function_call` / `custom_tool_call` items as
  `<call> name arguments|input <end>`; `function_call_output` / `custom_tool_call_output` as a
  tool message; an `additional_tools` item as a message of its role (`developer`) holding its
  tool definitions like the top-level ones, `<start> developer <message> <tools> JSON each <end>
  <end>`, at its place in the input: the model reads tools offered mid-conversation where they
  appear, and they are as much part of the cached prefix as any message; item `id`s are not
  rendered), then the reply priming `<start> assistant <message>`.
  Text is real `o200k_base`; structure uses ids above the vocabulary (`START` ...), an image is
  `OPENAI_IMAGE_TOKENS` ids beginning with its content digest. Also records the offsets of
  `prompt_cache_breakpoint` parts (user/system/developer/tool only) and the end of every user/tool
  message (the implicit breakpoint of that turn) for GPT-5.6+ models (2.3).
- `Router.machine(...)` picks a machine from the tenant, model, `prompt_cache_key` and the first
  `routing_prefix_tokens` tokens; more than `overflow_requests_per_minute` requests per routing key
  within 60 s land on further machines with separate caches (2.1).
- `plan_cache(...)` computes `cached_tokens` / `cache_write_tokens` and the entries to write:
  * automatic (pre-5.6): nothing below `min_cache_tokens`; otherwise the cached length is the
    largest `min + k * step` <= prompt length whose prefix some earlier response stored on the
    same machine; those entries are refreshed and the longer boundaries of this prompt written,
    all with the idle retention (`prompt_cache_retention: "24h"` -> extended) (2.1, 2.2, 2.5);
  * breakpoints (5.6+): exact matches only at the latest `breakpoint_read_window` breakpoints of
    the conversation (explicit markers, plus in `implicit` mode the end of every user/tool
    message, where earlier turns put their implicit breakpoint);
    writes at the implicit breakpoint + latest 3 explicit (`implicit` mode) or latest 4 explicit
    (`explicit` mode; none -> no caching); `cache_write_tokens` = last written offset - cached (2.3).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
import xxhash

from proxy.sim.cache import CacheStore, Entry
from proxy.sim.config import OpenAIModel
from proxy.sim.errors import Rejected
from proxy.sim.tokens import OPENAI_IMAGE_TOKENS, TokenCounter

START: Final = 300_000
"""`<|start|>` of a message."""
MESSAGE: Final = 300_001
"""`<|message|>` between role and content."""
END: Final = 300_002
"""`<|end|>` of a message."""
TOOLS: Final = 300_003
"""Start of the tool definitions."""
SCHEMA: Final = 300_004
"""Start of the structured-output schema."""
IMAGE: Final = 300_005
"""Filler of an image span."""
CALL: Final = 300_006
"""Start of a tool call in history."""
_HASHED_BASE: Final = 400_000
WINDOW_SECONDS: Final = 60.0
"""Overflow window (requests per minute)."""

_BREAKPOINT_ROLES: Final = frozenset({"user", "system", "developer", "tool"})
_TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text"})
_IMAGE_PARTS: Final = frozenset({"image_url", "input_image"})


@dataclass(slots=True)
class Rendered:
    tokens: array[int] = field(default_factory=lambda: array("I"))
    explicit: list[int] = field(default_factory=list)
    """Token offsets just after each `prompt_cache_breakpoint` part, ascending."""
    turn_ends: list[int] = field(default_factory=list)
    """Offsets after each user/tool message: where `implicit` mode places (and, on earlier
    turns, placed) its automatic breakpoint (GPT-5.6+)."""

    @property
    def implicit(self) -> int | None:
        """Offset after the latest user/tool message."""
        return self.turn_ends[-1] if self.turn_ends else None


@dataclass(frozen=True, slots=True)
class OpenAIPlan:
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    writes: list[Entry]
    """Entries to `commit` when the response starts."""


def bad(message: str, param: str | None = None, code: str | None = None) -> Rejected:
    return Rejected(400, message, param=param, code=code)


_JSON_TYPES: Final = {str: "a string", int: "an integer", float: "a decimal", bool: "a boolean", list: "an array"}


def _invalid_type(param: str, expected: str, value: Any) -> Rejected:
    got = "null" if value is None else _JSON_TYPES.get(type(value), "an object")
    return bad(f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param, "invalid_type")


PROMPT_CACHE_KEY_MAX: Final = 64
"""Longest `prompt_cache_key` the API accepts, characters (docs/provider-rules.md 9)."""


def _check_cache_key(body: Mapping[str, Any]) -> None:
    """`prompt_cache_key`, when present and not null, is a string of at most
    `PROMPT_CACHE_KEY_MAX` characters; the API's 400 otherwise (docs/provider-rules.md 9: "Invalid
    'prompt_cache_key': string too long. Expected a string with maximum length 64, ...")."""
    key = body.get("prompt_cache_key")
    if key is None:
        return
    if not isinstance(key, str):
        raise _invalid_type("prompt_cache_key", "a string", key)
    if len(key) > PROMPT_CACHE_KEY_MAX:
        raise bad(
            f"Invalid 'prompt_cache_key': string too long. Expected a string with maximum length "
            f"{PROMPT_CACHE_KEY_MAX}, but got a string with length {len(key)} instead.",
            "prompt_cache_key",
            "string_above_max_length",
        )


def _check_tool(tool: Any, param: str, is_chat: bool) -> None:
    """A function tool's `name` is a string and its `parameters` an object (the API's wording);
    Chat nests them under `function`."""
    if not isinstance(tool, dict):
        raise _invalid_type(param, "an object", tool)
    if tool.get("type", "function") != "function":
        return
    holder, prefix = (tool.get("function"), f"{param}.function") if is_chat else (tool, param)
    if not isinstance(holder, dict):
        raise _invalid_type(prefix, "an object", holder)
    if "name" not in holder:
        raise bad(f"Missing required parameter: '{prefix}.name'.", f"{prefix}.name", "missing_required_parameter")
    if not isinstance(holder["name"], str):
        raise _invalid_type(f"{prefix}.name", "a string", holder["name"])
    if "parameters" in holder and not isinstance(holder["parameters"], dict):
        raise _invalid_type(f"{prefix}.parameters", "an object", holder["parameters"])


# --- rendering --------------------------------------------------------------------------


def _rendered(value: Mapping[str, Any]) -> dict[str, Any]:
    """A part or item rendered as JSON: without its marker and its null-valued keys. The API
    validates it into its typed form, where a null optional field (`model_dump()`'s
    `"status": null`, `"encrypted_content": null`) is the field not given; nulls inside its
    values are data."""
    return {k: v for k, v in value.items() if k != "prompt_cache_breakpoint" and v is not None}


class _Renderer:
    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.out = Rendered()

    def text(self, text: str) -> None:
        self.out.tokens.extend(self.counter.encode(text))

    def json(self, value: Any) -> None:
        self.text(orjson.dumps(value).decode())

    def tools(self, tools: Any, *, is_chat: bool = False, param: str = "tools") -> None:
        if tools is not None and not isinstance(tools, list):
            raise _invalid_type(param, "an array", tools)
        if isinstance(tools, list):
            for i, tool in enumerate(tools):
                _check_tool(tool, f"tools[{i}]", is_chat)
        if isinstance(tools, list) and tools:
            self.out.tokens.append(TOOLS)
            for tool in tools:
                # a tool's null-valued keys are absent, as a part's (`_rendered`; Responses
                # `FunctionToolParam.strict` / `description` are nullable); its schema's are data
                self.json({k: v for k, v in tool.items() if v is not None} if isinstance(tool, dict) else tool)
            self.out.tokens.append(END)

    def schema(self, fmt: Any) -> None:
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            self.out.tokens.append(SCHEMA)
            self.json(fmt)
            self.out.tokens.append(END)

    def open(self, role: str, name: str | None = None) -> None:
        self.out.tokens.append(START)
        self.text(role)
        if name:
            self.text(name)
        self.out.tokens.append(MESSAGE)

    def close(self, role: str) -> None:
        self.out.tokens.append(END)
        if role in ("user", "tool"):
            self.out.turn_ends.append(len(self.out.tokens))

    def content(self, content: Any, role: str, path: str) -> None:
        if isinstance(content, str):
            self.text(content)
        elif isinstance(content, list):
            for k, part in enumerate(content):
                if not isinstance(part, dict):
                    raise bad(f"Invalid type for '{path}[{k}]': expected an object.", f"{path}[{k}]")
                kind = part.get("type")
                if kind is not None and not isinstance(kind, str):
                    raise _invalid_type(f"{path}[{k}].type", "a string", kind)
                if kind in _TEXT_PARTS and not isinstance(part.get("text"), str):
                    # a null text is no text (`_rendered`): the API refuses both
                    where = f"{path}[{k}].text"
                    if "text" not in part:
                        raise bad(f"Missing required parameter: '{where}'.", where, "missing_required_parameter")
                    raise _invalid_type(where, "a string", part["text"])
                self.part(part)
                marker = part.get("prompt_cache_breakpoint")
                if isinstance(marker, dict) and role in _BREAKPOINT_ROLES:
                    self.out.explicit.append(len(self.out.tokens))
        elif content is not None:
            raise bad(f"Invalid type for '{path}': expected a string or an array.", path)

    def part(self, part: Mapping[str, Any]) -> None:
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            self.text(str(part.get("text", "")))
        elif kind == "refusal":
            self.text(str(part.get("refusal", "")))
        elif kind in _IMAGE_PARTS:
            self.image(part)
        else:
            self.json(_rendered(part))

    def image(self, part: Mapping[str, Any]) -> None:
        source = _rendered(part)
        d = xxhash.xxh3_128_digest(orjson.dumps(source, option=orjson.OPT_SORT_KEYS))
        hashed = [_HASHED_BASE + int.from_bytes(d[i : i + 3], "little") for i in range(0, 12, 3)]
        self.out.tokens.extend(hashed)
        self.out.tokens.extend([IMAGE] * (OPENAI_IMAGE_TOKENS - len(hashed)))

    def call(self, name: str, arguments: str) -> None:
        self.out.tokens.append(CALL)
        self.text(name)
        self.text(arguments)

    def finish(self) -> Rendered:
        self.open("assistant")
        return self.out


def render_chat(body: Mapping[str, Any], counter: TokenCounter) -> Rendered:
    """Token sequence of a Chat Completions request (module docstring)."""
    _check_cache_key(body)
    messages = body.get("messages")
    if messages is None:
        raise bad("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            "messages",
            "empty_array",
        )
    r = _Renderer(counter)
    r.tools(body.get("tools"), is_chat=True)
    r.schema(body.get("response_format"))
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad(f"Missing required parameter: 'messages[{i}].role'.", f"messages[{i}].role")
        role = message["role"]
        name = message.get("name") or message.get("tool_call_id")
        r.open(role, name if isinstance(name, str) else None)
        r.content(message.get("content"), role, f"messages[{i}].content")
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            r.call(str(function.get("name", "")), str(function.get("arguments", "")))
        r.close(role)
    return r.finish()


def _check_unique_ids(items: list[Any]) -> None:
    """Input item ids are unique within `input` (items may omit `id`); a duplicate is the API's
    400 (docs/provider-rules.md 9)."""
    seen: set[str] = set()
    for item in items:
        item_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(item_id, str):
            continue
        if item_id in seen:
            raise bad(
                f"Duplicate item found with id {item_id}. Remove duplicate items from your input and try again.",
                "input",
            )
        seen.add(item_id)


def render_responses(body: Mapping[str, Any], counter: TokenCounter) -> Rendered:
    """Token sequence of a Responses request (module docstring)."""
    _check_cache_key(body)
    if body.get("previous_response_id"):
        rid = body["previous_response_id"]
        raise bad(
            f"Previous response with id '{rid}' not found.",
            "previous_response_id",
            "previous_response_not_found",
        )
    r = _Renderer(counter)
    r.tools(body.get("tools"))
    text = body.get("text")
    r.schema(text.get("format") if isinstance(text, dict) else None)
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        r.open("system")
        r.text(instructions)
        r.close("system")
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if items is not None and not isinstance(items, list):
        raise _invalid_type("input", "a string or an array", items)
    if items is None:
        items = []
    _check_unique_ids(items)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad(f"Invalid type for 'input[{i}]': expected an object.", f"input[{i}]")
        kind = item.get("type", "message")
        if kind == "message" and isinstance(item.get("role"), str):
            role = item["role"]
            r.open(role)
            r.content(item.get("content"), role, f"input[{i}].content")
            r.close(role)
        elif kind == "function_call":
            r.call(str(item.get("name", "")), str(item.get("arguments", "")))
            r.out.tokens.append(END)
        elif kind == "custom_tool_call":
            r.call(str(item.get("name", "")), str(item.get("input", "")))
            r.out.tokens.append(END)
        elif kind == "additional_tools":
            role = str(item.get("role") or "developer")
            r.open(role)
            r.tools(item.get("tools"), param=f"input[{i}].tools")
            r.close(role)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            r.open("tool", str(item.get("call_id", "")))
            output = item.get("output")
            r.content(
                output if isinstance(output, str | list) else orjson.dumps(output).decode(),
                "tool",
                f"input[{i}].output",
            )
            r.close("tool")
        else:
            r.open(str(kind))
            r.json({k: v for k, v in item.items() if v is not None})  # nulls: as `_rendered`
            r.close(str(kind))
    return r.finish()


# --- routing and accounting -------------------------------------------------------------


class Router:
    """Machine choice per request; per routing key, a 60 s window of request times."""

    __slots__ = ("_windows",)

    def __init__(self) -> None:
        self._windows: dict[bytes, deque[float]] = {}

    def machine(
        self,
        tenant: str,
        model: str,
        cache_key: str | None,
        tokens: array[int],
        now: float,
        settings: OpenAIModel,
    ) -> str:
        """Machine id for this request (records the request in its routing window)."""
        head = tokens[: settings.routing_prefix_tokens].tobytes()
        key = xxhash.xxh3_128_digest(orjson.dumps([tenant, model, cache_key or ""]) + b"\x1f" + head)
        window = self._windows.setdefault(key, deque())
        while window and window[0] <= now - WINDOW_SECONDS:
            window.popleft()
        index = len(window) // max(1, settings.overflow_requests_per_minute)
        window.append(now)
        if len(self._windows) > 65_536:
            self._windows = {k: w for k, w in self._windows.items() if w and w[-1] > now - WINDOW_SECONDS}
        return f"{key.hex()[:12]}-{index}"

    def reset(self) -> None:
        self._windows.clear()


def _prefix_digests(tokens: array[int], offsets: list[int]) -> list[bytes]:
    """xxh3-128 of `tokens[:o]` for ascending `offsets`, in one pass."""
    hasher = xxhash.xxh3_128()
    done = 0
    out = []
    for o in offsets:
        hasher.update(tokens[done:o].tobytes())
        done = o
        out.append(hasher.digest())
    return out


def plan_cache(
    rendered: Rendered,
    body: Mapping[str, Any],
    model: str,
    settings: OpenAIModel,
    tenant: str,
    machine: str,
    now: float,
    store: CacheStore,
) -> OpenAIPlan:
    """Cached / written tokens for one request; refreshes hits at `now`."""
    ns = f"openai/{model}/{machine}"
    n = len(rendered.tokens)
    if settings.breakpoints:
        return _plan_breakpoints(rendered, body, settings, tenant, ns, now, store)
    if n < settings.min_cache_tokens:
        return OpenAIPlan(n, 0, 0, [])
    step = max(1, settings.step_tokens)
    offsets = list(range(settings.min_cache_tokens, n + 1, step))
    digests = _prefix_digests(rendered.tokens, offsets)
    cached = 0
    for offset, digest in zip(offsets, digests, strict=True):
        entry = store.lookup(tenant, ns, digest, now)
        if entry is None:
            break
        store.touch(entry, now)
        cached = offset
    extended = body.get("prompt_cache_retention") == "24h"
    ttl = settings.extended_retention_seconds if extended else settings.retention_seconds
    label = "24h" if extended else "in_memory"
    writes = [
        Entry(tenant, ns, d, o, ttl, now + ttl, label) for o, d in zip(offsets, digests, strict=True) if o > cached
    ]
    return OpenAIPlan(n, cached, 0, writes)


def _plan_breakpoints(
    rendered: Rendered,
    body: Mapping[str, Any],
    settings: OpenAIModel,
    tenant: str,
    ns: str,
    now: float,
    store: CacheStore,
) -> OpenAIPlan:
    n = len(rendered.tokens)
    options = body.get("prompt_cache_options")
    options = options if isinstance(options, dict) else {}
    mode = options.get("mode", "implicit")
    if mode not in ("implicit", "explicit"):
        raise bad(
            f"Invalid value: '{mode}'. Supported values are: 'implicit' and 'explicit'.",
            "prompt_cache_options.mode",
            "invalid_value",
        )
    ttl_name = options.get("ttl", "30m")
    if ttl_name not in settings.breakpoint_ttls:
        allowed = " and ".join(f"'{t}'" for t in settings.breakpoint_ttls)
        raise bad(
            f"Invalid value: '{ttl_name}'. Supported values are: {allowed}.",
            "prompt_cache_options.ttl",
            "invalid_value",
        )
    ttl = settings.breakpoint_ttls[ttl_name]
    explicit = sorted(set(rendered.explicit))
    implicit = rendered.implicit if mode == "implicit" else None
    every = sorted(set(explicit) | (set(rendered.turn_ends) if mode == "implicit" else set()))
    readable = [o for o in every[-settings.breakpoint_read_window :] if o >= settings.min_cache_tokens]
    if mode == "implicit":
        chosen = explicit[-(settings.max_breakpoint_writes - 1) :] if settings.max_breakpoint_writes > 1 else []
        to_write = set(chosen) | ({implicit} if implicit is not None else set())
    else:
        to_write = set(explicit[-settings.max_breakpoint_writes :]) if settings.max_breakpoint_writes else set()
    candidates = sorted(set(readable) | {o for o in to_write if o >= settings.min_cache_tokens})
    digests = dict(zip(candidates, _prefix_digests(rendered.tokens, candidates), strict=True))
    cached = 0
    for offset in reversed(readable):
        entry = store.lookup(tenant, ns, digests[offset], now)
        if entry is not None:
            store.touch(entry, now, ttl)
            cached = offset
            break
    written = sorted(o for o in to_write if o > cached and o >= settings.min_cache_tokens)
    writes = [Entry(tenant, ns, digests[o], o, ttl, now + ttl, ttl_name) for o in written]
    return OpenAIPlan(n, cached, (written[-1] - cached) if written else 0, writes)
