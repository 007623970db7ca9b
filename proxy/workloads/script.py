"""Provider-neutral conversation scripts: what an agent session does, turn by turn.

A `Script` is the plan of one session: human turns (user text, optional attached document),
each followed by a tool loop of `Step`s (assistant text plus parallel tool calls and their
results) and a final answer; gaps in seconds; an optional compaction before a turn; the model
of each turn. Provider renderers (`anthropic_gen`, `openai_gen`) turn a script into request
bodies with a client's quirks. Everything is drawn from one `random.Random`, so a seed fixes
the script.

Units: `*_tokens` are approximate `o200k_base` tokens; gaps are whole seconds.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.workloads import text

TOOL_CALL_HEADER: Final = "x-sim-tool-call"
"""Trace header asking the simulator to answer with a call of the named tool (`proxy/sim/replies.py`):
how a trace says that the recorded response was a tool call."""

_TOOL_NAMES = (
    "Read",
    "Edit",
    "Write",
    "Bash",
    "Grep",
    "Glob",
    "WebFetch",
    "TodoWrite",
    "NotebookEdit",
    "LS",
    "Task",
    "WebSearch",
    "mcp__git__status",
    "mcp__git__diff",
    "mcp__git__log",
    "mcp__db__query",
    "mcp__db__schema",
    "mcp__http__get",
)
_PARAM_NAMES = (
    "file_path",
    "path",
    "pattern",
    "command",
    "description",
    "offset",
    "limit",
    "timeout",
    "query",
    "url",
    "content",
    "old_string",
    "new_string",
    "glob",
    "max_results",
)


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool definition, provider-neutral."""

    name: str
    description: str
    params: tuple[tuple[str, str, str], ...]
    """`(name, JSON type, description)` in declaration order."""
    required: tuple[str, ...]

    def schema(self) -> dict[str, Any]:
        """JSON Schema of the input (`type`, `properties`, `required`)."""
        props = {name: {"type": kind, "description": desc} for name, kind, desc in self.params}
        return {"type": "object", "properties": props, "required": list(self.required)}


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call and its result."""

    id: str
    name: str
    input: dict[str, Any]
    result: str


@dataclass(frozen=True, slots=True)
class Step:
    """One assistant tool step: its text, parallel calls, then the request carrying results."""

    text: str
    calls: tuple[Call, ...]
    gap: int
    """Seconds between the previous request and the request that carries these results."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One human turn: the user's message, the tool loop it starts, the final answer."""

    gap: int
    """Seconds between the previous request (or the session start) and this turn's request."""
    text: str
    model: str
    attachment: str = ""
    """A document pasted into the user's message (long contexts), or empty."""
    steps: tuple[Step, ...] = ()
    answer: str = ""
    compact_before: bool = False
    """The client compacts the history before this turn (a summary request, then a reset)."""
    summary: str = ""
    """The compaction summary that replaces the history (when `compact_before`)."""


@dataclass(frozen=True, slots=True)
class Script:
    """One session's plan."""

    session_id: str
    start: int
    """Trace second of the session's first request."""
    turns: tuple[Turn, ...]
    tools: tuple[Tool, ...]
    abandoned: bool = False
    """The last request's answer is a tool call that never runs (`ScriptSpec.abandon_share`)."""


@dataclass(frozen=True, slots=True)
class ScriptSpec:
    """Knobs of a script (all sizes approximate tokens, all gaps seconds)."""

    models: tuple[str, ...]
    """Model of each human turn (the last one repeats)."""
    human_turns: int = 6
    loop_steps: tuple[int, int] = (0, 0)
    """Tool-loop steps per human turn, inclusive range."""
    parallel: tuple[int, int] = (1, 1)
    """Parallel tool calls per step, inclusive range."""
    human_gap: tuple[int, int] = (20, 90)
    machine_gap: tuple[int, int] = (2, 8)
    result_tokens: tuple[int, int] = (200, 900)
    attach_tokens: tuple[int, int] = (0, 0)
    user_tokens: tuple[int, int] = (15, 60)
    answer_tokens: tuple[int, int] = (40, 160)
    compact_before: tuple[int, ...] = ()
    """Human-turn indices preceded by a compaction."""
    summary_tokens: int = 1200
    human_gap_lognormal: tuple[float, float, int] | None = None
    """`(median seconds, sigma, cap seconds)`: human gaps drawn lognormal instead of uniform from
    `human_gap` (at least 15 s, at most the cap)."""
    turns_range: tuple[int, int] | None = None
    """Human turns drawn per session from this inclusive range instead of `human_turns`."""
    short_share: float = 0.0
    """Chance that a session is 1-2 requests (one human turn, at most one tool step)."""
    abandon_share: float = 0.0
    """Chance that a session is abandoned: its last request is answered with a tool call that
    never runs (the person left); the turn's later steps are dropped."""


def make_tools(rng: random.Random, count: int, description_tokens: int = 140) -> tuple[Tool, ...]:
    """`count` tool definitions with prose descriptions."""
    tools = []
    for i in range(count):
        name = _TOOL_NAMES[i] if i < len(_TOOL_NAMES) else f"mcp__extra__tool_{i}"
        order = list(range(len(_PARAM_NAMES)))
        rng.shuffle(order)
        names = sorted(order[: rng.randrange(2, 5)])
        params = tuple(
            (
                _PARAM_NAMES[j],
                "integer" if _PARAM_NAMES[j] in ("offset", "limit", "timeout", "max_results") else "string",
                text.sentence(rng, rng.randrange(6, 16)),
            )
            for j in names
        )
        tools.append(Tool(name, text.prose(rng, description_tokens), params, (params[0][0],)))
    return tuple(tools)


def _call_input(rng: random.Random, tool: Tool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind, _ in tool.params:
        if kind == "integer":
            out[name] = rng.randrange(1, 2000)
        elif name in ("file_path", "path"):
            folder = rng.choice(("proxy", "store", "sim", "cli"))
            out[name] = f"/repo/src/{folder}/{text.ident(rng, '', 6).lower()}.py"
        else:
            out[name] = text.sentence(rng, rng.randrange(3, 9))
    return out


def make_script(
    rng: random.Random,
    spec: ScriptSpec,
    tools: tuple[Tool, ...],
    session_id: str,
    start: int,
    call_prefix: str,
) -> Script:
    """Draw a session plan from `rng` (see the module docstring)."""
    turns = []
    human_turns, loop_steps = spec.human_turns, spec.loop_steps
    short = spec.short_share > 0 and rng.random() < spec.short_share
    if short:
        human_turns, loop_steps = 1, (0, 1)
    elif spec.turns_range is not None:
        human_turns = rng.randrange(*_span(spec.turns_range))
    for h in range(human_turns):
        model = spec.models[min(h, len(spec.models) - 1)]
        gap = 0 if h == 0 else _human_gap(rng, spec)
        user = text.sentence(rng, rng.randrange(*_span(spec.user_tokens)))
        attach = ""
        if spec.attach_tokens[1] > 0:
            attach = text.code(rng, rng.randrange(*_span(spec.attach_tokens)))
        steps = []
        for _ in range(rng.randrange(*_span(loop_steps))):
            calls = []
            for _ in range(rng.randrange(*_span(spec.parallel))):
                tool = rng.choice(tools)
                result = text.code(rng, rng.randrange(*_span(spec.result_tokens)))
                calls.append(Call(text.ident(rng, call_prefix), tool.name, _call_input(rng, tool), result))
            step_gap = rng.randrange(spec.machine_gap[0], spec.machine_gap[1] + 1)
            steps.append(Step(text.sentence(rng, rng.randrange(6, 18)), tuple(calls), step_gap))
        answer = text.prose(rng, rng.randrange(*_span(spec.answer_tokens)))
        compact = h in spec.compact_before
        summary = text.prose(rng, spec.summary_tokens) if compact else ""
        turns.append(Turn(gap, user, model, attach, tuple(steps), answer, compact, summary))
    abandoned = not short and spec.abandon_share > 0 and rng.random() < spec.abandon_share
    if abandoned:
        last = turns[-1]
        turns[-1] = Turn(
            last.gap, last.text, last.model, last.attachment, last.steps[: len(last.steps) // 2], ""
        )
    return Script(session_id, start, tuple(turns), tools, abandoned)


def _human_gap(rng: random.Random, spec: ScriptSpec) -> int:
    """Seconds before a human turn: uniform from `human_gap`, or lognormal when configured."""
    if spec.human_gap_lognormal is None:
        return rng.randrange(spec.human_gap[0], spec.human_gap[1] + 1)
    median, sigma, cap = spec.human_gap_lognormal
    return int(min(cap, max(15.0, median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


def _span(bounds: tuple[int, int]) -> tuple[int, int]:
    """`randrange` arguments for an inclusive range."""
    return bounds[0], bounds[1] + 1


@dataclass(slots=True)
class Event:
    """One request of a session at an absolute trace second (before merging sessions)."""

    at: int
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    order: tuple[int, int] = field(default=(0, 0))
    """`(session index, request index)`: tie-break when two sessions send at the same second."""
