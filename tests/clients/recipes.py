"""How each real client is installed, configured for offline use and driven through three turns.

Every recipe runs the same conversation in one client session, resumed between processes where the
client is one-shot:
  1. `Say hello.`
  2. a prompt carrying the simulator's tool marker, `[[tool:NAME {"command": "echo promptcache-tool-ok"}]]`
     (NAME = the client's shell tool), so the simulator answers with a tool call, the client runs
     `echo` and sends the result back, and the simulator then answers with text (aider, which
     offers no tools: a `[[reply:...]]` marker scripts a SEARCH/REPLACE edit that aider applies);
  3. `Thanks. What did the command print?`
Outbound traffic the client would make besides the API (telemetry, update checks, model catalogs,
plugin syncs) is turned off by the settings below and, where `unshare -n` works, made impossible.
Each finding is explained next to the setting that handles it; tests/clients/README.md lists them.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from tests.clients.harness import (
    DUMMY_KEY,
    Stack,
    Turn,
    base_env,
    ensure_installed,
    load_records,
    run_isolated,
)

TOOL_MARK: Final = "promptcache-tool-ok"
HELLO: Final = "Say hello."
THANKS: Final = "Thanks. What did the command print?"
NEW_SESSION: Final = "New session: say hello again."
SIM_REPLY: Final = "OK from promptcache-sim"


def tool_prompt(tool: str, key: str = "command") -> str:
    return f'Now run this command: [[tool:{tool} {{"{key}":"echo {TOOL_MARK}"}}]]'


EDIT_REPLY: Final = (
    f"{SIM_REPLY} (scripted edit)\n\nhello.py\n```python\n<<<<<<< SEARCH\nprint('hello')\n=======\n"
    f"print('{TOOL_MARK}')\n>>>>>>> REPLACE\n```"
)
"""aider's edit protocol: a SEARCH/REPLACE block in the reply text, which aider applies to the file."""
EDIT_PROMPT: Final = f"Change hello.py to print {TOOL_MARK}. [[reply:{orjson.dumps(EDIT_REPLY).decode()}]]"
"""One line (aider reads a prompt per stdin line): the simulator's `[[reply:"JSON string"]]` marker
scripts EDIT_REPLY."""
EDITED_FILE: Final = f"print('{TOOL_MARK}')\n"


@dataclass
class ClientRun:
    """What one recipe produced: its process runs, the recorded trace, upstream statuses."""

    name: str
    turns: list[Turn]
    records: list[dict[str, Any]]
    upstream_statuses: list[int]
    session_ids: list[str | None]
    problems: list[str] = field(default_factory=list)
    """Per-turn completion problems found by the recipe (empty = every turn completed)."""
    home: Path | None = None
    fresh_session_ids: list[str | None] = field(default_factory=list)
    """Session ids of the extra sessions the recipe started after the main one (Claude Code)."""

    def main_records(self) -> list[dict[str, Any]]:
        """The records of the main session (all of them unless the recipe started more sessions)."""
        if not self.fresh_session_ids or not self.session_ids or self.session_ids[0] is None:
            return self.records
        main = self.session_ids[0]
        return [r for r in self.records if r["headers"].get("x-claude-code-session-id") == main]


@dataclass(frozen=True)
class Recipe:
    name: str
    """Trace name: workloads/clients/<name>.jsonl."""
    install: str
    api: str
    model: str
    tool: str | None
    """The shell tool the simulator is asked to call; None when the client offers no tools."""
    description: str
    drive: Callable[[Recipe, Stack, Path], tuple[list[Turn], list[str | None], list[str]]]
    prompts: tuple[str, ...] = ()
    no_tool_reason: str = ""
    fresh_prompts: tuple[str, ...] = ()
    """First prompts of further one-turn sessions run after the main session."""

    @property
    def llm_turns(self) -> int:
        """Prompts that reach the model (aider's `/run` is handled locally)."""
        return sum(1 for p in self.prompts if not p.startswith("/run"))

    def run(self, tmp: Path, record: Path) -> ClientRun:
        ensure_installed(self.install)
        with Stack(record=record) as stack:
            turns, session_ids, problems = self.drive(self, stack, tmp)
            statuses = stack.pipeline_statuses()
        records = load_records(record) if record.exists() else []
        main_ids = session_ids[: len(self.prompts)] if self.fresh_prompts else session_ids
        fresh_ids = session_ids[len(self.prompts) :] if self.fresh_prompts else []
        return ClientRun(self.name, turns, records, statuses, main_ids, problems, tmp / "home", fresh_ids)


def _dirs(tmp: Path) -> tuple[Path, Path]:
    home, work = tmp / "home", tmp / "work"
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    return home, work


def _turn_problem(index: int, turn: Turn, why: str) -> str:
    where = " ".join(turn.argv[1:3])
    return f"turn {index + 1} ({where} ...): {why}; rc={turn.returncode}; stderr: {turn.stderr[-600:]!r}"


# --- Claude Code ---------------------------------------------------------------------------------


def _claude_code(recipe: Recipe, stack: Stack, tmp: Path) -> tuple[list[Turn], list[str | None], list[str]]:
    from tests.clients.harness import INSTALLS

    home, work = _dirs(tmp)
    binary = str(INSTALLS["npm"].path / "node_modules" / ".bin" / "claude")
    env = base_env(home) | {
        "ANTHROPIC_BASE_URL": stack.proxy_url,
        "ANTHROPIC_API_KEY": DUMMY_KEY,
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_BUG_COMMAND": "1",
    }
    common = ["--allowedTools", "Bash", "--output-format", "json"]
    turns: list[Turn] = []
    ids: list[str | None] = []
    problems: list[str] = []
    session: str | None = None
    for index, prompt in enumerate(recipe.prompts):
        argv = [binary, "-p", prompt, *common] + (["--resume", session] if session else [])
        turn = run_isolated(stack, argv, env, work)
        turns.append(turn)
        try:
            result = orjson.loads(turn.stdout)
        except ValueError:
            problems.append(_turn_problem(index, turn, "stdout is not the JSON result"))
            ids.append(None)
            break
        ids.append(result.get("session_id"))
        session = session or result.get("session_id")
        if turn.returncode != 0 or result.get("is_error") or result.get("subtype") != "success":
            problems.append(
                _turn_problem(
                    index, turn, f"result {result.get('subtype')} is_error={result.get('is_error')}"
                )
            )
        elif SIM_REPLY not in str(result.get("result")):
            problems.append(_turn_problem(index, turn, f"unexpected result {result.get('result')!r}"))
    # A second session with another first prompt: Claude Code's billing-header system block
    # (`cc_version=<version>.<3 hex digits derived from the first prompt>`) then differs, which is
    # what promptcache's reorder stage is for.
    for prompt in recipe.fresh_prompts:
        turn = run_isolated(stack, [binary, "-p", prompt, *common], env, work)
        turns.append(turn)
        try:
            result = orjson.loads(turn.stdout)
        except ValueError:
            result = {}
        ids.append(result.get("session_id"))
        if turn.returncode != 0 or result.get("is_error") or SIM_REPLY not in str(result.get("result")):
            problems.append(_turn_problem(len(turns) - 1, turn, f"fresh session: {turn.stdout[-300:]!r}"))
    return turns, ids, problems


# --- Codex CLI -----------------------------------------------------------------------------------

_CODEX_CONFIG: Final = """\
model = "{model}"
model_provider = "promptcache"
approval_policy = "never"
sandbox_mode = "danger-full-access"
# Offline: no update check, no analytics/feedback upload, and no plugin catalogs (with plugins on,
# every start resolves api.github.com, chatgpt.com and ab.chatgpt.com; ~5 s of DNS retries offline).
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false

[model_providers.promptcache]
name = "promptcache"
base_url = "{base}/v1"
env_key = "PROMPTCACHE_TEST_KEY"
wire_api = "responses"
"""


def _codex(recipe: Recipe, stack: Stack, tmp: Path) -> tuple[list[Turn], list[str | None], list[str]]:
    from tests.clients.harness import INSTALLS

    home, work = _dirs(tmp)
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    config = _CODEX_CONFIG.format(model=recipe.model, base=stack.proxy_url)
    if recipe.model.startswith("("):  # the client's own default model
        config = config.replace(f'model = "{recipe.model}"\n', "")
    (codex_home / "config.toml").write_text(config)
    binary = str(INSTALLS["npm"].path / "node_modules" / ".bin" / "codex")
    env = base_env(home) | {"CODEX_HOME": str(codex_home), "PROMPTCACHE_TEST_KEY": DUMMY_KEY}
    turns: list[Turn] = []
    ids: list[str | None] = []
    problems: list[str] = []
    thread: str | None = None
    for index, prompt in enumerate(recipe.prompts):
        argv = [binary, "exec", "--json", "--skip-git-repo-check"]
        argv += ["resume", thread, prompt] if thread else [prompt]
        turn = run_isolated(stack, argv, env, work)
        turns.append(turn)
        events = []
        for line in turn.stdout.splitlines():
            try:
                events.append(orjson.loads(line))
            except ValueError:
                continue
        started = [e.get("thread_id") for e in events if e.get("type") == "thread.started"]
        ids.append(started[0] if started else None)
        thread = thread or (started[0] if started else None)
        errors = [
            e
            for e in events
            if e.get("type") in ("error", "turn.failed") or (e.get("item") or {}).get("type") == "error"
        ]
        messages = [
            (e.get("item") or {}).get("text", "")
            for e in events
            if (e.get("item") or {}).get("type") == "agent_message"
        ]
        if turn.returncode != 0 or errors or not any(e.get("type") == "turn.completed" for e in events):
            problems.append(_turn_problem(index, turn, f"errors {errors[:2]}"))
        elif not any(SIM_REPLY in m for m in messages):
            problems.append(_turn_problem(index, turn, f"agent messages {messages!r}"))
    return turns, ids, problems


def codex_commands(stdout: str) -> list[dict[str, Any]]:
    """Completed command executions in a `codex exec --json` output."""
    out = []
    for line in stdout.splitlines():
        try:
            event = orjson.loads(line)
        except ValueError:
            continue
        item = event.get("item") or {}
        if event.get("type") == "item.completed" and item.get("type") == "command_execution":
            out.append(item)
    return out


# --- Hermes Agent --------------------------------------------------------------------------------


def _hermes_home(home: Path, recipe: Recipe, base_url: str) -> Path:
    hermes = home / ".hermes"
    (hermes / "cache").mkdir(parents=True, exist_ok=True)
    if recipe.api == "/v1/messages":
        model_block = f"  provider: anthropic\n  default: {recipe.model}\n"
        catalog_provider, catalog_name = "anthropic", "Anthropic"
    else:
        model_block = f"  provider: custom\n  default: {recipe.model}\n  base_url: {base_url}/v1\n"
        catalog_provider, catalog_name = "openai", "OpenAI"
    # tirith: a security scanner Hermes downloads from GitHub at first start; lazy installs: pip
    # installs at first use of a feature (edge-tts for the TTS tool ...); title generation: an extra
    # auxiliary LLM call per session.
    (hermes / "config.yaml").write_text(
        "model:\n" + model_block + "  context_length: 1000000\n"
        "security:\n  tirith_enabled: false\n  allow_lazy_installs: false\n"
        "auxiliary:\n  title_generation:\n    enabled: false\n"
    )
    now = time.time()
    # Fresh caches so Hermes never fetches PyPI (update check), models.dev or openrouter.ai at start.
    (hermes / ".update_check").write_text(
        orjson.dumps({"ts": now, "behind": 0, "rev": None, "ver": "0.19.0"}).decode()
    )
    entry = {
        "id": recipe.model,
        "name": recipe.model,
        "tool_call": True,
        "reasoning": True,
        "attachment": True,
        "temperature": True,
        "limit": {"context": 1000000, "output": 64000},
    }
    catalog = {
        catalog_provider: {"id": catalog_provider, "name": catalog_name, "models": {recipe.model: entry}}
    }
    (hermes / "models_dev_cache.json").write_text(orjson.dumps(catalog).decode())
    (hermes / "cache" / "openrouter_model_metadata.json").write_text(
        orjson.dumps({f"{catalog_provider}/{recipe.model}": {"context_length": 1000000}}).decode()
    )
    return hermes


def hermes_session_id(stderr: str) -> str | None:
    for line in stderr.splitlines():
        if line.strip().startswith("session_id:"):
            return line.split(":", 1)[1].strip()
    return None


def _hermes(recipe: Recipe, stack: Stack, tmp: Path) -> tuple[list[Turn], list[str | None], list[str]]:
    from tests.clients.harness import INSTALLS

    home, work = _dirs(tmp)
    _hermes_home(home, recipe, stack.proxy_url)
    binary = str(INSTALLS["hermes"].path / "bin" / "hermes")
    env = base_env(home) | {"HERMES_DISABLE_LAZY_INSTALLS": "1"}
    if recipe.api == "/v1/messages":
        env |= {"ANTHROPIC_BASE_URL": stack.proxy_url, "ANTHROPIC_API_KEY": DUMMY_KEY}
    else:
        env |= {"OPENAI_API_KEY": DUMMY_KEY}
    turns: list[Turn] = []
    ids: list[str | None] = []
    problems: list[str] = []
    session: str | None = None
    for index, prompt in enumerate(recipe.prompts):
        argv = [binary, "chat", "-q", prompt, "-Q", "--yolo"] + (["--resume", session] if session else [])
        turn = run_isolated(stack, argv, env, work)
        turns.append(turn)
        sid = hermes_session_id(turn.stderr)
        ids.append(sid)
        session = session or sid
        if turn.returncode != 0 or sid is None:
            problems.append(_turn_problem(index, turn, "no session id"))
        elif SIM_REPLY not in turn.stdout:
            problems.append(_turn_problem(index, turn, f"stdout {turn.stdout[-300:]!r}"))
    return turns, ids, problems


# --- aider ---------------------------------------------------------------------------------------


_AIDER_ERRORS: Final = ("Traceback", "litellm.", "APIError", "APIConnectionError", "Error:")


def _aider(recipe: Recipe, stack: Stack, tmp: Path) -> tuple[list[Turn], list[str | None], list[str]]:
    from tests.clients.harness import INSTALLS

    home, work = _dirs(tmp)
    venv = INSTALLS["aider"].path
    # aider fetches litellm's model price list from raw.githubusercontent.com unless its 24 h cache
    # is fresh: seed the cache with the copy litellm ships.
    caches = home / ".aider" / "caches"
    caches.mkdir(parents=True, exist_ok=True)
    shipped = next(
        (venv / "lib").glob("python3*/site-packages/litellm/model_prices_and_context_window_backup.json")
    )
    shutil.copyfile(shipped, caches / "model_prices_and_context_window.json")
    (home / ".gitconfig").write_text("[user]\n\tname = promptcache suite\n\temail = suite@example.invalid\n")
    (work / "hello.py").write_text("print('hello')\n")
    env = base_env(home) | {
        "ANTHROPIC_API_BASE": stack.proxy_url,
        "ANTHROPIC_API_KEY": DUMMY_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    import subprocess

    subprocess.run(["git", "init", "-q", "."], cwd=work, env=env, check=True)
    common = [
        str(venv / "bin" / "aider"),
        "--model", recipe.model, "--cache-prompts", "--yes-always", "--no-check-update", "--no-analytics",
        "--no-auto-commits", "--no-show-release-notes", "--no-pretty", "--no-fancy-input",
    ]  # fmt: skip
    # Turns 1-3 in one process (aider reads one prompt per stdin line; aider offers no tools, so
    # turn 2's `[[reply:...]]` marker makes the simulator answer with a SEARCH/REPLACE edit block,
    # which aider applies to hello.py and sends back as the file's new contents); turn 4 resumes
    # the session in a new process from .aider.chat.history.md.
    first = run_isolated(stack, [*common, "hello.py"], env, work, stdin="\n".join(recipe.prompts[:3]) + "\n")
    second = run_isolated(
        stack, [*common, "--restore-chat-history", "--message", recipe.prompts[3], "hello.py"], env, work
    )
    problems: list[str] = []
    for index, turn in enumerate((first, second)):
        if turn.returncode != 0:
            problems.append(_turn_problem(index, turn, "exit status"))
        elif any(m in turn.stdout + turn.stderr for m in _AIDER_ERRORS) or SIM_REPLY not in turn.stdout:
            problems.append(_turn_problem(index, turn, f"stdout {turn.stdout[-400:]!r}"))
    if "Restored previous conversation history" not in second.stdout:
        problems.append("turn 4: aider did not restore the chat history")
    return [first, second], [None, None], problems


# --- the recipes ---------------------------------------------------------------------------------

RECIPES: Final = {
    r.name: r
    for r in (
        Recipe(
            "claude-code",
            "npm",
            "/v1/messages",
            "claude-opus-5-5 (its default)",
            "Bash",
            "Claude Code 2.1.328 (npm @anthropic-ai/claude-code), claude -p then --resume (3 turns), "
            "then a new one-turn session, Anthropic Messages, streamed",
            _claude_code,
            (HELLO, tool_prompt("Bash"), THANKS),
            fresh_prompts=(NEW_SESSION,),
        ),
        Recipe(
            "codex",
            "npm",
            "/v1/responses",
            "gpt-5.5",
            "exec_command",
            "Codex CLI 0.171.0 (npm @openai/codex), model gpt-5.5, codex exec --json then exec resume, "
            "OpenAI Responses, streamed",
            _codex,
            (HELLO, tool_prompt("exec_command", "cmd"), THANKS),
        ),
        Recipe(
            "codex-default",
            "npm",
            "/v1/responses",
            "(default: gpt-6.2-sol)",
            None,
            "Codex CLI 0.171.0 (npm @openai/codex) with its default model gpt-6.2-sol (tools in an "
            "`additional_tools` input item), codex exec --json then exec resume, OpenAI Responses, streamed",
            _codex,
            (HELLO, tool_prompt("exec", "code"), THANKS),
            no_tool_reason=(
                "Codex's default model gpt-6.2-sol sends its tools in an `additional_tools` input item "
                "(namespaces; the shell is the custom tool `exec`, which runs JavaScript in Codex's own "
                "sandbox). The simulator offers them and answers [[tool:exec ...]] with a custom_tool_call "
                "(tests/clients/data/sim-responses-additional-tools.json, fixed), but this recipe's marker "
                "passes a JSON command, not JavaScript, so no shell round trip is checked here yet"
            ),
        ),
        Recipe(
            "hermes-anthropic",
            "hermes",
            "/v1/messages",
            "claude-sonnet-4-6",
            "terminal",
            "Hermes Agent 0.19.0 (PyPI hermes-agent), hermes chat -q then --resume, provider anthropic, "
            "Anthropic Messages, streamed",
            _hermes,
            (HELLO, tool_prompt("terminal"), THANKS),
        ),
        Recipe(
            "hermes-chat",
            "hermes",
            "/v1/chat/completions",
            "gpt-5.5",
            "terminal",
            "Hermes Agent 0.19.0 (PyPI hermes-agent), hermes chat -q then --resume, provider custom, "
            "OpenAI Chat Completions, streamed",
            _hermes,
            (HELLO, tool_prompt("terminal"), THANKS),
        ),
        Recipe(
            "aider",
            "aider",
            "/v1/messages",
            "claude-sonnet-4-5",
            None,
            "aider 0.86.2 (PyPI aider-chat), three prompts on stdin (the second scripts an edit) then "
            "--restore-chat-history --message, "
            "--cache-prompts, Anthropic Messages via litellm, streamed",
            _aider,
            (HELLO, EDIT_PROMPT, "What does hello.py print now?", "Thanks."),
        ),
    )
}
