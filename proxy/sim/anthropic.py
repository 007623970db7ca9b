"""Anthropic Messages: request validation, prefix rendering and cache accounting (pure core).

Contract (docs/provider-rules.md section 1; each rule names its subsection):
- `parse_request(body, betas, counter, settings)` validates a `/v1/messages` body and returns a
  `Prompt`: the blocks in prefix order tools -> system -> messages (1.5), each with its token count,
  cumulative count, chained digest, lookback position and marker; or raises `Rejected` (400) with
  the API's error text (1.2-1.4, 1.7, section 7).
- Block digest = xxh3-128 of the block's JSON minus `cache_control` (a `null` marker is no marker)
  and minus its other null-valued keys (an SDK's `model_dump()` writes `"citations": null`; the
  API validates the block into its typed form, where a null optional field is the field not
  given, and renders the prompt from that: `_strip`); the first block of a message also hashes
  its role. The chain mixes in a system-level params
  fingerprint before the first system position and a messages-level one before the first message
  (1.8), so tool entries survive `tool_choice` changes and system entries survive image or
  thinking changes, while tool definitions invalidate everything.
- `plan_cache(prompt, settings, tenant, now, store)` returns the `Usage` and the entries to write:
  each breakpoint checks its own position and walks back up to `lookback_positions` positions
  (a run of consecutive `tool_use` or of `tool_result` blocks is one position) for an entry some
  earlier response wrote (1.5); writes happen only at breakpoints past the highest hit whose
  cumulative prefix reaches the model minimum (1.6); billing with mixed TTLs follows 1.7's A/B/C.
  Hits are refreshed from `now` (request start, 1.7).

Token approximation per block (see `tokens.py`): tool definition = its JSON minus `cache_control`;
text = `text`; image = `IMAGE_TOKENS`; document = its text, else `DOCUMENT_TOKENS`; tool_use =
`name` + JSON of `input`; tool_result = its content (string, or the sum over inner blocks);
thinking = `thinking`; redacted_thinking = `data`; any other block = its JSON minus
`cache_control`; plus `MESSAGE_OVERHEAD` tokens on the first block of every message.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
import xxhash

from proxy.sim.cache import CacheStore, Entry
from proxy.sim.config import AnthropicModel
from proxy.sim.errors import Rejected
from proxy.sim.tokens import DOCUMENT_TOKENS, IMAGE_TOKENS, TokenCounter

MESSAGE_OVERHEAD: Final = 3
"""Tokens added to the first block of each message (role and turn delimiters)."""
TTL_SECONDS: Final = {"5m": 300.0, "1h": 3600.0}
"""Marker TTLs (docs/provider-rules.md 1.2, 1.7)."""

_NO_MARKER_TYPES: Final = frozenset({"thinking", "redacted_thinking"})
_RUN_TYPES: Final = frozenset({"tool_use", "tool_result"})
_TTL_ORDER_MSG: Final = (
    "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block. "
    "Note that blocks are processed in the following order: `tools`, `system`, `messages`."
)
_NESTED_MARKER_MSG: Final = (
    "cache_control may not be specified within tool_result.content. Instead, place it directly on tool_result"
)
_HIDDEN_MSG: Final = (
    "called by code execution cannot have cache_control. These blocks are not rendered in Claude's context."
)
"""Programmatic tool calling (1.3): a `tool_use` whose `caller` is the code-execution tool, and
its `tool_result`, are not rendered in the model's context; a marker on either is a 400 (the
result's wording is the API's as quoted in langchain PR #34579, the `tool_use` one follows it)."""
_CODE_EXECUTION: Final = "code_execution"


@dataclass(slots=True)
class Block:
    """One position-bearing unit of the rendered prefix."""

    path: str
    """Request path of the block, e.g. `messages.3.content.1` (used in error texts)."""
    level: str
    """`tools`, `system` or `messages`."""
    kind: str
    """Block type (`tool` for a tool definition)."""
    tokens: int
    digest: bytes
    """16-byte digest of the block alone (JSON minus `cache_control`, plus the role on a
    message's first block)."""
    cumulative: int = 0
    """Tokens of the whole prefix up to and including this block."""
    chain: bytes = b""
    """16-byte chained digest of the prefix up to and including this block."""
    position: int = 0
    """Lookback position (runs of tool_use / tool_result share one)."""
    ttl: str | None = None
    """Marker TTL (`5m` / `1h`) when the block carries a breakpoint."""
    is_eligible: bool = True
    """May carry a marker (not thinking, not empty text)."""


@dataclass(slots=True)
class Prompt:
    """A validated request, rendered."""

    model: str
    blocks: list[Block]
    breakpoints: list[int]
    """Indices into `blocks` carrying a marker (explicit or automatic), ascending."""
    total_tokens: int


@dataclass(frozen=True, slots=True)
class Usage:
    """Input-side usage exactly as the API reports it (docs/provider-rules.md 1.10)."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int

    def as_dict(self, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.ephemeral_5m_input_tokens,
                "ephemeral_1h_input_tokens": self.ephemeral_1h_input_tokens,
            },
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }


@dataclass(slots=True)
class CachePlan:
    usage: Usage
    writes: list[Entry]
    """Entries to `commit` when the response starts."""


DIRECT_MARKER_KEYS: Final = frozenset({"type", "ttl", "scope"})
"""`cache_control` keys Anthropic's own API accepts (1.2)."""


def bad(message: str) -> Rejected:
    return Rejected(400, message)


# --- parsing and validation -------------------------------------------------------------


def parse_request(
    body: Mapping[str, Any],
    betas: frozenset[str],
    counter: TokenCounter,
    settings: AnthropicModel,
    *,
    require_max_tokens: bool = True,
    marker_keys: frozenset[str] = DIRECT_MARKER_KEYS,
) -> Prompt:
    """Validate and render a Messages request body; raises `Rejected` (400).

    `marker_keys`: the `cache_control` keys the platform accepts (`proxy.sim.platforms`)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model: Field required")
    if require_max_tokens:
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise bad("max_tokens: Field required")
        if max_tokens < 0:
            raise bad("max_tokens: Input should be greater than or equal to 0")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages: Field required" if messages is None else "messages: at least one message is required")

    blocks: list[Block] = []
    has_images = False
    hidden: set[Any] = set()
    for level, path, raw, role in _iter_blocks(body):
        kind = "tool" if level == "tools" else str(raw["type"])
        _check_hidden(raw, kind, hidden)
        ttl = _marker_ttl(raw, path, kind, settings, marker_keys)
        if kind == "image" or (kind == "tool_result" and _has_nested_image(raw)):
            has_images = True
        tokens = _block_tokens(kind, raw, counter) + (MESSAGE_OVERHEAD if role else 0)
        is_eligible = kind not in _NO_MARKER_TYPES and not (kind == "text" and raw.get("text") == "")
        blocks.append(Block(path, level, kind, tokens, _block_digest(raw, role), ttl=ttl, is_eligible=is_eligible))

    explicit = sum(1 for b in blocks if b.ttl is not None)
    if explicit > settings.max_breakpoints:
        raise bad(
            f"A maximum of {settings.max_breakpoints} blocks with cache_control may be provided. Found {explicit}."
        )
    _place_automatic(body, blocks, explicit, settings, marker_keys)
    _check_ttl_order(blocks)
    _chain(body, blocks, betas, settings, has_images)
    breakpoints = [i for i, b in enumerate(blocks) if b.ttl is not None]
    total = blocks[-1].cumulative if blocks else 0
    return Prompt(model, blocks, breakpoints, total)


def _iter_blocks(body: Mapping[str, Any]) -> Iterator[tuple[str, str, dict[str, Any], str | None]]:
    """(level, path, block, role-if-first-block-of-a-message) in prefix order (1.5)."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad("tools: Input should be a valid list")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad(f"tools.{i}: Input should be a valid dictionary")
        _check_tool(tool, i)
        yield "tools", f"tools.{i}", tool, None
    system = body.get("system")
    if isinstance(system, str):
        if system:
            yield "system", "system", {"type": "text", "text": system}, None
    elif isinstance(system, list):
        for i, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise bad(f"system.{i}.type: Input should be 'text'")
            if not isinstance(block.get("text"), str):
                raise bad(f"system.{i}.text: Field required")
            yield "system", f"system.{i}", block, None
    elif system is not None:
        raise bad("system: Input should be a valid string or list")
    for i, message in enumerate(body["messages"]):
        if not isinstance(message, dict):
            raise bad(f"messages.{i}: Input should be a valid dictionary")
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise bad(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            yield "messages", f"messages.{i}.content", {"type": "text", "text": content}, role
        elif isinstance(content, list):
            if not content:
                raise bad(f"messages.{i}: all messages must have non-empty content")
            for j, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise bad(f"messages.{i}.content.{j}.type: Field required")
                if block["type"] == "text" and not isinstance(block.get("text"), str):
                    # a null text is no text (`_strip` digests it as absent): the API refuses both
                    problem = "Input should be a valid string" if "text" in block else "Field required"
                    raise bad(f"messages.{i}.content.{j}.text.text: {problem}")
                yield "messages", f"messages.{i}.content.{j}", block, role if j == 0 else None
        else:
            raise bad(f"messages.{i}.content: Field required")


def _check_hidden(block: Mapping[str, Any], kind: str, hidden: set[Any]) -> None:
    """Reject a marker on a code-execution-called `tool_use` or its `tool_result` (`_HIDDEN_MSG`);
    `hidden` collects the ids of such calls seen so far (a result follows its call)."""
    if kind == "tool_use":
        caller = block.get("caller")
        caller_type = caller.get("type") if isinstance(caller, dict) else None
        if isinstance(caller_type, str) and caller_type.startswith(_CODE_EXECUTION):
            hidden.add(block.get("id"))
            if block.get("cache_control") is not None:
                raise bad(f"Tool use {block.get('id')} {_HIDDEN_MSG}")
    elif kind == "tool_result" and block.get("cache_control") is not None:
        ref = block.get("tool_use_id")
        if ref in hidden:
            raise bad(f"Tool use result for {ref} {_HIDDEN_MSG}")


def _marker_ttl(
    block: Mapping[str, Any], path: str, kind: str, settings: AnthropicModel, marker_keys: frozenset[str]
) -> str | None:
    """The block's marker TTL, or None; raises for forbidden placements (1.3, section 7)."""
    if kind == "tool_result":
        inner = block.get("content")
        if isinstance(inner, list):
            for item in inner:
                if isinstance(item, dict) and item.get("cache_control") is not None:
                    raise bad(_NESTED_MARKER_MSG)
    cc = block.get("cache_control")
    if cc is None:
        return None
    if kind in _NO_MARKER_TYPES:
        raise bad(f"{path}.{kind}.cache_control: Extra inputs are not permitted")
    if kind == "text" and block.get("text") == "":
        raise bad(f"{path}.text: cache_control cannot be set for empty text blocks")
    return validate_cache_control(cc, f"{path}.cache_control", settings, marker_keys)


def _check_tool(tool: Mapping[str, Any], i: int) -> None:
    """A tool's `name` is a string; a custom tool (no `type`, or `custom`) has one and an object
    `input_schema` (the API's validation wording)."""
    kind = tool.get("type")
    label = "custom" if kind in (None, "custom") else str(kind)
    if "name" in tool and not isinstance(tool["name"], str):
        raise bad(f"tools.{i}.{label}.name: Input should be a valid string")
    if label == "custom":
        if "name" not in tool:
            raise bad(f"tools.{i}.custom.name: Field required")
        if "input_schema" not in tool:
            raise bad(f"tools.{i}.custom.input_schema: Field required")
        if not isinstance(tool["input_schema"], dict):
            raise bad(f"tools.{i}.custom.input_schema: Input should be a valid dictionary")


def validate_cache_control(
    cc: Any, path: str, settings: AnthropicModel, marker_keys: frozenset[str] = DIRECT_MARKER_KEYS
) -> str:
    """Check a `cache_control` object (1.2); returns its TTL (`5m` when absent).

    A key outside `marker_keys` is refused: `scope` on Vertex / Bedrock / Foundry ("Extra inputs
    are not permitted", 1.2), `ttl` on a strict compatible server ("`cache_control.ttl: 1h` is
    not supported", 1.7)."""
    if not isinstance(cc, dict):
        raise bad(f"{path}: Input should be a valid dictionary")
    if cc.get("type") != "ephemeral":
        raise bad(f"{path}.type: Input should be 'ephemeral'")
    for key in cc:
        if key == "ttl" and key not in marker_keys and key in DIRECT_MARKER_KEYS:
            raise bad(f"`cache_control.ttl: {cc['ttl']}` is not supported")
        if key not in marker_keys:
            raise bad(f"{path}.ephemeral.{key}: Extra inputs are not permitted")
    if "scope" in cc and not isinstance(cc["scope"], str):
        raise bad(f"{path}.ephemeral.scope: Input should be a valid string")
    ttl = cc.get("ttl", "5m")
    if not isinstance(ttl, str) or ttl not in TTL_SECONDS:
        raise bad(f"{path}.ephemeral.ttl: Input should be '5m' or '1h'")
    if ttl not in settings.ttls:
        raise bad(f"`cache_control.ttl: {ttl}` is not supported")
    return str(ttl)


def _place_automatic(
    body: Mapping[str, Any],
    blocks: list[Block],
    explicit: int,
    settings: AnthropicModel,
    marker_keys: frozenset[str] = DIRECT_MARKER_KEYS,
) -> None:
    """Top-level `cache_control`: a marker on the last eligible block (1.1)."""
    cc = body.get("cache_control")
    if cc is None:
        return
    ttl = validate_cache_control(cc, "cache_control", settings, marker_keys)
    target = next((b for b in reversed(blocks) if b.is_eligible), None)
    if target is None:
        return  # nothing eligible: caching silently skipped
    if target.ttl is not None:
        if target.ttl != ttl:
            raise bad(
                f"cache_control: the top-level cache_control (ttl='{ttl}') conflicts with the "
                f"cache_control on the last cacheable block {target.path} (ttl='{target.ttl}')"
            )
        return  # same TTL already there: no-op
    if explicit >= settings.max_breakpoints:
        raise bad(
            f"A maximum of {settings.max_breakpoints} blocks with cache_control may be provided. Found {explicit + 1}."
        )
    target.ttl = ttl


def _check_ttl_order(blocks: list[Block]) -> None:
    """1h markers may not follow a 5m marker in prefix order (1.7)."""
    seen_5m = False
    for b in blocks:
        if b.ttl == "5m":
            seen_5m = True
        elif b.ttl == "1h" and seen_5m:
            raise bad(f"{b.path}.cache_control.ttl: {_TTL_ORDER_MSG}")


# --- rendering --------------------------------------------------------------------------


def _strip(block: Mapping[str, Any]) -> dict[str, Any]:
    """`block` as the API renders it: without its marker and its null-valued keys (a null
    optional field is the field absent, module docstring; nulls inside values are data)."""
    return {k: v for k, v in block.items() if k != "cache_control" and v is not None}


def _block_digest(block: Mapping[str, Any], role: str | None) -> bytes:
    head = b"\x1emsg:" + role.encode() + b"\x1f" if role else b""
    return xxhash.xxh3_128_digest(head + orjson.dumps(_strip(block)))


def _json_tokens(value: Any, counter: TokenCounter) -> int:
    return counter.count(orjson.dumps(value).decode())


def _block_tokens(kind: str, block: Mapping[str, Any], counter: TokenCounter) -> int:
    """Tokens of one block, per the table in the module docstring."""
    if kind == "tool":
        return _json_tokens(_strip(block), counter)
    if kind == "text":
        return counter.count(str(block.get("text", "")))
    if kind == "image":
        return IMAGE_TOKENS
    if kind == "document":
        source = block.get("source") or {}
        if isinstance(source, dict) and source.get("type") == "text":
            return counter.count(str(source.get("data", "")))
        return DOCUMENT_TOKENS
    if kind in ("tool_use", "server_tool_use"):
        return counter.count(str(block.get("name", ""))) + _json_tokens(block.get("input", {}), counter)
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, str):
            return counter.count(content)
        if isinstance(content, list):
            return sum(_block_tokens(str(c.get("type", "")), c, counter) if isinstance(c, dict) else 0 for c in content)
        return 0
    if kind == "thinking":
        return counter.count(str(block.get("thinking", "")))
    if kind == "redacted_thinking":
        return counter.count(str(block.get("data", "")))
    return _json_tokens(_strip(block), counter)


def _has_nested_image(block: Mapping[str, Any]) -> bool:
    content = block.get("content")
    return isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "image" for c in content)


def params_fingerprints(
    body: Mapping[str, Any], betas: frozenset[str], settings: AnthropicModel, has_images: bool
) -> tuple[bytes, bytes]:
    """(system-level, messages-level) fingerprints of the prompt-affecting parameters (1.8).

    System level (invalidates system + messages): `speed`, the `anthropic-beta` set,
    `context_management`, output format. Messages level (invalidates messages only):
    `tool_choice` (with `disable_parallel_tool_use`), thinking config, `output_config.effort`
    (the model default counts as omitted), images present.
    """
    raw_config = body.get("output_config")
    output_config: Mapping[str, Any] = raw_config if isinstance(raw_config, dict) else {}
    fmt = body.get("output_format") or output_config.get("format")
    system_fp = orjson.dumps(
        [body.get("speed") or "standard", sorted(betas), body.get("context_management"), fmt],
        option=orjson.OPT_SORT_KEYS,
    )
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        thinking = None
    effort = output_config.get("effort")
    if effort == settings.default_effort:
        effort = None
    tool_choice = body.get("tool_choice") or {"type": "auto"}
    messages_fp = orjson.dumps([tool_choice, thinking, effort, has_images], option=orjson.OPT_SORT_KEYS)
    return system_fp, messages_fp


def _chain(
    body: Mapping[str, Any],
    blocks: list[Block],
    betas: frozenset[str],
    settings: AnthropicModel,
    has_images: bool,
) -> None:
    """Fill `chain`, `cumulative` and `position` in place."""
    system_fp, messages_fp = params_fingerprints(body, betas, settings, has_images)
    chain = b"\x00" * 16
    level = "tools"
    cumulative = 0
    position = -1
    previous_kind = ""
    for b in blocks:
        if level == "tools" and b.level != "tools":
            chain = xxhash.xxh3_128_digest(chain + b"\x1dsystem-params" + system_fp)
            level = "system"
        if level == "system" and b.level == "messages":
            chain = xxhash.xxh3_128_digest(chain + b"\x1dmessages-params" + messages_fp)
            level = "messages"
        chain = xxhash.xxh3_128_digest(chain + b.digest)
        b.chain = chain
        cumulative += b.tokens
        b.cumulative = cumulative
        if not (b.kind in _RUN_TYPES and b.kind == previous_kind):
            position += 1
        b.position = position
        previous_kind = b.kind


# --- cache accounting -------------------------------------------------------------------


def namespace(model: str) -> str:
    return f"anthropic/{model}"


def plan_cache(prompt: Prompt, settings: AnthropicModel, tenant: str, now: float, store: CacheStore) -> CachePlan:
    """Reads, writes and usage for one request (1.5-1.7, 1.10). Refreshes hits at `now`."""
    ns = namespace(prompt.model)
    blocks = prompt.blocks
    hit = -1
    for bp in prompt.breakpoints:
        own = blocks[bp]
        i = bp
        while i >= 0 and own.position - blocks[i].position < settings.lookback_positions:
            entry = store.lookup(tenant, ns, blocks[i].chain, now)
            if entry is not None:
                ttl = TTL_SECONDS[own.ttl] if i == bp and own.ttl else None
                store.touch(entry, now, ttl)
                hit = max(hit, i)
                break
            i -= 1
    read = blocks[hit].cumulative if hit >= 0 else 0
    writers = [bp for bp in prompt.breakpoints if bp > hit and blocks[bp].cumulative >= settings.min_cache_tokens]
    last = blocks[writers[-1]].cumulative if writers else read
    one_hour = max((blocks[bp].cumulative for bp in writers if blocks[bp].ttl == "1h"), default=read)
    usage = Usage(
        input_tokens=prompt.total_tokens - last,
        cache_creation_input_tokens=last - read,
        cache_read_input_tokens=read,
        ephemeral_5m_input_tokens=last - one_hour,
        ephemeral_1h_input_tokens=one_hour - read,
    )
    writes = []
    for bp in writers:
        b = blocks[bp]
        ttl = TTL_SECONDS[b.ttl or "5m"]
        writes.append(Entry(tenant, ns, b.chain, b.cumulative, ttl, now + ttl, b.ttl or "5m"))
    return CachePlan(usage, writes)
