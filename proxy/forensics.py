"""Offline divergence forensics: the pure core of `promptcache explain` (`proxy/explain.py`).

`explain(a, b, path)` -> `Explanation`: why request body B does (not) share the prefix of the
reference body A as sent to `path`. It makes the comparison live measurement makes, with the
same core (`proxy.divergence.compare`, the adapter's read rules), and adds what only an offline
diff can show:
- the first divergent block (index and body path, e.g. `system[2]`), the first differing value
  inside it (`system[2].text`, `first_difference`) and, for strings, the character offset;
- the byte offset of the first differing byte in the canonical stream (`proxy.prefix` block
  bytes, markers removed) and the estimated tokens before it (bytes / 4, rounded up);
- the cause (`proxy.divergence`); offline, `history_rewritten` means an earlier message of A
  (not its last one) changed (`proxy.divergence.is_rewrite`), and `expired` needs B's response
  usage;
- a short one-line before/after excerpt around the difference (`excerpt`, `EXCERPT_CHARS` of
  context on each side);
- the breakpoint plan lines a caller-supplied planner returns for B.

Invariants: no I/O, inputs never modified; `{}` as A means B is a first request; B "extends" A
when the cause is `none` and B has at least A's blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.divergence import compare, prompt_of, read_predictor, read_rules, reference_of, request_model
from proxy.prefix import MARKER_KEYS, PrefixChain, block_bytes, estimate_tokens
from proxy.providers import route
from proxy.providers.base import Block, JSONObject, ProviderAdapter, Usage

EXCERPT_CHARS: Final = 40
"""Characters of context on each side of the difference in an excerpt."""
ANTHROPIC_PATH: Final = "/v1/messages"
CHAT_PATH: Final = "/v1/chat/completions"
RESPONSES_PATH: Final = "/v1/responses"


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why B does (not) share A's prefix. Offsets are in B's canonical stream."""

    provider: str
    path: str
    """API path the bodies were read as (`/v1/messages`, `/v1/chat/completions`, `/v1/responses`)."""
    cause: str
    section: str
    extends: bool
    """B shares all of A's prefix (cause `none`, B not shorter): exit status 0."""
    block_index: int
    """First block B does not share with A (A's length for an append)."""
    block_path: str | None
    """Body path of that block in B (`system[2]`), `None` when no block differs."""
    field_path: str | None
    """Path of the first differing value inside it (`system[2].text`)."""
    char_offset: int | None
    """Character offset of the difference in the string at `field_path`, when it is a string."""
    byte_offset: int
    """First differing byte of the canonical stream (bytes before the divergence)."""
    tokens_before: int
    """Estimated tokens before `byte_offset`."""
    before: str | None
    """Excerpt of A around the difference."""
    after: str | None
    """Excerpt of B around the difference."""
    detail: str | None
    """One line on what changed outside the blocks (model, params) or in the block count."""
    a_blocks: int
    b_blocks: int
    a_bytes: int
    b_bytes: int
    predicted_read_tokens: int
    """Estimated tokens A's breakpoints let B read."""
    plan: tuple[str, ...] | None
    """Breakpoint plan promptcache would send for B, one line per marker; `None` = unavailable."""


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in MARKER_KEYS}
    return value


def first_difference(a: Any, b: Any, path: str) -> tuple[str, int | None, Any, Any]:
    """`(path, char offset or None, a leaf, b leaf)` of the first differing value, in key order.

    Marker keys are ignored (they are not part of the cached prefix). A renamed or reordered
    key is reported at the key; strings report the first differing character.
    """
    a, b = _strip(a), _strip(b)
    if isinstance(a, dict) and isinstance(b, dict):
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=False):
            if ka != kb:
                return f"{path}.{ka}", None, ka, kb
            if va != vb:
                return first_difference(va, vb, f"{path}.{ka}")
        if len(a) == len(b):
            return path, None, a, b  # equal but for markers below: nothing to point at
        longer = a if len(a) > len(b) else b
        extra = list(longer)[min(len(a), len(b))]
        return f"{path}.{extra}", None, a.get(extra), b.get(extra)
    if isinstance(a, list) and isinstance(b, list):
        for i, (va, vb) in enumerate(zip(a, b, strict=False)):
            if _strip(va) != _strip(vb):
                return first_difference(va, vb, f"{path}[{i}]")
        i = min(len(a), len(b))
        return f"{path}[{i}]", None, a[i] if i < len(a) else None, b[i] if i < len(b) else None
    if isinstance(a, str) and isinstance(b, str):
        n = 0
        limit = min(len(a), len(b))
        while n < limit and a[n] == b[n]:
            n += 1
        return path, n, a, b
    return path, None, a, b


def _common_prefix(x: bytes, y: bytes) -> int:
    n = 0
    limit = min(len(x), len(y))
    while n < limit and x[n] == y[n]:
        n += 1
    return n


def excerpt(value: Any, at: int | None) -> str:
    """A short, one-line excerpt of `value` around character `at` (whole value if not a string)."""
    if not isinstance(value, str):
        text = "(absent)" if value is None else orjson.dumps(value).decode()
        return _one_line(text[: 2 * EXCERPT_CHARS] + ("..." if len(text) > 2 * EXCERPT_CHARS else ""))
    at = at or 0
    start = max(0, at - EXCERPT_CHARS)
    end = at + EXCERPT_CHARS
    return _one_line(("..." if start else "") + value[start:end] + ("..." if end < len(value) else ""))


def _one_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _params_detail(adapter: ProviderAdapter, a: JSONObject, b: JSONObject) -> str:
    fa, fb = adapter.params_fingerprint(a), adapter.params_fingerprint(b)
    keys = [k for k in dict.fromkeys([*fa, *fb]) if fa.get(k) != fb.get(k)]
    return "parameters changed: " + ", ".join(keys)


def explain(
    a: JSONObject,
    b: JSONObject,
    path: str = ANTHROPIC_PATH,
    *,
    usage: Usage | None = None,
    planner: Any = None,
    is_volatile: Callable[[Block], bool] | None = None,
    min_tokens: int = 0,
    count: Callable[[str], int] | None = None,
) -> Explanation:
    """Compare request body `b` with the reference `a` as sent to `path` (see module docstring).

    `usage` is B's response usage (enables `expired`); `planner(adapter, body)` returns
    plan lines for B, or `None` when no planner is available (also when `planner` is `None`);
    `is_volatile(block)` says whether a changed system block matched a volatile rule;
    `min_tokens` is B's model's minimum cacheable prefix (tokens), below which nothing is read;
    `count` counts a text's tokens where the adapter's read rule can use it (OpenAI, `o200k_base`;
    `None`: its bytes/4 estimate), as live measurement does with the loaded tokenizer.
    """
    adapter, _ = route(path)
    # A's read rules (its markers); B's (the lookback and minimum its read is judged by)
    prompt_a = prompt_of(adapter, a, read_rules(adapter, a))
    rules = read_rules(adapter, b, min_tokens)
    prompt_b = prompt_of(adapter, b, rules)
    blocks_a, blocks_b = prompt_a.blocks, prompt_b.blocks
    chain_a, chain_b = prompt_a.chain, prompt_b.chain
    reference = reference_of(prompt_a) if a else None
    found = compare(
        reference,
        prompt_b,
        rules,
        previous_messages=[blk.message_index if blk.section == "messages" else None for blk in blocks_a],
        is_volatile=is_volatile,
        usage=usage,
        predictor=read_predictor(adapter, b, len(blocks_b), min_tokens, count),
    )
    divergence, cause, predicted = found.divergence, found.cause, found.predicted_read_tokens
    fields = _locate(divergence.section, divergence.block_index, blocks_a, blocks_b, chain_b)
    detail = _detail(divergence.cause, adapter, a, b, blocks_a, blocks_b)
    byte_offset = fields[4] if fields is not None else divergence.byte_offset
    return Explanation(
        provider=adapter.name,
        path=path,
        cause=cause,
        section=divergence.section,
        extends=divergence.cause == "none" and len(blocks_b) >= len(blocks_a),
        block_index=divergence.block_index,
        block_path=fields[0] if fields is not None else None,
        field_path=fields[1] if fields is not None else None,
        char_offset=fields[2] if fields is not None else None,
        byte_offset=byte_offset,
        tokens_before=estimate_tokens(byte_offset),
        before=fields[3][0] if fields is not None else None,
        after=fields[3][1] if fields is not None else None,
        detail=detail,
        a_blocks=len(blocks_a),
        b_blocks=len(blocks_b),
        a_bytes=chain_a.total_bytes,
        b_bytes=chain_b.total_bytes,
        predicted_read_tokens=predicted,
        plan=_plan(planner, adapter, b),
    )


def _plan(planner: Any, adapter: ProviderAdapter, body: JSONObject) -> tuple[str, ...] | None:
    if planner is None:
        return None
    lines = planner(adapter, body)
    return None if lines is None else tuple(lines)


def _locate(
    section: str, index: int, blocks_a: Sequence[Block], blocks_b: Sequence[Block], chain_b: PrefixChain
) -> tuple[str, str, int | None, tuple[str, str], int] | None:
    """Block path, field path, char offset, excerpts and exact byte offset of a changed block."""
    if section == "none" or index >= len(blocks_b) or index >= len(blocks_a):
        return None
    block_a, block_b = blocks_a[index], blocks_b[index]
    field, char, leaf_a, leaf_b = first_difference(block_a.value, block_b.value, block_b.path)
    within = _common_prefix(block_bytes(block_a), block_bytes(block_b))
    return (
        block_b.path,
        field,
        char,
        (excerpt(leaf_a, char), excerpt(leaf_b, char)),
        chain_b.bytes_before(index) + within,
    )


def _detail(
    cause: str,
    adapter: ProviderAdapter,
    a: JSONObject,
    b: JSONObject,
    blocks_a: Sequence[Block],
    blocks_b: Sequence[Block],
) -> str | None:
    if cause == "first_request":
        return "A is empty: B is a first request, nothing to read"
    if cause == "model_changed":
        return f"model changed: {request_model(a)!r} -> {request_model(b)!r} (the cache is per model)"
    if cause == "params_changed":
        return _params_detail(adapter, a, b)
    if cause == "none" and len(blocks_b) > len(blocks_a):
        return f"B appends {len(blocks_b) - len(blocks_a)} block(s) to A"
    if cause == "none" and len(blocks_b) < len(blocks_a):
        return f"B is A without its last {len(blocks_a) - len(blocks_b)} block(s)"
    if cause == "none":
        return "B's prefix is identical to A's"
    return None
