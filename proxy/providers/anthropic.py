"""Anthropic Messages adapter: routes, error shape, usage, prefix order.

Provider rules (docs: platform.claude.com/docs/en/build-with-claude/prompt-caching and
/streaming; docs/provider-rules.md sections 1.5 and 1.10):

- prefix order is `tools` -> `system` -> `messages`;
- non-streaming usage is `usage` on the message; streaming usage arrives on `message_start`
  (`message.usage`) and then on `message_delta` (`usage`), whose counts are cumulative: the last
  value per field wins, never a sum;
- `cache_creation_input_tokens` equals `cache_creation.ephemeral_5m_input_tokens +
  ephemeral_1h_input_tokens`; a response without the split counts all creation as 5m;
- who acts next comes from `stop_reason` (the message, or `message_delta.delta` when streaming):
  `tool_use` / `pause_turn` hand back to the client at once, the others to a person;
- the response id is the message's `id` (on `message_start` when streaming) and cache
  diagnostics are the message's `diagnostics` object (cache-diagnostics guide, docs/provider-rules.md 1.12).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from proxy.nulls import NullAbsent
from proxy.profiles import DIRECT, Profile
from proxy.providers import anthropic_request
from proxy.providers.base import (
    HUMAN,
    TOOL,
    Block,
    ErrorKind,
    JSONObject,
    LastWins,
    MarkerPolicy,
    Run,
    RunBlocks,
    SystemPart,
    SystemUnit,
    Usage,
    platform_error_body,
)

KEY_PREFIXES: Final = ("sk-ant-",)
"""How an Anthropic credential starts: API keys `sk-ant-api03-...`, OAuth tokens
`sk-ant-oat01-...` (redacted wherever a path carries one, `proxy.providers.redact_path`)."""
_USAGE_KEYS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
_SPLIT_KEYS: Final = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
_TURN_BY_STOP: Final = {
    "end_turn": HUMAN,
    "max_tokens": HUMAN,
    "stop_sequence": HUMAN,
    "refusal": HUMAN,
    "tool_use": TOOL,
    "pause_turn": TOOL,
}
"""`stop_reason` -> who acts next (`pause_turn`: the client resends at once to continue a
server-tool loop)."""

#: Top-level request fields that change what the provider caches without being blocks
#: (docs/provider-rules.md 1.8). `model` is reported separately as `model_changed`.
PARAM_KEYS: Final = (
    "tool_choice",
    "thinking",
    "output_config",
    "speed",
    "context_management",
    "output_format",
)

DIAGNOSTIC_CAUSES: Final[dict[str | None, frozenset[str]]] = {
    None: frozenset({"none", "expired"}),
    "model_changed": frozenset({"model_changed"}),
    "system_changed": frozenset({"system_changed", "system_volatile_text"}),
    "tools_changed": frozenset({"tools_changed"}),
    "messages_changed": frozenset({"messages_changed", "history_rewritten"}),
}
"""Cache-diagnostics reason (`None` = no divergence: `diagnostics: null`) -> promptcache causes
that agree with it (an `expired` read had an unchanged prefix: the entry was gone). `pending`,
`previous_message_not_found`, `unavailable` and unknown types are inconclusive (docs/provider-rules.md 1.12)."""


ERROR_TYPES: Final[dict[str, str]] = {
    "bad_gateway": "api_error",
    "gateway_timeout": "timeout_error",
    "too_large": "request_too_large",
    "bad_request": "invalid_request_error",
    "not_found": "not_found_error",
    "client_timeout": "timeout_error",
    "headers_too_large": "request_too_large",
    "overloaded": "overloaded_error",
}
"""`ErrorKind.name` -> the Messages API's error `type` (`overloaded_error`, over
`max_connections`, is the API's own for "try again")."""


class AnthropicUsage:
    """Usage reader for one Messages response (JSON body or SSE events)."""

    def __init__(self) -> None:
        self._fields = LastWins()
        self._split = LastWins()
        self._seen = False
        self._response_id: str | None = None
        self._miss_reason: str | None = None
        self._missed_tokens: int | None = None
        self._turn: str | None = None

    def _take_stop(self, container: Any) -> None:
        if isinstance(container, dict):
            turn = _TURN_BY_STOP.get(container.get("stop_reason"))  # type: ignore[arg-type]
            if turn is not None:
                self._turn = turn

    def _take(self, usage: Any) -> None:
        if self._fields.update(usage, _USAGE_KEYS):
            self._seen = True
        if isinstance(usage, dict):
            self._split.update(usage.get("cache_creation"), _SPLIT_KEYS)

    def _take_message(self, message: dict[str, Any]) -> None:
        """The message's `id` and cache `diagnostics` (on the body, or on `message_start`)."""
        response_id = message.get("id")
        if isinstance(response_id, str):
            self._response_id = response_id
        if "diagnostics" in message:
            self._take_diagnostics(message["diagnostics"])

    def _take_diagnostics(self, diagnostics: Any) -> None:
        if not isinstance(diagnostics, dict):
            return
        reason = diagnostics.get("cache_miss_reason")
        if reason is None:
            self._miss_reason = "pending"
        elif isinstance(reason, dict) and isinstance(reason.get("type"), str):
            self._miss_reason = reason["type"]
            missed = reason.get("cache_missed_input_tokens")
            if isinstance(missed, int) and not isinstance(missed, bool):
                self._missed_tokens = missed

    def feed_json(self, body: Any) -> None:
        if isinstance(body, dict):
            self._take(body.get("usage"))
            self._take_message(body)
            self._take_stop(body)

    def feed_event(self, event: str, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type", event)
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, dict):
                self._take(message.get("usage"))
                self._take_message(message)
        elif kind == "message_delta":
            self._take(data.get("usage"))
            self._take_stop(data.get("delta"))
            if "diagnostics" in data:
                self._take_diagnostics(data["diagnostics"])

    def result(self) -> Usage:
        creation = self._fields.get("cache_creation_input_tokens")
        one_hour = self._split.get("ephemeral_1h_input_tokens")
        five_min = self._split.values.get("ephemeral_5m_input_tokens", creation - one_hour)
        return Usage(
            input_none=self._fields.get("input_tokens"),
            cache_read=self._fields.get("cache_read_input_tokens"),
            cache_write_5m=max(five_min, 0),
            cache_write_1h=one_hour,
            output=self._fields.get("output_tokens"),
            seen=self._seen,
            response_id=self._response_id,
            cache_miss_reason=self._miss_reason,
            cache_missed_tokens=self._missed_tokens,
            turn=self._turn,
        )


_USER_ID_SESSION: Final = re.compile(r"(?:^|_)session_([A-Za-z0-9-]{8,})$")


def session_in_user_id(user_id: str) -> str | None:
    """The session id Claude Code puts in `metadata.user_id`, if any: JSON with a `session_id`
    (`{"device_id":..., "account_uuid":..., "session_id":"..."}`) or the older string form
    `user_<hash>_account_<uuid>_session_<uuid>`."""
    text = user_id.strip()
    if text.startswith("{"):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        sid = value.get("session_id") if isinstance(value, dict) else None
        return sid if isinstance(sid, str) and sid else None
    match = _USER_ID_SESSION.search(text)
    return match.group(1) if match else None


MESSAGES_PATH: Final = "/v1/messages"


NULL_ABSENT: Final = NullAbsent(block_lists=("content",))
"""Where the Messages API reads an explicit null as the field absent (`proxy.nulls`): a
message's keys and its content blocks' keys. The SDK's request types declare a block's optional
fields nullable (`TextBlockParam.citations`, `cache_control`, `ToolUseBlockParam.toolset_name`:
`Optional[...]`), and the prompt is rendered from the validated blocks, so `model_dump()`'s
`{"citations": null, "text": ..., "type": "text"}` is the block `{"type": "text", "text": ...}`
(docs/provider-rules.md 1.5: a hit needs the same rendered content). Nulls deeper down (a
`tool_use` `input`, a `tool_result`'s content) are data (`AnthropicMessagesAdapter.identity_nulls`)."""


class AnthropicMessagesAdapter:
    """The Anthropic Messages API (`POST /v1/messages`), as served through `profile` (the API
    itself, Vertex AI, Bedrock InvokeModel, Foundry, a strict compatible server ...). Also the
    Anthropic family's adapter for its paths outside the pipeline (`/v1/messages/count_tokens`,
    `/v1/models` ...): only its error shape and usage reader apply to those."""

    name: Final = "anthropic"
    api_path: Final = MESSAGES_PATH

    def __init__(self, profile: Profile = DIRECT["anthropic"]) -> None:
        self.profile = profile

    def error_body(self, kind: ErrorKind, message: str) -> bytes:
        """`{"type":"error","error":{"type":...,"message":...}}` as the API answers errors, or
        the profile's platform shape (`platform_error_body`)."""
        platform = platform_error_body(self.profile.error_shape, kind, message)
        if platform is not None:
            return platform
        return orjson.dumps({"type": "error", "error": {"type": ERROR_TYPES[kind.name], "message": message}})

    def usage_reader(self) -> AnthropicUsage:
        return AnthropicUsage()

    def prefix_blocks(self, body: JSONObject) -> list[Block]:
        """Blocks in render order, flattened from `layout` (the one definition of the order)."""
        return list(RunBlocks(self.layout(body)))

    def params_fingerprint(self, body: JSONObject) -> JSONObject:
        """Prompt-affecting parameters outside the blocks (docs/provider-rules.md 1.8)."""
        return {key: body[key] for key in PARAM_KEYS if key in body}

    def session_hint(self, body: JSONObject) -> tuple[str, str] | None:
        """`("metadata", id)` when `metadata.user_id` names a session (Claude Code), else `None`."""
        metadata = body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        sid = session_in_user_id(user_id) if isinstance(user_id, str) else None
        return ("metadata", sid) if sid else None

    identity_optional: Final[Mapping[str, frozenset[str]]] = {}
    """None: every key of a message is part of it."""
    identity_nulls: Final = NULL_ABSENT

    diagnostic_causes: Final = DIAGNOSTIC_CAUSES
    counts_tokens: Final = False
    """Reads follow the markers (`predict_read_tokens` counts nothing)."""

    def with_cache_diagnostics(self, body: JSONObject, previous_id: str | None) -> JSONObject | None:
        """A copy of `body` asking for cache diagnostics against response `previous_id`.

        Sends `diagnostics: {"previous_message_id": <id or null>}` (null opts in on a first turn;
        platform.claude.com/docs/en/build-with-claude/cache-diagnostics, docs/provider-rules.md 1.12).
        `None` (leave the body alone) when the client already sent a `diagnostics` field, or when
        the profile's platform has no diagnostics (Vertex, Bedrock: `cache_diagnostics: false`).
        """
        if "diagnostics" in body or not self.profile.cache_diagnostics:
            return None
        return {**body, "diagnostics": {"previous_message_id": previous_id}}

    # Request side (pipeline stages); implemented in proxy.providers.anthropic_request.

    def marker_policy(self, body: JSONObject) -> MarkerPolicy:
        """`cache_control` rules (docs/provider-rules.md 1.2-1.5); the same for every model."""
        return anthropic_request.POLICY

    def layout(self, body: JSONObject) -> list[Run]:
        return anthropic_request.layout(body)

    def relayout(self, key: str, value: Any, previous: Any, runs: list[Run]) -> tuple[list[Run], int] | None:
        return anthropic_request.relayout(key, value, previous, runs)

    prefix_keys: Final = anthropic_request.PREFIX_KEYS
    tool_shape: Final = anthropic_request.TOOL_SHAPE

    def as_block_list(self, run: Run) -> tuple[Any, tuple[str | int, ...]] | None:
        return anthropic_request.as_block_list(run)

    def system_units(self, body: JSONObject) -> list[SystemUnit]:
        return anthropic_request.system_units(body)

    def with_system(self, body: JSONObject, parts: Sequence[SystemPart]) -> JSONObject:
        return anthropic_request.with_system(body, parts)

    def with_user_text(self, body: JSONObject, texts: Sequence[str]) -> JSONObject | None:
        return anthropic_request.with_user_text(body, texts)

    def prefix_request(self, body: JSONObject, last: int) -> JSONObject | None:
        return anthropic_request.prefix_request(body, last)

    def with_platform_markers(self, body: JSONObject, min_tokens: int, keep_ttl: bool) -> JSONObject | None:
        """Markers here are keys on blocks (the shared planner's): `None`."""
        return None

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
        """Reads follow the markers within the 20-position lookback of `POLICY`
        (docs/provider-rules.md 1.5): `None`."""
        return None

    def min_cacheable_tokens(self, model: str | None, default: int) -> int:
        own = self.profile.min_tokens_for(model)
        return own if own is not None else default
