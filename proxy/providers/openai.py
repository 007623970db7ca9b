"""OpenAI adapters, one per API: `OpenAIChatAdapter` (Chat Completions) and
`OpenAIResponsesAdapter` (Responses): routes, error shape, usage, prefix order.

What the two APIs share lives in `OpenAIAdapter` (their base); where they differ is data
(`proxy.providers.openai_request.CHAT` / `RESPONSES`: array key, `instructions`, part types,
tool shape), the usage reader (`ChatUsage` / `ResponsesUsage`), the token rule
(`openai_tokens.chat_offsets` / `responses_offsets`) and a few overridden methods.

Provider rules (docs: developers.openai.com/api/docs/guides/prompt-caching; SDK types
`completion_usage.py`, `response_usage.py`; docs/provider-rules.md sections 2.1 and 2.4):

- the cached prefix covers tool definitions and then the message (Chat) or input (Responses)
  array in order; leading `system` / `developer` messages and Responses `instructions` form the
  `system` section;
- usage totals include cached tokens: `prompt_tokens` / `input_tokens` minus
  `cached_tokens` minus `cache_write_tokens` is the uncached part;
- streamed Chat usage is one final chunk (only with `stream_options.include_usage`); streamed
  Responses usage is on `response.completed` (also read from `response.incomplete` / `.failed`);
- who acts next: Chat `finish_reason` (`tool_calls` / `function_call`: a tool call; any other: a
  person), Responses `output` (a `function_call` / `custom_tool_call` item: a tool call);
- the response id is `id` (Chat: the body or any chunk; Responses: the body or `response.id` on
  any streamed event);
- cache diagnostics (GPT-5.6+ Responses, docs/provider-rules.md 9,
  developers.openai.com/api/docs/guides/prompt-caching/diagnostics): the request names a
  baseline in `prompt_cache_options.comparison_response_id`; the response (JSON body, or the
  streamed `response.completed` object) carries `prompt_cache_diagnostics` of type `cache_hit`,
  `cache_miss` (`reason`, `cache_missed_tokens`, `comparison_reusable_tokens`),
  `comparison_response_not_found` or `unavailable`. `DIAGNOSTIC_CAUSES` says which of
  promptcache's own causes each reason agrees with;
- OpenAI-compatible variants (docs/provider-rules.md 5, 6, 9): DeepSeek `prompt_cache_hit_tokens` /
  `prompt_cache_miss_tokens` (their sum is `prompt_tokens`: the hits are the cached part, never
  added on top), Kimi's top-level `usage.cached_tokens`, LiteLLM's Anthropic-style
  `cache_creation_input_tokens` for a Claude model (written tokens, inside `prompt_tokens`), and
  OpenRouter's `cache_discount` (USD saved; negative when writes cost more) kept on `Usage`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from proxy.nulls import NullAbsent
from proxy.profiles import DIRECT, Profile
from proxy.providers import openai_request, openai_tokens
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
    ToolShape,
    Usage,
    platform_error_body,
)
from proxy.providers.openai_request import OpenAIAPI
from proxy.providers.openai_tokens import Count, PromptOffsets

KEY_PREFIXES: Final = ("sk-",)
"""How an OpenAI credential starts: `sk-...`, `sk-proj-...`, `sk-svcacct-...`, `sk-admin-...`
(OpenRouter's `sk-or-...` too); redacted wherever a path carries one (`proxy.providers.redact_path`)."""
CHAT_PATH: Final = openai_request.CHAT_PATH
CHAT_OPTIONAL: Final[Mapping[str, frozenset[str]]] = {"tool": frozenset({"name"})}
"""Keys a Chat client may drop on re-sending a message (`OpenAIChatAdapter.identity_optional`)."""
NULL_ABSENT: Final = NullAbsent(block_lists=("content",))
"""Where Chat Completions and Responses read an explicit null as the field absent
(`proxy.nulls`): a message's (an input item's) keys and its content parts' keys. The SDK's
request types declare them optional and nullable (`ChatCompletionAssistantMessageParam.refusal`,
`audio`, `function_call`: `Optional[...]`; `content`: `... | None`), the documented loop appends
`completion.choices[0].message` (serialised with its nulls) to the next request, and the prompt
is rendered from the validated messages (docs/provider-rules.md 2.1), so a message re-sent in
`model_dump()` form is the message it was. A function call's `arguments` is a string and a
tool's schema is not a message: their nulls are data (`OpenAIAdapter.identity_nulls`)."""
RESPONSES_PATH: Final = openai_request.RESPONSES_PATH
_CALL_ITEMS: Final = frozenset({"function_call", "custom_tool_call"})

#: Top-level request fields that change the cached prefix without being messages.
_VARIANT_KEYS: Final = (
    "prompt_cache_hit_tokens",
    "prompt_cache_miss_tokens",
    "cached_tokens",
    "cache_creation_input_tokens",
)
"""Top-level usage fields of OpenAI-compatible upstreams (DeepSeek, Kimi, LiteLLM)."""

PARAM_KEYS: Final = ("tool_choice", "response_format", "text", "parallel_tool_calls", "reasoning")

_INPUT_CAUSES: Final = frozenset({"system_changed", "system_volatile_text", "messages_changed", "history_rewritten"})
DIAGNOSTIC_CAUSES: Final[dict[str | None, frozenset[str]]] = {
    None: frozenset({"none"}),
    "model_changed": frozenset({"model_changed"}),
    "tools_changed": frozenset({"tools_changed"}),
    "input_changed": _INPUT_CAUSES,
    "context_compacted": frozenset({"messages_changed", "history_rewritten"}),
    "prompt_cache_key_changed": frozenset({"params_changed"}),
    "text_format_changed": frozenset({"params_changed"}),
    "reasoning_effort_changed": frozenset({"params_changed"}),
    "verbosity_changed": frozenset({"params_changed"}),
    "service_tier_changed": frozenset({"params_changed"}),
}
"""Upstream reason (`None` = `cache_hit`) -> promptcache causes that agree with it; a reason
not listed (`comparison_response_not_found`, `unavailable`, a new one) is inconclusive."""


ERROR_TYPES: Final[dict[str, str]] = {
    "bad_gateway": "server_error",
    "gateway_timeout": "server_error",
    "too_large": "invalid_request_error",
    "bad_request": "invalid_request_error",
    "not_found": "invalid_request_error",
    "client_timeout": "invalid_request_error",
    "headers_too_large": "invalid_request_error",
    "overloaded": "server_error",
}
"""`ErrorKind.name` -> the API's error `type` (the SDK's error shape, `{"error": {"type": ...}}`)."""


class OpenAIUsage(ABC):
    """Usage reader for one Chat Completions or Responses response (`ChatUsage`,
    `ResponsesUsage`: which usage keys, and where the turn and the diagnostics are read)."""

    prompt_key: str = "input_tokens"
    output_key: str = "output_tokens"
    details_key: str = "input_tokens_details"

    def __init__(self) -> None:
        self._fields = LastWins()
        self._details = LastWins()
        self._seen = False
        self._response_id: str | None = None
        self._turn: str | None = None
        self._variants = LastWins()
        self._discount: float | None = None
        self._miss_reason: str | None = None
        self._missed_tokens: int | None = None

    def _take(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        if self._fields.update(usage, (self.prompt_key, self.output_key)):
            self._seen = True
        self._details.update(usage.get(self.details_key), ("cached_tokens", "cache_write_tokens"))
        self._variants.update(usage, _VARIANT_KEYS)
        discount = usage.get("cache_discount")
        if isinstance(discount, (int, float)) and not isinstance(discount, bool):
            self._discount = float(discount)

    def _take_id(self, container: dict[str, Any]) -> None:
        response_id = container.get("id")
        if isinstance(response_id, str):
            self._response_id = response_id

    @abstractmethod
    def feed_json(self, body: Any) -> None: ...

    @abstractmethod
    def feed_event(self, event: str, data: Any) -> None: ...

    def result(self) -> Usage:
        prompt_key = self.prompt_key
        prompt = self._fields.get(prompt_key)
        variants = self._variants.values
        # one number per meaning, whichever field carries it: never a sum of two spellings
        cached = max(
            self._details.get("cached_tokens"),
            variants.get("prompt_cache_hit_tokens", 0),
            variants.get("cached_tokens", 0),
        )
        if "prompt_cache_miss_tokens" in variants and prompt_key not in self._fields.values:
            prompt = variants.get("prompt_cache_hit_tokens", 0) + variants["prompt_cache_miss_tokens"]
        written = max(self._details.get("cache_write_tokens"), variants.get("cache_creation_input_tokens", 0))
        return Usage(
            input_none=max(prompt - cached - written, 0),
            cache_read=cached,
            cache_write_5m=written,
            output=self._fields.get(self.output_key),
            seen=self._seen,
            response_id=self._response_id,
            turn=self._turn,
            cache_discount=self._discount,
            cache_miss_reason=self._miss_reason,
            cache_missed_tokens=self._missed_tokens,
        )


class ChatUsage(OpenAIUsage):
    """Chat Completions: `usage.prompt_tokens` / `completion_tokens` /
    `prompt_tokens_details`, on the body or on any streamed chunk (the final one with
    `stream_options.include_usage`); who acts next from `finish_reason`."""

    prompt_key = "prompt_tokens"
    output_key = "completion_tokens"
    details_key = "prompt_tokens_details"

    def _take_choices(self, container: dict[str, Any]) -> None:
        """`finish_reason` of the first choice (`tool_calls` / `function_call` = a tool call)."""
        choices = container.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            if isinstance(reason, str):
                self._turn = TOOL if reason in ("tool_calls", "function_call") else HUMAN

    def feed_json(self, body: Any) -> None:
        if isinstance(body, dict):
            self._take(body.get("usage"))
            self._take_id(body)
            self._take_choices(body)

    def feed_event(self, event: str, data: Any) -> None:
        if isinstance(data, dict):
            self._take(data.get("usage"))
            self._take_id(data)
            self._take_choices(data)


class ResponsesUsage(OpenAIUsage):
    """Responses: `usage.input_tokens` / `output_tokens` / `input_tokens_details` on the body or
    on `response.completed` (also `.incomplete`, `.failed`); the id on any event's `response`;
    who acts next from `output`; `prompt_cache_diagnostics` (GPT-5.6+)."""

    def _take_output(self, response: dict[str, Any]) -> None:
        """A function (or custom tool) call anywhere in `output` = a tool call."""
        output = response.get("output")
        if isinstance(output, list):
            calls = any(isinstance(i, dict) and i.get("type") in _CALL_ITEMS for i in output)
            self._turn = TOOL if calls else HUMAN

    def _take_diagnostics(self, container: dict[str, Any]) -> None:
        """`prompt_cache_diagnostics` of a Responses object: `cache_hit` -> no reason (as
        Anthropic's `diagnostics: null`), `cache_miss` -> its `reason`, else its `type`."""
        found = container.get("prompt_cache_diagnostics")
        if not isinstance(found, dict) or not isinstance(found.get("type"), str):
            return
        kind = found["type"]
        if kind == "cache_hit":
            self._miss_reason = None
        elif kind == "cache_miss":
            reason = found.get("reason")
            self._miss_reason = reason if isinstance(reason, str) else "other"
            missed = found.get("cache_missed_tokens")
            if isinstance(missed, int) and not isinstance(missed, bool):
                self._missed_tokens = missed
        else:
            self._miss_reason = kind

    def feed_json(self, body: Any) -> None:
        if isinstance(body, dict):
            self._take(body.get("usage"))
            self._take_id(body)
            self._take_output(body)
            self._take_diagnostics(body)

    def feed_event(self, event: str, data: Any) -> None:
        if not isinstance(data, dict):
            return
        response = data.get("response")
        if isinstance(response, dict):
            self._take_id(response)
            if data.get("type", event) in ("response.completed", "response.incomplete", "response.failed"):
                self._take(response.get("usage"))
                self._take_output(response)
                self._take_diagnostics(response)


class OpenAIAdapter(ABC):
    """What the OpenAI APIs share (profile, error shape, parameters, session hint, the read
    prediction); `OpenAIChatAdapter` and `OpenAIResponsesAdapter` add their API's data."""

    name: Final = "openai"
    api: OpenAIAPI
    """The API's body shape (`openai_request.CHAT` / `RESPONSES`)."""
    identity_optional: Mapping[str, frozenset[str]] = {}
    """Per message role, keys a client may drop on re-sending a message: none by default."""
    identity_nulls: Final = NULL_ABSENT

    def __init__(self, profile: Profile = DIRECT["openai"]) -> None:
        self.profile = profile

    @property
    def api_path(self) -> str:
        return self.api.path

    def error_body(self, kind: ErrorKind, message: str) -> bytes:
        """`{"error":{"message":...,"type":...,"param":null,"code":null}}` as the API answers,
        or the profile's platform shape (`platform_error_body`)."""
        platform = platform_error_body(self.profile.error_shape, kind, message)
        if platform is not None:
            return platform
        error = {"message": message, "type": ERROR_TYPES[kind.name], "param": None, "code": None}
        return orjson.dumps({"error": error})

    @abstractmethod
    def usage_reader(self) -> OpenAIUsage: ...

    def prefix_blocks(self, body: JSONObject) -> list[Block]:
        """Blocks in render order, flattened from `layout` (the one definition of the order)."""
        return list(RunBlocks(self.layout(body)))

    def params_fingerprint(self, body: JSONObject) -> JSONObject:
        """Prompt-affecting parameters outside the messages (docs/provider-rules.md 2.1)."""
        return {key: body[key] for key in PARAM_KEYS if key in body}

    def session_hint(self, body: JSONObject) -> tuple[str, str] | None:
        """`(field, id)` from `prompt_cache_key`, else `user` (a client-chosen grouping key), else
        `None`."""
        for key in ("prompt_cache_key", "user"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return key, value
        return None

    diagnostic_causes: Final = DIAGNOSTIC_CAUSES
    counts_tokens: Final = True
    """The automatic-cache read is counted in `o200k_base` tokens (`predict_read_tokens`)."""

    @abstractmethod
    def _offsets(self, body: JSONObject, count: Count, n_blocks: int) -> PromptOffsets | None:
        """The API's token offsets of `body` (`proxy.providers.openai_tokens`)."""

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
        """`(block, tokens)` of the cache read due by OpenAI's prefix caching (docs/provider-rules.md
        2.1, 2.3: no block lookback), on the token offsets of `proxy.providers.openai_tokens`
        counted with `count` (`o200k_base`), or with the bytes/4 estimate when `count` is `None`.
        `None` when the body's shape is not covered, and for a Claude model behind a gateway
        (`CLAUDE_CHAT_POLICY`: Anthropic's marker reads and its 20-position lookback apply)."""
        if self.marker_policy(body) is openai_request.CLAUDE_CHAT_POLICY:
            return None
        offsets = self._offsets(body, count or openai_tokens.estimate, n_blocks)
        if offsets is None:
            return None
        options = body.get("prompt_cache_options")
        mode = options.get("mode", "implicit") if isinstance(options, dict) else "implicit"
        return openai_tokens.predict_read(
            offsets,
            shared=shared,
            previous_blocks=previous_blocks,
            previous_breakpoints=previous_breakpoints,
            min_tokens=min_tokens,
            has_breakpoints=openai_request.has_breakpoints(body.get("model")),
            implicit=mode == "implicit",
        )

    def min_cacheable_tokens(self, model: str | None, default: int) -> int:
        own = self.profile.min_tokens_for(model)
        return own if own is not None else default

    def prefix_request(self, body: JSONObject, last: int) -> JSONObject | None:
        """Keep-warm pings only follow TTL markers (Anthropic): not cut here."""
        return None

    def with_cache_diagnostics(self, body: JSONObject, previous_id: str | None) -> JSONObject | None:
        """`None`: the API has no cache diagnostics (Responses overrides)."""
        return None

    # Request side (pipeline stages); implemented in proxy.providers.openai_request.

    def marker_policy(self, body: JSONObject) -> MarkerPolicy:
        """`prompt_cache_breakpoint` on GPT-5.6+, none before (docs/provider-rules.md 2.3)."""
        return openai_request.marker_policy(self.api, body)

    def layout(self, body: JSONObject) -> list[Run]:
        return openai_request.layout(self.api, body)

    def relayout(self, key: str, value: Any, previous: Any, runs: list[Run]) -> tuple[list[Run], int] | None:
        return None

    @property
    def prefix_keys(self) -> tuple[str, ...]:
        return self.api.prefix_keys

    @property
    def tool_shape(self) -> ToolShape:
        return self.api.tool_shape

    def as_block_list(self, run: Run) -> tuple[Any, tuple[str | int, ...]] | None:
        return openai_request.as_block_list(self.api, run)

    def system_units(self, body: JSONObject) -> list[SystemUnit]:
        return openai_request.system_units(self.api, body)

    def with_system(self, body: JSONObject, parts: Sequence[SystemPart]) -> JSONObject:
        return openai_request.with_system(self.api, body, parts)

    def with_user_text(self, body: JSONObject, texts: Sequence[str]) -> JSONObject | None:
        return openai_request.with_user_text(self.api, body, texts)

    def with_platform_markers(self, body: JSONObject, min_tokens: int, keep_ttl: bool) -> JSONObject | None:
        """Markers here are keys on blocks (the shared planner's): `None`."""
        return None


class OpenAIChatAdapter(OpenAIAdapter):
    """OpenAI Chat Completions (`POST /v1/chat/completions`), as served through `profile` (the API
    itself, Azure, an OpenAI-wire gateway such as LiteLLM or OpenRouter)."""

    api = openai_request.CHAT
    identity_optional = CHAT_OPTIONAL
    """Chat tool messages: `name` (the function's name, optional in
    `ChatCompletionToolMessageParam`; Hermes Agent drops it when it resumes a session, so the
    message is still the tool output it was: replay sends it with its `name` again)."""

    def usage_reader(self) -> ChatUsage:
        return ChatUsage()

    def _offsets(self, body: JSONObject, count: Count, n_blocks: int) -> PromptOffsets | None:
        return openai_tokens.chat_offsets(body, count, n_blocks)

    def marker_policy(self, body: JSONObject) -> MarkerPolicy:
        """`prompt_cache_breakpoint` on GPT-5.6+, none before (docs/provider-rules.md 2.3); Anthropic
        `cache_control` on content parts when the profile's gateway serves the model with
        Claude (`claude_models`: LiteLLM, OpenRouter; docs/provider-rules.md 6, 7)."""
        if self.profile.is_claude(body.get("model")):
            return openai_request.CLAUDE_CHAT_POLICY
        return openai_request.marker_policy(self.api, body)


class OpenAIResponsesAdapter(OpenAIAdapter):
    """OpenAI Responses (`POST /v1/responses`), as served through `profile`. Also the OpenAI
    family's adapter for its paths outside the pipeline (`/v1/embeddings`, `/v1/models` ...):
    only its error shape and usage reader apply to those."""

    api = openai_request.RESPONSES

    def usage_reader(self) -> ResponsesUsage:
        return ResponsesUsage()

    def _offsets(self, body: JSONObject, count: Count, n_blocks: int) -> PromptOffsets | None:
        return openai_tokens.responses_offsets(body, count, n_blocks)

    def with_cache_diagnostics(self, body: JSONObject, previous_id: str | None) -> JSONObject | None:
        """A copy of `body` with `prompt_cache_options.comparison_response_id = previous_id`
        (other `prompt_cache_options` kept), for GPT-5.6+ only (docs/provider-rules.md 9).

        `None` (body unchanged) for older models, without a previous response (there is no
        opt-in without a baseline), or when the client named a baseline itself."""
        if previous_id is None or not openai_request.has_breakpoints(body.get("model")):
            return None
        options = body.get("prompt_cache_options")
        if options is not None and not isinstance(options, dict):
            return None
        options = options or {}
        if "comparison_response_id" in options:
            return None
        return {**body, "prompt_cache_options": {**options, "comparison_response_id": previous_id}}
