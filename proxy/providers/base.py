"""Provider adapter contract: everything provider-specific lives behind `ProviderAdapter`.

Shared code (handlers, forward, pipeline stages, measurement) talks to a provider only through
an adapter. An adapter knows:

- its API and upstream family (`api_path`, `name`): one adapter per API (Anthropic Messages,
  OpenAI Chat Completions, OpenAI Responses, Bedrock Converse), chosen once per request,
- how to render an error body in the provider's own shape (`error_body`),
- how to read `Usage` from a JSON response body or from decoded SSE events (`UsageReader`),
- the provider's prefix order (`prefix_blocks`): the list of `Block`s the provider renders, in
  order, which every digest, divergence and breakpoint position is computed over;
- how to ask for the provider's own cache-miss diagnostics, if it has any (`with_cache_diagnostics`);
- on the request side: its `MarkerPolicy` (where markers may go, how many, their shape), the
  prefix order again as light `Run`s (`layout`), where tools and the system prompt live and how
  to rewrite them (`tool_shape`, `system_units` / `with_system`, `with_user_text`).

Invariant: adapters are stateless and pure; the same input gives the same output.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, overload

import orjson

from proxy.nulls import NullAbsent

JSONObject = dict[str, Any]
Section = Literal["tools", "system", "messages"]


@dataclass(frozen=True, slots=True)
class Block:
    """One unit of the provider's prefix order (`proxy.prefix` digests and chains them).

    A tool definition, a system text block, or one content block of a message. A string
    `system` or a string message content is one block.
    """

    section: Section
    """Which level of the prefix the block belongs to."""
    path: str
    """Where the block sits in the request body, e.g. `system[2]`, `messages[3].content[0]`."""
    kind: str
    """Block type: `tool`, `text`, `image`, `tool_use`, `tool_result`, `thinking`, ..."""
    value: Any
    """The JSON value of the block (a dict, or a str for string content)."""
    message_index: int | None = None
    """Index into the message/input array, `None` for tools and top-level system."""
    role: str | None = None
    """Role of the message holding the block (`user`, `assistant`, `system`, `tool` ...)."""


@dataclass(slots=True)
class Usage:
    """Token usage of one response, normalised across providers (units: tokens).

    `input_none + cache_read + cache_write_5m + cache_write_1h` is the whole prompt.
    OpenAI writes (GPT-5.6+ `cache_write_tokens`) are counted as `cache_write_5m`.
    """

    input_none: int = 0
    """Prompt tokens neither read from nor written to the cache."""
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
    output: int = 0
    seen: bool = False
    """True once any usage field was read from the response."""
    response_id: str | None = None
    """The response's id (Anthropic `msg_...`, OpenAI `chatcmpl-...` / `resp_...`), when sent."""
    cache_miss_reason: str | None = None
    """Anthropic cache diagnostics (platform.claude.com/docs/en/build-with-claude/cache-diagnostics):
    `diagnostics.cache_miss_reason.type` (`model_changed`, `system_changed`, `tools_changed`,
    `messages_changed`, `previous_message_not_found`, `unavailable`), `pending` when the response
    carried `diagnostics` with a null `cache_miss_reason`, `None` when it carried no diagnostics
    object (`diagnostics: null` means no divergence, or diagnostics not requested)."""
    cache_missed_tokens: int | None = None
    """`diagnostics.cache_miss_reason.cache_missed_input_tokens` (tokens), when reported."""
    turn: str | None = None
    """Who acts next, from the response: `human` (the turn ended: Anthropic `stop_reason`
    `end_turn` / `max_tokens` / `stop_sequence` / `refusal`; Chat `finish_reason` `stop` /
    `length` / `content_filter`; a Responses response without a function call), `tool` (a tool
    call: the client answers in seconds), `None` when the response did not say."""
    cache_discount: float | None = None
    """OpenRouter's `usage.cache_discount` (USD the cache saved; negative when writes cost more
    than they saved), when reported (docs/provider-rules.md 6)."""

    @property
    def cache_write(self) -> int:
        return self.cache_write_5m + self.cache_write_1h

    @property
    def prompt_total(self) -> int:
        return self.input_none + self.cache_read + self.cache_write


HUMAN: Final = "human"
TOOL: Final = "tool"


class UsageReader(Protocol):
    """Incremental usage reader for one response; fed JSON bodies or SSE events."""

    def feed_json(self, body: Any) -> None: ...

    def feed_event(self, event: str, data: Any) -> None: ...

    def result(self) -> Usage: ...


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """A local error the proxy itself answers with, before or instead of the upstream. Each
    adapter names it in its own API's error types (`error_body`)."""

    status: int
    name: str
    """What went wrong, in the proxy's words (`bad_gateway`, `too_large` ...)."""


BAD_GATEWAY = ErrorKind(502, "bad_gateway")
GATEWAY_TIMEOUT = ErrorKind(504, "gateway_timeout")
TOO_LARGE = ErrorKind(413, "too_large")
BAD_REQUEST = ErrorKind(400, "bad_request")
NOT_FOUND = ErrorKind(404, "not_found")
CLIENT_TIMEOUT = ErrorKind(408, "client_timeout")
"""The client did not send its request head or body in time (`proxy.connections`)."""
HEADERS_TOO_LARGE = ErrorKind(431, "headers_too_large")
OVERLOADED = ErrorKind(503, "overloaded")
"""Over `max_connections`."""

_GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    431: "INVALID_ARGUMENT",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def platform_error_body(shape: str | None, kind: ErrorKind, message: str) -> bytes | None:
    """A local error body in a platform's own shape, `None` for the provider's own (`shape`
    `None`, `anthropic`, `openai`: the adapter renders those).

    - `aws` (Bedrock): `{"message": ...}` (the runtime API's error body);
    - `google` (Vertex AI): `{"error": {"code": 502, "message": ..., "status": "UNAVAILABLE"}}`
      (google.rpc.Status as JSON).
    """
    if shape == "aws":
        return orjson.dumps({"message": message})
    if shape == "google":
        status = _GOOGLE_STATUS.get(kind.status, "UNKNOWN")
        return orjson.dumps({"error": {"code": kind.status, "message": message, "status": status}})
    return None


@dataclass(frozen=True, slots=True)
class HiddenCalls:
    """Tool calls a server-side caller makes that the model never sees (Anthropic programmatic
    tool calling: a `tool_use` whose `caller.type` is the code-execution tool, and its
    `tool_result`): the API rejects a marker on either (docs/provider-rules.md 1.3)."""

    caller_prefix: str
    """A call is hidden when `caller.type` starts with this (`code_execution`)."""
    call_kind: str = "tool_use"
    result_kind: str = "tool_result"
    id_key: str = "id"
    """The call's id key; a result names its call by `ref_key`."""
    ref_key: str = "tool_use_id"
    caller_key: str = "caller"


@dataclass(frozen=True, slots=True)
class MarkerPolicy:
    """Where one request may carry cache markers, and how they look (request side).

    Built per request by `ProviderAdapter.marker_policy` (OpenAI's depends on the model).
    Shared pipeline code decides *where* markers go from these fields only; it never branches
    on a provider name.
    """

    key: str
    """Block key of a marker: `cache_control` (Anthropic) or `prompt_cache_breakpoint`."""
    max_markers: int
    """Markers allowed in one request, the client's and a top-level one included (0 = none)."""
    kinds: frozenset[str]
    """Block kinds on which the planner may place a new marker."""
    forbidden_kinds: frozenset[str] = frozenset()
    """Block kinds on which a marker is rejected (a client marker there is moved)."""
    roles: frozenset[str] | None = None
    """Roles whose message blocks may carry a marker; `None` = any role."""
    text_kinds: frozenset[str] = frozenset({"text"})
    """Text block kinds: an empty one can carry no marker and is removable."""
    nested_kinds: frozenset[str] = frozenset()
    """Kinds whose `content` list may hold markers the API rejects there (moved onto the block)."""
    tool_kinds: frozenset[str] = frozenset()
    """Kinds treated as tool messages by the `no_tool_message_markers` capability."""
    tool_roles: frozenset[str] = frozenset()
    """Roles treated as tool messages by the `no_tool_message_markers` capability."""
    lookback: int | None = None
    """Positions a read walks back from a breakpoint, counting itself; `None` = no limit."""
    run_kinds: frozenset[str] = frozenset()
    """Kinds of which a run of consecutive blocks counts as one lookback position."""
    has_ttl: bool = False
    """Markers carry their own `ttl` (`5m` / `1h`); bare means `5m`."""
    template: tuple[tuple[str, str], ...] = ()
    """Items of a new marker without TTL, e.g. `(("type", "ephemeral"),)`."""
    top_level_key: str | None = None
    """Top-level body key of an automatic marker (Anthropic `cache_control`), if any."""
    cache_key_field: str | None = None
    """Top-level routing key the proxy sets when the client did not (`prompt_cache_key`)."""
    cache_key_tokens: int = 0
    """Tokens of tools + stable system the key set in `cache_key_field` digests (OpenAI: 1,024,
    its minimum cacheable prefix, docs/provider-rules.md 2.1)."""
    hidden_calls: HiddenCalls | None = None
    """Calls (and their results) that may carry no marker at all (`HiddenCalls`)."""


@dataclass(frozen=True, slots=True)
class ToolShape:
    """Where tool names, schemas and tool-call inputs live (request side)."""

    name_path: tuple[str, ...]
    """Path to the name inside a tool definition, e.g. `("name",)`."""
    schema_path: tuple[str, ...]
    """Path to the JSON schema inside a tool definition, e.g. `("input_schema",)`."""
    call_kinds: frozenset[str] = frozenset()
    """Message block kinds that are tool calls carrying a JSON object input."""
    call_name_key: str = "name"
    call_input_key: str = "input"


@dataclass(slots=True)
class Run:
    """Consecutive blocks of the prefix order that live in one place of the body.

    The request-side, allocation-light twin of `prefix_blocks`: flattening an adapter's runs
    gives exactly its `prefix_blocks` (same order, kinds, values and paths; a test holds it).
    """

    section: Section
    key: tuple[str | int, ...]
    """Where `value` sits in the body, e.g. `("messages", 3, "content")`."""
    value: Any
    """A list of blocks (`is_list`), or one whole block (a string content, an item)."""
    is_list: bool
    kind: str | None = None
    """The kind of every block of the run; `None` = each block's own `type`."""
    role: str | None = None
    message: int | None = None

    def __len__(self) -> int:
        return len(self.value) if self.is_list else 1


@dataclass(frozen=True, slots=True)
class SystemUnit:
    """One splittable unit of the system prompt: a system text block or string."""

    text: str | None
    """The text, or `None` for a unit that is not plain text (kept whole)."""
    marker: Any = None
    """The unit's marker value (`cache_control` ...), `None` when unmarked."""
    splittable: bool = True
    """False: the unit stays one block (Responses `instructions`); its segments are sorted
    inside its text instead of becoming separate blocks."""


@dataclass(frozen=True, slots=True)
class SystemPart:
    """A system block to write back: unit `source` whole, or a piece of its text."""

    source: int
    """Index into the `system_units` list the part comes from."""
    text: str
    marker: Any = None
    whole: bool = False
    """True: write the source unit back unchanged (`text`/`marker` are the unit's)."""


class ProviderAdapter(Protocol):
    """The provider-specific half of promptcache, for one API (see the module docstring).

    One adapter serves one API shape (`api_path`) through one upstream profile; the router
    (`proxy.providers.Router`) picks it once per request from the request's path and the
    exchange carries it, so no method takes a path.
    """

    @property
    def name(self) -> str:
        """`anthropic` or `openai`: the upstream family, also the `provider` metric label."""
        ...

    @property
    def api_path(self) -> str:
        """The request path of the API this adapter reads (`/v1/messages`,
        `/v1/chat/completions`, `/v1/responses`, `/converse`): the one path, without a routing
        prefix, that runs through the pipeline."""
        ...

    def error_body(self, kind: ErrorKind, message: str) -> bytes: ...

    def usage_reader(self) -> UsageReader: ...

    def prefix_blocks(self, body: JSONObject) -> list[Block]: ...

    def params_fingerprint(self, body: JSONObject) -> JSONObject: ...

    def session_hint(self, body: JSONObject) -> tuple[str, str] | None:
        """`(source, raw session id)` from provider-defined body fields, else `None`."""
        ...

    @property
    def diagnostic_causes(self) -> Mapping[str | None, frozenset[str]]:
        """The provider's cache-diagnostics reason (`None` = no divergence) -> promptcache causes
        that agree with it (`proxy.measure.agreement`); empty without diagnostics."""
        ...

    @property
    def counts_tokens(self) -> bool:
        """Whether `predict_read_tokens` counts text with its `count` argument: before the first
        such request the handler loads the `o200k_base` counter (`proxy.tokenizer`)."""
        ...

    @property
    def identity_optional(self) -> Mapping[str, frozenset[str]]:
        """Per message role, keys a client may drop when it re-sends a message without making
        it another message (session identity and replay ignore them; replay sends them back)."""
        ...

    @property
    def identity_nulls(self) -> NullAbsent | None:
        """Where the API reads an explicit null as the field absent (`proxy.nulls`): session
        identity leaves those null-valued keys out of a message's masked digest, so a message
        re-sent in an SDK's `model_dump()` form is the message it was, and replay sends the
        earlier bytes; `None`: every null is part of the message."""
        ...

    # Request side, used by the pipeline stages (canonicalise, reorder, breakpoints). Every
    # rewriter is copy-on-write: it returns new containers and never mutates its arguments.

    def marker_policy(self, body: JSONObject) -> MarkerPolicy: ...

    def layout(self, body: JSONObject) -> list[Run]:
        """The prefix order as `Run`s; flattened, exactly `prefix_blocks(body)`. The runs of one
        prefix key depend on that key's value only: `layout({key: body[key]})` is its share (the
        pipeline's `LayoutCache` relies on it)."""
        ...

    def relayout(self, key: str, value: Any, previous: Any, runs: list[Run]) -> tuple[list[Run], int] | None:
        """`layout({key: value})`, given `runs == layout({key: previous})`: the runs of the
        parts `value` shares with `previous` (same objects) reused, the rest laid out; with how
        many leading runs are `runs`' own objects. `None` when the adapter cannot do better than
        laying out from scratch. The pipeline's `LayoutCache` calls it when a stage replaced a
        few messages."""
        ...

    @property
    def prefix_keys(self) -> tuple[str, ...]:
        """Top-level keys that hold the prefix, in render order (canonical key order)."""
        ...

    @property
    def tool_shape(self) -> ToolShape: ...

    def as_block_list(self, run: Run) -> tuple[Any, tuple[str | int, ...]] | None:
        """A whole-string run rewritten as a list of one text block: `(value for run.key,
        relative path of the block)`; `None` when the run cannot carry a block marker."""
        ...

    def system_units(self, body: JSONObject) -> list[SystemUnit]: ...

    def with_system(self, body: JSONObject, parts: Sequence[SystemPart]) -> JSONObject:
        """`body` with its system prompt rebuilt from `parts` (in that order)."""
        ...

    def with_user_text(self, body: JSONObject, texts: Sequence[str]) -> JSONObject | None:
        """`body` with `texts` as leading text blocks of the newest user message, or `None`
        when the request has no user message that can take them."""
        ...

    def prefix_request(self, body: JSONObject, last: int) -> JSONObject | None:
        """A request carrying `body`'s prefix up to prefix block `last` and as little after it
        as the API allows (a keep-warm ping reads the entry there and pays for nothing
        uncached); `body` itself when nothing follows `last`; `None` when the adapter cannot cut
        there (the caller sends the body whole)."""
        ...

    def with_cache_diagnostics(self, body: JSONObject, previous_id: str | None) -> JSONObject | None:
        """A copy of `body` asking the provider to diagnose cache misses against the response
        `previous_id`, or `None` when the provider has no such feature (body unchanged)."""
        ...

    def with_platform_markers(self, body: JSONObject, min_tokens: int, keep_ttl: bool) -> JSONObject | None:
        """`body` with markers that are blocks of their own (Bedrock Converse `cachePoint`),
        placed by the adapter; `None` when the shared planner's key markers are the only kind.
        `min_tokens`: the model's minimum prefix; `keep_ttl`: the upstream accepts `ttl`."""
        ...

    # Read side, used by measurement and `explain` (`proxy.divergence`).

    def predict_read_tokens(
        self,
        body: JSONObject,
        count: Callable[[str], int] | None,
        n_blocks: int,
        shared: int,
        previous_blocks: int,
        previous_breakpoints: Sequence[int],
        min_tokens: int,
    ) -> tuple[int | None, int] | None:
        """`(block, tokens)` of the read the provider's own cache rule gives `body` (its
        `n_blocks` prefix blocks sharing `shared` with a previous request of `previous_blocks`
        blocks and markers at `previous_breakpoints`), counting text with `count` (`None`: the
        adapter's estimate); `None` when reads follow the markers and the `MarkerPolicy`
        lookback (`proxy.divergence.predict_read`)."""
        ...

    def min_cacheable_tokens(self, model: str | None, default: int) -> int:
        """The model's minimum cacheable prefix (tokens) on this upstream: the profile's own
        table where the platform differs (`Profile.min_tokens`, docs/provider-rules.md 4), else
        `default` (the rules' `models.yaml`, docs/provider-rules.md 1.6, 2.1)."""
        ...


@dataclass(slots=True)
class LastWins:
    """Keeps the last value seen per usage field (Anthropic `message_delta` is cumulative)."""

    values: dict[str, int] = field(default_factory=dict)

    def update(self, mapping: Any, keys: tuple[str, ...]) -> bool:
        if not isinstance(mapping, dict):
            return False
        seen = False
        for key in keys:
            value = mapping.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                self.values[key] = value
                seen = True
        return seen

    def get(self, key: str) -> int:
        return self.values.get(key, 0)


def dotted(key: tuple[str | int, ...]) -> str:
    """A body path as `Block.path` spells it: `("messages", 3, "content", 0)` ->
    `messages[3].content[0]`."""
    text = ""
    for part in key:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


KNOWN_NAMES: Final = {
    name: name
    for name in (
        # block and item types (Anthropic Messages, OpenAI Chat content parts and Responses items)
        "text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking",
        "server_tool_use", "web_search_tool_result", "search_result", "mcp_tool_use", "mcp_tool_result",
        "container_upload", "image_url", "input_audio", "file", "refusal", "message", "function_call",
        "function_call_output", "reasoning", "input_text", "output_text", "input_image", "input_file",
        "custom_tool_call", "custom_tool_call_output", "item_reference",
        # message roles
        "user", "assistant", "system", "developer", "tool", "function",
    )
}  # fmt: skip
"""Block kinds and message roles the providers define, each as one shared `str`: a parsed body
holds a new `str` for every `"type"` and `"role"` value (orjson shares keys, not values), and
what outlives the body (a prompt scan's kinds, the recent sessions' maps in `proxy.history`)
would keep one ~53-byte string per block and per message (about 90 KB of a 600 KB
conversation's map). Other values are kept as they come (no interning of what a client sends)."""


def known_name(name: str) -> str:
    """`name` as the shared `KNOWN_NAMES` string when it is one, else `name` itself."""
    return KNOWN_NAMES.get(name, name)


def run_kind(run: Run, value: Any) -> str:
    """The block kind `prefix_blocks` reports for `value` in `run`."""
    if run.kind is not None:
        return run.kind
    if isinstance(value, dict):
        kind = value.get("type")
        if isinstance(kind, str):
            return KNOWN_NAMES.get(kind, kind)
    return "text" if isinstance(value, str) else "unknown"


class RunBlocks(Sequence[Block]):
    """The `prefix_blocks` of an adapter's `layout` runs, index for index, as a lazy sequence:
    a `Block` is built when one is asked for (measurement reads a few of ~1000)."""

    __slots__ = ("runs", "starts", "size")

    def __init__(self, runs: Sequence[Run], starts: Sequence[int] | None = None) -> None:
        self.runs = runs
        if starts is None:
            starts, size = [], 0
            for run in runs:
                starts.append(size)
                size += len(run.value) if run.is_list else 1
        else:
            size = starts[-1] + (len(runs[-1].value) if runs[-1].is_list else 1) if runs else 0
        self.starts = starts
        self.size = size

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> Block: ...
    @overload
    def __getitem__(self, index: slice) -> list[Block]: ...
    def __getitem__(self, index: int | slice) -> Block | list[Block]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.size))]
        if index < 0:
            index += self.size
        if not 0 <= index < self.size:
            raise IndexError("block index out of range")
        r = bisect_right(self.starts, index) - 1
        run = self.runs[r]
        if run.is_list:
            pos = index - self.starts[r]
            value, key = run.value[pos], (*run.key, pos)
        else:
            value, key = run.value, run.key
        return Block(run.section, dotted(key), run_kind(run, value), value, run.message, run.role)
