"""The workload suite: named, seeded workloads and their generation into traces.

Contract:
- `SUITE` lists every workload in a fixed order; `generate(workload)` builds its `Trace` from
  the workload's seed alone (no wall clock, no I/O), so the same code gives the same bytes.
- Workloads with `committed=True` are checked in under `workloads/<name>.jsonl` (a wheel installs
  them as data files, `proxy/paths.py`); the others are too large to commit.
  `ensure_traces(names, cache_dir)` generates into `cache_dir` whatever is not found where it is
  shipped (an uncommitted workload, or a committed one when the data files are missing), so the
  suite replays from any install.
- Each workload targets one client behaviour that breaks provider prompt caches (its
  `description` says which); all use current model ids from `rules/simulator.yaml`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from proxy.paths import packaged_workloads_dir
from proxy.workloads import anthropic_gen, long_client, openai_gen, text
from proxy.workloads.long_client import LONG, LongWorkload
from proxy.workloads.script import Event, ScriptSpec, make_script, make_tools
from proxy.workloads.trace import Trace, TraceRequest, dumps_trace, load_trace

COMMITTED_DIR: Final = packaged_workloads_dir()
"""Where committed traces live (`workloads/<name>.jsonl` at the repository root, or installed)."""

SONNET: Final = "claude-sonnet-4-6"
OPUS: Final = "claude-opus-5"
GPT: Final = "gpt-5.1"
GPT_BREAKPOINTS: Final = "gpt-5.6"
CC_BETAS: Final = "claude-code-20250219,fine-grained-tool-streaming-2025-05-14"


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    seed: int
    script: ScriptSpec
    client: anthropic_gen.Client | openai_gen.Client
    tools: int = 12
    system_tokens: int = 4000
    """Approximate tokens of the long, stable system instructions."""
    sessions: int = 1
    stagger: tuple[int, int] = (30, 120)
    """Seconds between the starts of consecutive sessions."""
    committed: bool = True


_CC = anthropic_gen.Client(markers="claude-code", stream=True, reminders=True, betas=CC_BETAS)
_HERMES = anthropic_gen.Client(markers="system-and-3", stream=True, session_header=None)
"""Hermes Agent on Anthropic: four 5-minute markers (system and the last three messages), no
session header."""

HUMAN_GAP_LOGNORMAL: Final = (240.0, 1.65, 14400)
"""Realistic human gaps: lognormal, median 4 minutes, sigma 1.65 (about 29% above 10 minutes,
45% above 5 minutes, 5% above an hour), capped at 4 hours."""
_REALISTIC = ScriptSpec(
    (SONNET,),
    turns_range=(2, 8),
    loop_steps=(0, 4),
    parallel=(1, 2),
    machine_gap=(2, 30),
    human_gap_lognormal=HUMAN_GAP_LOGNORMAL,
    short_share=0.2,
    abandon_share=0.15,
)
"""A working day of one tenant: conversations of 2-8 human turns, each starting a tool loop of
0-4 steps 2-30 s apart; ~20% of conversations are 1-2 requests; ~15% abandoned mid-loop."""
_MIXED = ScriptSpec((SONNET,), human_turns=5, loop_steps=(1, 3), machine_gap=(20, 20), human_gap=(360, 2400))
"""Tool steps 20 s apart inside a turn, 6-40 minutes between human turns."""

SUITE: Final[tuple[Workload, ...]] = (
    Workload(
        "cc-billing-header",
        "Claude Code style: a volatile first system block (billing header, new cch per request), "
        "markers on the last system block and the last message, short tool loops, machine pacing.",
        101,
        ScriptSpec((SONNET,), human_turns=4, loop_steps=(2, 3), parallel=(1, 2)),
        anthropic_gen.Client(
            billing_header=True, markers="claude-code", stream=True, reminders=True, betas=CC_BETAS
        ),
    ),
    Workload(
        "volatile-system-counters",
        "SDK agent whose string system prompt starts with the current time, a request UUID and a "
        "context-usage counter; automatic (top-level) caching; no session header.",
        102,
        ScriptSpec((OPUS,), human_turns=5, loop_steps=(1, 2)),
        anthropic_gen.Client(
            system_style="string",
            volatile=("timestamp", "uuid", "counter"),
            volatile_at="top",
            markers="automatic",
            session_header=None,
        ),
    ),
    Workload(
        "tools-shuffled",
        "Tool definitions in a different order on every request (tools merged from a set).",
        103,
        ScriptSpec((SONNET,), human_turns=5, loop_steps=(1, 2)),
        anthropic_gen.Client(markers="claude-code", shuffle_tools=True, stream=True),
    ),
    Workload(
        "schema-keys-reordered",
        "Tool input_schema keys serialised in a different order on every request (Go map order).",
        104,
        ScriptSpec((SONNET,), human_turns=5, loop_steps=(1, 2)),
        anthropic_gen.Client(markers="claude-code", reorder_schema=True),
    ),
    Workload(
        "history-rerendered",
        "Earlier user messages re-rendered with the current time on every request, and tool_use "
        "inputs re-serialised with another key order.",
        105,
        ScriptSpec((SONNET,), human_turns=5, loop_steps=(1, 2), parallel=(1, 2)),
        anthropic_gen.Client(
            markers="claude-code", rerender_history=True, reserialise_inputs=True, stream=True
        ),
    ),
    Workload(
        "no-markers",
        "Plain SDK script: stable prompts, string messages, no cache_control at all, no session "
        "header, machine pacing.",
        106,
        ScriptSpec((SONNET,), human_turns=7, loop_steps=(0, 1), human_gap=(5, 30)),
        anthropic_gen.Client(system_style="string", string_content=True, session_header=None),
    ),
    Workload(
        "client-markers-4",
        "Hermes-style system_and_3: the client's four 5-minute markers on the system prompt and the "
        "last three messages.",
        107,
        ScriptSpec((OPUS,), human_turns=5, loop_steps=(1, 2)),
        anthropic_gen.Client(markers="system-and-3", session_header="x-session-id"),
    ),
    Workload(
        "client-markers-5",
        "Five client markers (last tool, system, last three messages): the API refuses the request "
        "with 400 unless something fixes the placement.",
        108,
        ScriptSpec((OPUS,), human_turns=5, loop_steps=(0, 1)),
        anthropic_gen.Client(markers="five", session_header="x-session-id"),
    ),
    Workload(
        "tool-loop-parallel",
        "Long tool loops: 11-12 steps of 3-5 parallel calls with text between runs (more than 20 "
        "lookback positions per human turn); the client marks only the last human message.",
        109,
        ScriptSpec(
            (SONNET,),
            human_turns=2,
            loop_steps=(11, 12),
            parallel=(3, 5),
            machine_gap=(1, 4),
            result_tokens=(60, 160),
        ),
        anthropic_gen.Client(markers="last-human", reminders=True, stream=True, betas=CC_BETAS),
    ),
    Workload(
        "human-pacing",
        "A person at the keyboard: 6-40 minute gaps between turns, the client's 5-minute markers "
        "expire before every turn.",
        110,
        ScriptSpec((SONNET,), human_turns=6, loop_steps=(0, 1), human_gap=(360, 2400)),
        _CC,
    ),
    Workload(
        "compaction",
        "Compaction mid-session: a summary request over the whole history, then the history is "
        "replaced by the summary (system and tools unchanged).",
        111,
        ScriptSpec(
            (SONNET,), human_turns=6, loop_steps=(1, 2), compact_before=(3,), result_tokens=(400, 1200)
        ),
        _CC,
    ),
    Workload(
        "model-switch",
        "Model switch and back: two turns on claude-opus-5 in the middle of a claude-sonnet-4-6 "
        "session (the cache is per model).",
        112,
        ScriptSpec((SONNET, SONNET, OPUS, OPUS, SONNET, SONNET), human_turns=6, loop_steps=(0, 1)),
        _CC,
    ),
    Workload(
        "openai-chat-agent",
        "OpenAI Chat Completions agent (gpt-5.1, automatic caching): the system message starts "
        "with the current time; tool loops; streamed with include_usage.",
        113,
        ScriptSpec((GPT,), human_turns=5, loop_steps=(1, 2), parallel=(1, 2)),
        openai_gen.Client(api="chat", volatile=("timestamp",), volatile_at="top"),
    ),
    Workload(
        "openai-responses-agent",
        "OpenAI Responses agent, Codex-like (gpt-5.6, breakpoint semantics): an environment "
        "message re-rendered with the current time on every request, prompt_cache_key.",
        114,
        ScriptSpec((GPT_BREAKPOINTS,), human_turns=5, loop_steps=(1, 2), parallel=(1, 2)),
        openai_gen.Client(api="responses", rerender_history=True, prompt_cache_key=True),
    ),
    Workload(
        "shared-system-sessions",
        "Four interleaved sessions sharing one system prompt and tool set (different working "
        "directories), automatic top-level caching.",
        115,
        ScriptSpec((OPUS,), human_turns=3, loop_steps=(0, 1), human_gap=(60, 240)),
        anthropic_gen.Client(markers="automatic", session_header="x-session-id"),
        system_tokens=6000,
        sessions=4,
        stagger=(20, 60),
    ),
    Workload(
        "long-context-growth",
        "Context growing from ~20k to ~160k tokens: every turn pastes a ~19k-token file; "
        "4-15 minute gaps; Claude Code style markers.",
        116,
        ScriptSpec((SONNET,), human_turns=8, human_gap=(240, 900), attach_tokens=(18500, 19500)),
        _CC,
        tools=8,
        system_tokens=2000,
        committed=False,
    ),
    Workload(
        "realistic-cc",
        "A day of one Claude Code user: 8 conversations 15-90 minutes apart, human gaps lognormal "
        "(median 4 min, ~30% above 10 min, ~5% above 1 h), tool steps 2-30 s, ~20% of "
        "conversations 1-2 requests, some abandoned mid-loop.",
        117,
        _REALISTIC,
        _CC,
        sessions=8,
        stagger=(900, 5400),
        committed=False,
    ),
    Workload(
        "realistic-hermes",
        "The same day as realistic-cc for a Hermes Agent user (system_and_3 markers, no session "
        "header).",
        118,
        _REALISTIC,
        _HERMES,
        sessions=8,
        stagger=(900, 5400),
        committed=False,
    ),
    Workload(
        "mixed-pacing-cc",
        "Three Claude Code conversations of one tenant: tool steps 20 s apart, 6-40 minutes "
        "between human turns.",
        119,
        _MIXED,
        _CC,
        sessions=3,
        stagger=(1800, 5400),
        committed=False,
    ),
    Workload(
        "mixed-pacing-hermes",
        "Three Hermes Agent conversations of one tenant: tool steps 20 s apart, 6-40 minutes "
        "between human turns.",
        120,
        _MIXED,
        _HERMES,
        sessions=3,
        stagger=(1800, 5400),
        committed=False,
    ),
)
BY_NAME: Final[dict[str, Workload | LongWorkload]] = {
    **{w.name: w for w in SUITE},
    **{w.name: w for w in LONG},
}
"""Every named workload: the suite, and the long conversations grown from recorded client
traces (`long_client.LONG`: `long-cc`, `long-hermes`; not part of `suite`)."""
PACING: Final = ("realistic-cc", "realistic-hermes", "mixed-pacing-cc", "mixed-pacing-hermes")
"""The human-pacing workloads (issue 13's targets)."""


def _merge(streams: Iterable[list[Event]]) -> list[TraceRequest]:
    events = [e for stream in streams for e in stream]
    events.sort(key=lambda e: (e.at, e.order))
    out = []
    last = 0
    for e in events:
        out.append(TraceRequest(float(e.at - last), e.path, e.body, e.headers))
        last = e.at
    return out


def generate(workload: Workload | LongWorkload) -> Trace:
    """The workload's trace, from its seed alone (a `LongWorkload` also reads its recorded trace)."""
    if isinstance(workload, LongWorkload):
        return long_client.generate(workload)
    rng = random.Random(workload.seed)
    tools = make_tools(rng, workload.tools)
    instructions = text.prose(rng, workload.system_tokens)
    streams = []
    start = 0
    for s in range(workload.sessions):
        if s:
            start += rng.randrange(workload.stagger[0], workload.stagger[1] + 1)
        session_id = text.uuid4(rng)
        cwd = f"/home/dev/{text.ident(rng, 'project-', 6).lower()}"
        seed = workload.seed * 100 + s
        client = workload.client
        if isinstance(client, anthropic_gen.Client):
            script = make_script(rng, workload.script, tools, session_id, start, "toolu_01")
            events = anthropic_gen.render_session(
                script, client, anthropic_gen.Shared(instructions), seed, cwd
            )
        else:
            script = make_script(rng, workload.script, tools, session_id, start, "call_")
            events = openai_gen.render_session(script, client, openai_gen.Shared(instructions), seed, cwd)
        for i, e in enumerate(events):
            e.order = (s, i)
        streams.append(events)
    return Trace(workload.name, workload.description, tuple(_merge(streams)))


def trace_path(workload: Workload | LongWorkload, cache_dir: Path) -> Path:
    """Where the workload's trace file lives: `workloads/` if committed and shipped, else `cache_dir`."""
    shipped = COMMITTED_DIR / f"{workload.name}.jsonl"
    if workload.committed and shipped.is_file():
        return shipped
    return cache_dir / f"{workload.name}.jsonl"


def ensure_traces(names: Iterable[str], cache_dir: Path) -> list[Path]:
    """Paths of the named workloads' traces, generating the ones not shipped into `cache_dir` (blocking).

    A generated committed workload has the committed bytes (`python -m proxy.workloads check`).
    """
    paths = []
    for name in names:
        workload = BY_NAME[name]
        path = trace_path(workload, cache_dir)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(dumps_trace(generate(workload)))
            tmp.replace(path)
        paths.append(path)
    return paths


def load_workload(name: str, cache_dir: Path) -> Trace:
    """The named workload's trace (generating it into `cache_dir` when not committed)."""
    return load_trace(ensure_traces([name], cache_dir)[0])
