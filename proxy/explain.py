"""`promptcache explain A.json B.json`: offline forensics of why B would miss A's cache.

The command side: read the two inputs, pick the API they were sent to, run the pure core
(`proxy.forensics.explain`, re-exported here with `Explanation`), ask the breakpoint planner what
promptcache would send for B, and print the result for a person (`render`).

Inputs: each file holds one request body, or one line of a recorded trace (`{"gap", "path",
"headers", "body"}`, `proxy/trace_recorder.py`), whose `body` is used and whose `path` and `headers` say
which API it went to. A is the reference (the previous request); `{}` as A means B is a first
request. Neither input is modified.

API detection (`detect_path`, `--provider auto`): a trace line's `path` wins; otherwise the
shape of both bodies is scored (`body_signals`), since a single key rarely decides it. Anthropic
Messages signals: `anthropic-version` / `anthropic-beta` in a recorded headers object, top-level
`system`, `cache_control` anywhere, `input_schema` tools, Anthropic-only content block types
(`tool_use`, `tool_result`, `thinking`, `image`, `document` ...), top-level `thinking`,
`stop_sequences`, `top_k`, `output_config`, `context_management`, a `tool_choice` of type
`any`/`tool`, and, weakly, `max_tokens` with typed content blocks and a `claude` model. OpenAI
signals: `input` / `instructions` / `previous_response_id` (Responses), `tool_calls`, roles `tool`
and `developer`, `function` tools, OpenAI-only content parts (`image_url`, `input_text` ...),
`prompt_cache_breakpoint`, `prompt_cache_key` / `_retention` / `_options`, `response_format`,
`stream_options`, `max_completion_tokens`, `reasoning_effort`, and, weakly, a `gpt-`/`o`-series
model. A `system`-role message inside `messages` is only a weak OpenAI signal: Anthropic accepts
it too (docs/provider-rules.md 1.8; Claude Code sends one). The side with more weight wins; a tie is
Anthropic. `--provider openai` picks Responses when a Responses signal is present, else Chat.

`--html FILE` also writes the forensic map of the pair (`pair_view`, `proxy.ui.page.session_page`):
one self-contained HTML file (no network) with B's blocks in render order, one row per request
(A, then B) and the divider. Without `--response` the rows' token figures are estimates: A
writes up to its last marker; B reads what A's markers let it read (`predicted_read_tokens`)
and writes up to its own last marker; the rest is uncached.

The expected read is counted as a live proxy counts it: OpenAI's in `o200k_base` tokens
(`token_count`), Anthropic's by bytes/4 (`proxy.divergence`).

Exit status: 0 when B extends A, 1 otherwise, 2 when an input or the rules cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

import orjson

from proxy.divergence import marker_positions, read_rules, request_model
from proxy.forensics import (
    ANTHROPIC_PATH,
    CHAT_PATH,
    RESPONSES_PATH,
    Explanation,
    excerpt,
    explain,
    first_difference,
)
from proxy.measure import volatile_checker
from proxy.prefix import estimate_tokens
from proxy.providers import route
from proxy.providers.base import JSONObject, ProviderAdapter, Usage
from proxy.rules import RuleError, load_rules

__all__ = [
    "Explanation",
    "RequestInput",
    "add_arguments",
    "body_signals",
    "detect_path",
    "excerpt",
    "explain",
    "explain_command",
    "pair_view",
    "first_difference",
    "plan_lines",
    "render",
    "run",
]

STRONG: Final = 2
"""Weight of a signal only one API's requests carry."""
WEAK: Final = 1
"""Weight of a signal that merely leans one way (a model name, a key both APIs accept)."""
DECISIVE: Final = 8
"""Weight of a recorded `anthropic-*` header: outweighs any body shape."""
_OPENAI_MODEL_PREFIXES: Final = ("gpt-", "o1", "o3", "o4", "chatgpt-", "codex-")
_ANTHROPIC_BLOCKS: Final = frozenset(
    {
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "image",
        "document",
        "search_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "container_upload",
        "tool_reference",
    }
)
_OPENAI_PARTS: Final = frozenset(
    {"image_url", "input_audio", "file", "input_text", "input_image", "input_file", "output_text", "refusal"}
)
_ANTHROPIC_KEYS: Final = (
    "system",
    "thinking",
    "stop_sequences",
    "top_k",
    "output_config",
    "context_management",
)
_OPENAI_KEYS: Final = (
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "response_format",
    "stream_options",
    "max_completion_tokens",
    "reasoning_effort",
)
_RESPONSES_KEYS: Final = ("input", "instructions", "previous_response_id")
_PATHS: Final = frozenset({ANTHROPIC_PATH, CHAT_PATH, RESPONSES_PATH})


# --- inputs and detection ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestInput:
    """One input file: the request body, plus the path and headers when it is a trace line."""

    body: JSONObject
    path: str | None = None
    headers: Mapping[str, str] | None = None


def request_input(data: JSONObject) -> RequestInput:
    """A trace line (`body` object next to `path` or `headers`) unwrapped, else the body itself."""
    body = data.get("body")
    if isinstance(body, dict) and ("path" in data or "headers" in data):
        path = data.get("path")
        headers = data.get("headers")
        return RequestInput(
            body,
            path if path in _PATHS else None,
            {str(k).lower(): str(v) for k, v in headers.items()} if isinstance(headers, dict) else None,
        )
    return RequestInput(data)


@dataclass(frozen=True, slots=True)
class Signals:
    """Weighted evidence of which API a body was written for (see the module docstring)."""

    anthropic: int = 0
    openai: int = 0
    responses: bool = False
    """A Responses-only key is present."""

    def __add__(self, other: Signals) -> Signals:
        return Signals(
            self.anthropic + other.anthropic, self.openai + other.openai, self.responses or other.responses
        )


def _blocks(body: JSONObject) -> list[dict[str, Any]]:
    """Content blocks / parts of every message or input item, plus the system blocks."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    containers: list[Any] = [system] if isinstance(system, list) else []
    for key in ("messages", "input"):
        items = body.get(key)
        if isinstance(items, list):
            containers.extend(m.get("content") for m in items if isinstance(m, dict))
    for content in containers:
        if isinstance(content, list):
            out.extend(b for b in content if isinstance(b, dict))
    return out


def body_signals(body: JSONObject, headers: Mapping[str, str] | None = None) -> Signals:
    """The weighted Anthropic / OpenAI evidence in one body (and its recorded headers)."""
    anthropic = openai = 0
    if headers and any(h in headers for h in ("anthropic-version", "anthropic-beta")):
        anthropic += DECISIVE
    anthropic += STRONG * sum(1 for k in _ANTHROPIC_KEYS if k in body)
    openai += STRONG * sum(1 for k in _OPENAI_KEYS if k in body)
    responses = any(k in body for k in _RESPONSES_KEYS)
    openai += STRONG * sum(1 for k in _RESPONSES_KEYS if k in body)
    tool_choice = body.get("tool_choice")
    if isinstance(tool_choice, dict) and tool_choice.get("type") in ("any", "tool"):
        anthropic += STRONG
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    if any("input_schema" in t for t in tools):
        anthropic += STRONG
    if any(isinstance(t.get("function"), dict) or t.get("type") == "function" for t in tools):
        openai += STRONG
    blocks = _blocks(body)
    kinds = {b.get("type") for b in blocks}
    if kinds & _ANTHROPIC_BLOCKS:
        anthropic += STRONG
    if kinds & _OPENAI_PARTS or any("prompt_cache_breakpoint" in b for b in blocks):
        openai += STRONG
    if "cache_control" in body or any("cache_control" in b for b in [*blocks, *tools]):
        anthropic += STRONG
    if "max_tokens" in body and blocks and kinds <= (_ANTHROPIC_BLOCKS | {"text"}):
        anthropic += WEAK
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    if any(m.get("role") in ("tool", "developer") or "tool_calls" in m for m in messages):
        openai += STRONG
    if any(m.get("role") == "system" for m in messages):
        openai += WEAK
    model = request_model(body)
    if model.startswith("claude"):
        anthropic += WEAK
    elif model.startswith(_OPENAI_MODEL_PREFIXES):
        openai += WEAK
    return Signals(anthropic, openai, responses)


def detect_path(a: JSONObject | RequestInput, b: JSONObject | RequestInput, provider: str = "auto") -> str:
    """API path for `provider` (`anthropic`, `openai` or `auto`; see the module docstring)."""
    inputs = [x if isinstance(x, RequestInput) else RequestInput(x) for x in (b, a)]
    if provider == "anthropic":
        return ANTHROPIC_PATH
    recorded = next((x.path for x in inputs if x.path is not None), None)
    signals = sum((body_signals(x.body, x.headers) for x in inputs), Signals())
    if provider == "openai":
        if recorded in (CHAT_PATH, RESPONSES_PATH):
            return recorded
        return RESPONSES_PATH if signals.responses else CHAT_PATH
    if recorded is not None:
        return recorded
    if signals.openai > signals.anthropic:
        return RESPONSES_PATH if signals.responses else CHAT_PATH
    return ANTHROPIC_PATH


# --- the forensic map of a pair -----------------------------------------------------------------


def _estimated_usage(blocks: Sequence[Any], read: int) -> Usage:
    """Usage of a request whose markers write up to the last one (TTL of that marker)."""
    total = sum(b.tokens for b in blocks)
    marked = [i for i, b in enumerate(blocks) if b.ttl]
    written_to = sum(b.tokens for b in blocks[: marked[-1] + 1]) if marked else 0
    read = min(read, written_to) if marked else 0
    write = max(written_to - read, 0)
    is_1h = bool(marked) and blocks[marked[-1]].ttl == "1h"
    return Usage(
        input_none=max(total - read - write, 0),
        cache_read=read,
        cache_write_5m=0 if is_1h else write,
        cache_write_1h=write if is_1h else 0,
        seen=True,
    )


def pair_view(
    a: JSONObject, b: JSONObject, path: str, x: Explanation, rules: Any, usage: Usage | None = None
) -> dict[str, Any]:
    """Page data (`proxy.ui.page`) of the pair A, B: B's map, rows for A and B."""
    from proxy.history import RequestRow, map_blocks, top_ttl
    from proxy.pipeline.segments import classifier_for
    from proxy.prefix import scan_prompt
    from proxy.pricing import default_pricing
    from proxy.ui.page import default_chosen, tail_ttl

    adapter, _ = route(path)
    classifier = classifier_for(rules) if rules is not None else None
    maps = [
        map_blocks(scan_prompt(adapter.layout(body)), top_ttl(body), classifier) if body else ()
        for body in (a, b)
    ]
    family, prices = default_pricing().lookup(adapter.name, request_model(b))
    usages = [
        _estimated_usage(maps[0], 0),
        usage if usage is not None else _estimated_usage(maps[1], x.predicted_read_tokens),
    ]
    rows = []
    for n, (body, blocks, u) in enumerate(zip((a, b), maps, usages, strict=True), start=1):
        if n == 1 and not body:
            continue
        is_b = n == 2
        rows.append(
            RequestRow(
                n=n,
                at=0.0,
                model=request_model(body),
                family=family,
                read=u.cache_read,
                write_5m=u.cache_write_5m,
                write_1h=u.cache_write_1h,
                uncached=u.input_none,
                output=u.output,
                cost_usd=prices.cost(u) if prices is not None else None,
                uncached_cost_usd=prices.uncached_cost(u) if prices is not None else None,
                cause=x.cause if is_b else "first_request",
                section=x.section if is_b else "none",
                block=x.block_index if is_b else 0,
                block_path=x.block_path if is_b else None,
                field_path=x.field_path if is_b else None,
                tokens_before=x.tokens_before if is_b else 0,
                prompt_tokens=sum(blk.tokens for blk in blocks),
                predicted_read=x.predicted_read_tokens if is_b else 0,
                before=x.before if is_b else None,
                after=x.after if is_b else None,
            )
        )
    blocks_b = list(maps[1])
    return {
        "title": "promptcache explain: A -> B",
        "subtitle": f"{adapter.name} {path} · {request_model(b)} · cause {x.cause}"
        + (f" · {x.detail}" if x.detail else ""),
        "prices": None
        if prices is None
        else {
            "input": prices.input,
            "output": prices.output,
            "cache_write_5m": prices.cache_write_5m,
            "cache_write_1h": prices.cache_write_1h,
            "cache_read": prices.cache_read,
        },
        "family": family,
        "tail_ttl": tail_ttl(blocks_b),
        "blocks": blocks_b,
        "rows": rows,
        "chosen": default_chosen(blocks_b, rows),
        "estimated": usage is None,
    }


# --- planner, loading, rendering, command ------------------------------------------------------


def plan_lines(
    adapter: ProviderAdapter,
    body: JSONObject,
    *,
    min_tokens: int = 0,
    previous_breakpoints: Sequence[int] = (),
) -> list[str] | None:
    """The markers the breakpoint planner (`proxy.pipeline.breakpoints.place_breakpoints`, pure)
    would send for `body`, one line each plus a summary; `None` when no planner is available.

    `previous_breakpoints` are the reference request's marker positions (for the bridge)."""
    try:
        from proxy.pipeline import breakpoints
    except ImportError:
        return None
    place = getattr(breakpoints, "place_breakpoints", None)
    context_type = getattr(breakpoints, "PlanContext", None)
    if not callable(place) or context_type is None:
        return None
    context = context_type(previous_breakpoints=tuple(previous_breakpoints))
    _, plan = place(adapter, body, min_tokens=min_tokens, context=context)
    blocks = adapter.prefix_blocks(body)
    lines = []
    for marker in plan.markers:
        where = blocks[marker.index].path if marker.index < len(blocks) else "?"
        ttl = f"ttl {marker.ttl}" if marker.ttl else "no ttl"
        lines.append(f"block {marker.index} ({where}), {ttl}: {marker.origin} ({marker.reason})")
    lines.append(f"injected {plan.injected}, moved {plan.moved}, dropped {plan.dropped}, kept {plan.kept}")
    if plan.cache_key:
        lines.append(f"prompt_cache_key {plan.cache_key}")
    return lines


def token_count() -> Callable[[str], int]:
    """The `o200k_base` count live measurement uses once its tokenizer is loaded
    (`proxy.sim.tokens`), loaded on the first text counted (~0.2 s; only an adapter whose read
    rule counts tokens, OpenAI's, asks), else the bytes/4 estimate when it cannot load."""
    loaded: list[Callable[[str], int]] = []

    def count(text: str) -> int:
        if not loaded:
            from proxy.providers.openai_tokens import estimate
            from proxy.sim.tokens import TokenCounter, load_o200k

            try:
                loaded.append(TokenCounter(load_o200k()).count)
            except RuntimeError:
                loaded.append(estimate)
        return loaded[0](text)

    return count


def _load(path: str) -> Any:
    """The JSON in file `path`; an argument that starts with `{` is the JSON itself (`{}` = no
    reference request), as the usage line documents."""
    if path.lstrip().startswith("{"):
        return orjson.loads(path)
    return orjson.loads(Path(path).read_bytes())


def _usage_from(data: Any, path: str) -> Usage | None:
    """`Usage` from a saved response body (or a bare `usage` object) of B."""
    adapter, _ = route(path)
    reader = adapter.usage_reader()
    reader.feed_json(data if isinstance(data, dict) and "usage" in data else {"usage": data})
    result = reader.result()
    return result if result.seen else None


def render(x: Explanation, out: TextIO) -> None:
    """Print an `Explanation` for a person."""
    w = out.write
    w(f"promptcache explain ({x.provider}, {x.path})\n")
    w(f"  A: {x.a_blocks} blocks, {x.a_bytes:,} bytes (~{estimate_tokens(x.a_bytes):,} tokens)\n")
    w(f"  B: {x.b_blocks} blocks, {x.b_bytes:,} bytes (~{estimate_tokens(x.b_bytes):,} tokens)\n")
    w(f"cause: {x.cause}" + (f" (section {x.section})" if x.section != "none" else "") + "\n")
    if x.detail:
        w(f"  {x.detail}\n")
    if x.field_path is not None:
        where = (
            f"{x.field_path} at character {x.char_offset:,}" if x.char_offset is not None else x.field_path
        )
        w(f"first divergence: block {x.block_index} ({x.block_path}), {where}\n")
        w(f"  byte {x.byte_offset:,} of the canonical stream, ~{x.tokens_before:,} tokens before it\n")
        w(f"  A: {x.before}\n  B: {x.after}\n")
    else:
        w(f"shared prefix: {x.byte_offset:,} bytes, ~{x.tokens_before:,} tokens\n")
    w(f"expected cache read from A's breakpoints: ~{x.predicted_read_tokens:,} tokens\n")
    if x.plan is None:
        w("breakpoint plan for B: unavailable (no pure planner in this build)\n")
    else:
        w("breakpoint plan promptcache would send for B:\n")
        for line in x.plan:
            w(f"  {line}\n")
    w("B extends A\n" if x.extends else "B does not extend A\n")


def explain_command(
    a_path: str,
    b_path: str,
    provider: str = "auto",
    usage_path: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    rules_dir: str | None = None,
    html_path: str | None = None,
) -> int:
    """Read two request bodies (or trace lines), print the explanation; exit status 0 (B extends
    A), 1, or 2. `html_path`: also write the forensic map of the pair there (module docstring).

    Volatile rules and model minimums come from `rules_dir` (default: the packaged rules)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        rules = load_rules(rules_dir)
    except RuleError as exc:
        err.write(f"promptcache explain: invalid rules:\n{exc}\n")
        return 2
    inputs: list[RequestInput] = []
    for name in (a_path, b_path):
        try:
            data = _load(name)
        except OSError as exc:
            err.write(f"promptcache explain: {name}: cannot read: {exc.strerror}\n")
            return 2
        except orjson.JSONDecodeError as exc:
            err.write(f"promptcache explain: {name}: not JSON: {exc}\n")
            return 2
        if not isinstance(data, dict):
            err.write(f"promptcache explain: {name}: must be a JSON object (a request body)\n")
            return 2
        inputs.append(request_input(data))
    path = detect_path(inputs[0], inputs[1], provider)
    a, b = inputs[0].body, inputs[1].body
    usage = None
    if usage_path is not None:
        try:
            usage = _usage_from(_load(usage_path), path)
        except (OSError, orjson.JSONDecodeError) as exc:
            err.write(f"promptcache explain: {usage_path}: cannot read a response: {exc}\n")
            return 2
    adapter, _ = route(path)
    model = request_model(b)
    min_tokens = adapter.min_cacheable_tokens(model, rules.min_tokens(model))
    previous = marker_positions([blk.value for blk in adapter.prefix_blocks(a)], a, read_rules(adapter, a))

    def planner(adapter: ProviderAdapter, body: JSONObject) -> list[str] | None:
        return plan_lines(adapter, body, min_tokens=min_tokens, previous_breakpoints=previous)

    result = explain(
        a,
        b,
        path,
        usage=usage,
        planner=planner,
        is_volatile=volatile_checker(rules),
        min_tokens=min_tokens,
        count=token_count(),
    )
    render(result, out)
    if html_path is not None:
        from proxy.ui.page import session_page

        try:
            Path(html_path).write_text(session_page(pair_view(a, b, path, result, rules, usage)), encoding="utf-8")
        except OSError as exc:
            err.write(f"promptcache explain: {html_path}: cannot write: {exc.strerror}\n")
            return 2
        out.write(f"map written to {html_path}\n")
    return 0 if result.extends else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `promptcache explain` (the CLI wires the subcommand)."""
    parser.add_argument("a", metavar="A.json", help="reference request body (the previous turn); {} = none")
    parser.add_argument("b", metavar="B.json", help="request body to explain")
    parser.add_argument(
        "--provider",
        choices=("anthropic", "openai", "auto"),
        default="auto",
        help="API the bodies were sent to (default: detect from the body shape)",
    )
    parser.add_argument("--response", metavar="FILE", help="B's response body or usage (to detect `expired`)")
    parser.add_argument("--rules", metavar="DIR", help="rules folder (volatile patterns, model minimums)")
    parser.add_argument("--html", metavar="FILE", help="also write the forensic map of the pair (offline HTML)")


def run(args: argparse.Namespace) -> int:
    """Entry point of `promptcache explain`."""
    return explain_command(args.a, args.b, args.provider, args.response, rules_dir=args.rules, html_path=args.html)
