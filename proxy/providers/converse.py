"""Bedrock Converse adapter (`POST /model/{modelId}/converse`, `/converse-stream`).

Provider rules (AWS Bedrock prompt-caching and Converse API docs; docs/provider-rules.md 4, 9):

- prefix order `toolConfig.tools` -> `system` -> `messages`; blocks are single-key objects
  (`{"text": ...}`, `{"toolUse": ...}`, `{"toolResult": ...}`, `{"cachePoint": ...}`);
- cache checkpoints are `cachePoint` blocks, placed by `with_platform_markers`
  (`proxy.providers.converse_request`), not by the shared planner (their marker is a sibling
  block, not a key): the shared policy allows 0 markers;
- usage: `inputTokens` (not cached), `outputTokens`, `cacheReadInputTokens`,
  `cacheWriteInputTokens`; `cacheDetails` (`[{"ttl": "1h", "inputTokens": N}]`) splits the
  writes by TTL. Streamed (`converse-stream`, AWS event-stream) usage is on the `metadata` event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from proxy.profiles import DIRECT, Profile
from proxy.providers import converse_request
from proxy.providers.base import (
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

CONVERSE_PATH: Final = "/converse"
_USAGE_KEYS: Final = ("inputTokens", "outputTokens", "cacheReadInputTokens", "cacheWriteInputTokens")
POLICY: Final = MarkerPolicy(key=converse_request.CACHE_POINT, max_markers=0, kinds=frozenset(), lookback=20)
"""Checkpoints are blocks the adapter places itself (`with_platform_markers`), so the shared
planner places none; reads walk back about 20 blocks from a checkpoint, as on the Messages API
(docs/provider-rules.md 1.5, 4)."""
TOOL_SHAPE: Final = ToolShape(name_path=("toolSpec", "name"), schema_path=("toolSpec", "inputSchema", "json"))


class ConverseUsage:
    """Usage reader for one Converse response (JSON body or `metadata` stream event)."""

    def __init__(self) -> None:
        self._fields = LastWins()
        self._one_hour = 0
        self._seen = False

    def _take(self, usage: Any) -> None:
        if self._fields.update(usage, _USAGE_KEYS):
            self._seen = True
        details = usage.get("cacheDetails") if isinstance(usage, dict) else None
        if isinstance(details, list):
            self._one_hour = sum(
                d.get("inputTokens", 0)
                for d in details
                if isinstance(d, dict) and d.get("ttl") == "1h" and isinstance(d.get("inputTokens"), int)
            )

    def feed_json(self, body: Any) -> None:
        if isinstance(body, dict):
            self._take(body.get("usage"))

    def feed_event(self, event: str, data: Any) -> None:
        if isinstance(data, dict) and (event == "metadata" or "usage" in data):
            self._take(data.get("usage"))

    def result(self) -> Usage:
        written = self._fields.get("cacheWriteInputTokens")
        one_hour = min(self._one_hour, written)
        return Usage(
            input_none=self._fields.get("inputTokens"),
            cache_read=self._fields.get("cacheReadInputTokens"),
            cache_write_5m=written - one_hour,
            cache_write_1h=one_hour,
            output=self._fields.get("outputTokens"),
            seen=self._seen,
        )


class ConverseAdapter:
    """Bedrock's Converse API, metered under the `anthropic` provider label and upstream."""

    name: Final = "anthropic"
    api_path: Final = CONVERSE_PATH

    def __init__(self, profile: Profile = DIRECT["anthropic"]) -> None:
        self.profile = profile

    def error_body(self, kind: ErrorKind, message: str) -> bytes:
        """The runtime API's `{"message": ...}` (or the profile's platform shape)."""
        return platform_error_body(self.profile.error_shape or "aws", kind, message) or orjson.dumps(
            {"message": message}
        )

    def usage_reader(self) -> ConverseUsage:
        return ConverseUsage()

    def prefix_blocks(self, body: JSONObject) -> list[Block]:
        return list(RunBlocks(self.layout(body)))

    def params_fingerprint(self, body: JSONObject) -> JSONObject:
        """Prompt-affecting parameters outside the blocks: tool choice, model-specific fields."""
        config = body.get("toolConfig")
        out = {"toolChoice": config["toolChoice"]} if isinstance(config, dict) and "toolChoice" in config else {}
        if "additionalModelRequestFields" in body:
            out["additionalModelRequestFields"] = body["additionalModelRequestFields"]
        return out

    def session_hint(self, body: JSONObject) -> tuple[str, str] | None:
        return None

    identity_optional: Final[Mapping[str, frozenset[str]]] = {}
    """None: every key of a message is part of it."""
    identity_nulls: Final = None
    """None: the AWS SDKs never send a null (boto3 rejects `None` before sending), so no rule
    of the API's is known; every null is part of a message."""

    def prefix_request(self, body: JSONObject, last: int) -> JSONObject | None:
        """Keep-warm pings only follow TTL markers (Anthropic): not cut here."""
        return None

    diagnostic_causes: Final[Mapping[str | None, frozenset[str]]] = {}
    counts_tokens: Final = False
    """Reads follow the checkpoints (`predict_read_tokens` counts nothing)."""
    """Converse has no cache diagnostics."""

    def with_cache_diagnostics(self, body: JSONObject, previous_id: str | None) -> JSONObject | None:
        return None

    def marker_policy(self, body: JSONObject) -> MarkerPolicy:
        return POLICY

    def layout(self, body: JSONObject) -> list[Run]:
        return converse_request.layout(body)

    def relayout(self, key: str, value: Any, previous: Any, runs: list[Run]) -> tuple[list[Run], int] | None:
        return None

    prefix_keys: Final = converse_request.PREFIX_KEYS
    tool_shape: Final = TOOL_SHAPE

    def as_block_list(self, run: Run) -> tuple[Any, tuple[str | int, ...]] | None:
        return None

    def system_units(self, body: JSONObject) -> list[SystemUnit]:
        return []

    def with_system(self, body: JSONObject, parts: Sequence[SystemPart]) -> JSONObject:
        return body

    def with_user_text(self, body: JSONObject, texts: Sequence[str]) -> JSONObject | None:
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
        """Reads follow the checkpoints within `POLICY`'s lookback: `None`."""
        return None

    def min_cacheable_tokens(self, model: str | None, default: int) -> int:
        own = self.profile.min_tokens_for(model)
        return own if own is not None else default

    def with_platform_markers(self, body: JSONObject, min_tokens: int, keep_ttl: bool) -> JSONObject:
        """`cachePoint` blocks placed (`converse_request.place_cache_points`)."""
        return converse_request.place_cache_points(body, min_tokens, keep_ttl)
