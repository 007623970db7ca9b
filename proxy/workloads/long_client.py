"""Long Claude-Code- and Hermes-shaped conversations grown from the recorded client traces.

Contract: `generate(workload)` reads the recorded trace `workloads/clients/<base>.jsonl` and keeps
its first request's system prompt, tools, headers and top-level fields byte for byte (Claude
Code: the billing header block, the intro and the instructions with their markers, `metadata`,
`thinking`, the `system`-role environment message; Hermes: the one marked system block and
`tool_choice`), then grows one conversation from it turn by turn: `turns` human turns, each a
user message followed by a tool loop of `steps` tool calls (one `tool_use` per assistant message,
its `tool_result` in the next user message) and a text answer. A project file is loaded up front
the way each client loads one: Claude Code puts `CLAUDE.md` in a `<system-reminder>` block of the
first user message, Hermes appends `AGENTS.md` to its system prompt under `# Project Context`.

Each request carries the whole history rendered as the recorded client renders it (read from
`workloads/clients/`): Claude Code sends an earlier message that is one text block as a plain
string and marks only the last block of the last message; Hermes sends an earlier user message
that is one text block as a string and marks the last block of each of the last three messages
(`system_and_3`). Tool results have each client's recorded shape (Claude Code `tool_use_id` first
and `is_error: false`; Hermes a JSON `{"output", "exit_code", "error"}` string).

Sizes (approximate tokens): the project file `project_tokens`, each tool result drawn from
`result_tokens`, so the context starts around 20k and each request adds a few hundred to a few
thousand tokens. Gaps: tool steps 5-30 s, human turns 2-10 minutes (replay `--gap` overrides
them). The same workload gives the same bytes (seeded, no clock, no I/O but the recorded file).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.paths import packaged_workloads_dir
from proxy.workloads import text
from proxy.workloads.trace import Trace, TraceRequest, load_trace

MARKER: Final = {"type": "ephemeral"}
CLAUDE_MD_HEAD: Final = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
    "# claudeMd\nCodebase and user instructions are shown below. Be sure to adhere to these "
    "instructions.\n\nContents of /home/dev/project/CLAUDE.md (project instructions, checked into "
    "the codebase):\n\n"
)
AGENTS_MD_HEAD: Final = (
    "\n\n# Project Context\n\nThe following project context files have been loaded and should be "
    "followed:\n\n## AGENTS.md\n\n"
)


@dataclass(frozen=True, slots=True)
class LongWorkload:
    """A long conversation grown from a recorded client trace (see the module docstring)."""

    name: str
    description: str
    seed: int
    base: str
    """The recorded trace under `workloads/clients/` (`claude-code` or `hermes-anthropic`)."""
    style: str
    """`claude-code` or `hermes` (how history is rendered and marked)."""
    turns: int = 4
    steps: tuple[int, int] = (3, 5)
    """Tool calls per human turn (inclusive range)."""
    project_tokens: int = 14000
    result_tokens: tuple[int, int] = (200, 2500)
    committed: bool = False


_TOOLS: Final = {
    "claude-code": ("Read", "Bash", "Read", "Edit", "Bash"),
    "hermes": ("read_file", "terminal", "search_files", "read_file", "patch"),
}


def _input(tool: str, rng: random.Random) -> dict[str, Any]:
    path = f"/home/dev/project/src/{text.ident(rng, '', 8).lower()}.py"
    if tool in ("Read", "read_file"):
        return {"file_path": path} if tool == "Read" else {"path": path}
    if tool in ("Bash", "terminal"):
        command = f"python -m pytest -q tests/test_{text.ident(rng, '', 6).lower()}.py"
        return {"command": command, "description": "Run the tests"} if tool == "Bash" else {"command": command}
    if tool == "search_files":
        return {"pattern": text.ident(rng, "def ", 6).lower(), "path": "/home/dev/project"}
    old = text.sentence(rng, 6)
    if tool == "Edit":
        return {"file_path": path, "old_string": old, "new_string": text.sentence(rng, 8)}
    return {"path": path, "old_string": old, "new_string": text.sentence(rng, 8)}


def _result(style: str, tool_id: str, output: str) -> dict[str, Any]:
    if style == "claude-code":
        return {"tool_use_id": tool_id, "type": "tool_result", "content": output, "is_error": False}
    body = orjson.dumps({"output": output, "exit_code": 0, "error": None}).decode()
    return {"type": "tool_result", "tool_use_id": tool_id, "content": body}


def _render(history: list[dict[str, Any]], style: str) -> list[dict[str, Any]]:
    """The history as the client sends it (strings for earlier one-text messages, its markers)."""
    marked = 1 if style == "claude-code" else 3
    out = []
    for i, message in enumerate(history):
        message = copy.deepcopy(message)
        content = message["content"]
        is_marked = i >= len(history) - marked
        one_text = len(content) == 1 and content[0]["type"] == "text"
        stringify = one_text and (message["role"] != "assistant")
        if is_marked:
            content[-1]["cache_control"] = dict(MARKER)
        elif stringify:
            message["content"] = content[0]["text"]
        out.append(message)
    return out


def _first_history(first: dict[str, Any], workload: LongWorkload, rng: random.Random, task: str) -> list[Any]:
    messages = copy.deepcopy(first["messages"])
    for m in messages:
        for block in m["content"] if isinstance(m["content"], list) else []:
            block.pop("cache_control", None)
    for m in messages:
        if isinstance(m["content"], str):
            m["content"] = [{"type": "text", "text": m["content"]}]
    user = messages[0]["content"]
    if workload.style == "claude-code":
        claude_md = CLAUDE_MD_HEAD + text.prose(rng, workload.project_tokens) + "\n</system-reminder>\n"
        user[-1:] = [{"type": "text", "text": claude_md}, {"type": "text", "text": task}]
    else:
        user[-1] = {"type": "text", "text": task}
    return messages


def generate(workload: LongWorkload) -> Trace:
    """The workload's trace (see the module docstring)."""
    recorded = load_trace(packaged_workloads_dir() / "clients" / f"{workload.base}.jsonl")
    first = recorded.requests[0]
    rng = random.Random(workload.seed)
    base = {k: v for k, v in first.body.items() if k != "messages"}
    if workload.style == "hermes":
        system = copy.deepcopy(base["system"])
        system[-1]["text"] += AGENTS_MD_HEAD + text.prose(rng, workload.project_tokens)
        base["system"] = system
    history = _first_history(first.body, workload, rng, text.sentence(rng, 24))
    tools = _TOOLS[workload.style]
    requests: list[TraceRequest] = []
    gap = 0.0
    calls = 0

    def send() -> None:
        body = {**copy.deepcopy(base), "messages": _render(history, workload.style)}
        ordered = {k: body[k] for k in first.body if k in body}
        requests.append(TraceRequest(gap, first.path, ordered, dict(first.headers)))

    for turn in range(workload.turns):
        if turn:
            answer = text.prose(rng, rng.randrange(100, 400))
            history.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
            ask = text.sentence(rng, rng.randrange(12, 60))
            history.append({"role": "user", "content": [{"type": "text", "text": ask}]})
            gap = float(rng.randrange(120, 601))
        send()
        for _ in range(rng.randrange(workload.steps[0], workload.steps[1] + 1)):
            calls += 1
            tool = tools[calls % len(tools)]
            tool_id = text.ident(rng, "toolu_01", 22)
            use = {"type": "tool_use", "id": tool_id, "name": tool, "input": _input(tool, rng)}
            said = {"type": "text", "text": text.sentence(rng, rng.randrange(8, 30))}
            history.append({"role": "assistant", "content": [said, use]})
            output = text.code(rng, rng.randrange(*workload.result_tokens))
            history.append({"role": "user", "content": [_result(workload.style, tool_id, output)]})
            gap = float(rng.randrange(5, 31))
            send()
    return Trace(workload.name, workload.description, tuple(requests))


LONG: Final[tuple[LongWorkload, ...]] = (
    LongWorkload(
        "long-cc",
        "One long Claude Code conversation grown from workloads/clients/claude-code.jsonl: its "
        "system prompt, tools and headers, CLAUDE.md in the first message, 4 human turns of 3-5 "
        "tool calls (Read/Bash/Edit), context ~20k to ~45k tokens.",
        121,
        "claude-code",
        "claude-code",
    ),
    LongWorkload(
        "long-hermes",
        "One long Hermes Agent conversation grown from workloads/clients/hermes-anthropic.jsonl: "
        "its system prompt (plus AGENTS.md), tools and system_and_3 markers, 4 human turns of 3-5 "
        "tool calls, context ~20k to ~45k tokens.",
        122,
        "hermes-anthropic",
        "hermes",
    ),
)
