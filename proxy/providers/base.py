"""Provider adapter contract: everything provider-specific lives behind `ProviderAdapter`.

Shared code (handlers, forward, pipeline stages, measurement) talks to a provider only through
an adapter. An adapter knows:

- its routes and upstream (`name`, `pipeline_paths`),
- how to render an error body in the provider's own shape (`error_body`),
- how to read `Usage` from a JSON response body or from decoded SSE events (`UsageReader`),
- the provider's prefix order (`prefix_blocks`): the list of `Block`s the provider renders, in
  order, which every digest, divergence and breakpoint position is computed over.

Invariant: adapters are stateless and pure; the same input gives the same output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

JSONObject = dict[str, Any]
Section = Literal["tools", "system", "messages"]


@dataclass(frozen=True, slots=True)
class Block:
    """One unit of the provider's prefix order (DESIGN.md section 2).

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

    @property
    def cache_write(self) -> int:
        return self.cache_write_5m + self.cache_write_1h

    @property
    def prompt_total(self) -> int:
        return self.input_none + self.cache_read + self.cache_write


class UsageReader(Protocol):
    """Incremental usage reader for one response; fed JSON bodies or SSE events."""

    def feed_json(self, body: Any) -> None: ...

    def feed_event(self, event: str, data: Any) -> None: ...

    def result(self) -> Usage: ...


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """A local error the proxy itself answers with, before or instead of the upstream."""

    status: int
    anthropic_type: str
    openai_type: str


BAD_GATEWAY = ErrorKind(502, "api_error", "upstream_error")
GATEWAY_TIMEOUT = ErrorKind(504, "timeout_error", "timeout")
TOO_LARGE = ErrorKind(413, "request_too_large", "invalid_request_error")
BAD_REQUEST = ErrorKind(400, "invalid_request_error", "invalid_request_error")
NOT_FOUND = ErrorKind(404, "not_found_error", "invalid_request_error")


class ProviderAdapter(Protocol):
    """The provider-specific half of promptcache. See the module docstring."""

    name: str
    """`anthropic` or `openai`: also the `provider` metric label."""
    pipeline_paths: frozenset[str]
    """Request paths (without a routing prefix) that run through the pipeline."""

    def error_body(self, kind: ErrorKind, message: str) -> bytes: ...

    def usage_reader(self, path: str) -> UsageReader: ...

    def prefix_blocks(self, path: str, body: JSONObject) -> list[Block]: ...

    def params_fingerprint(self, path: str, body: JSONObject) -> JSONObject: ...


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
