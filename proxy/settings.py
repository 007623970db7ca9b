"""Settings: a frozen, validated configuration built once at start.

Sources, later wins: defaults < YAML file (`--config FILE`) < `PROMPTCACHE_*` environment
variables < command-line flags. Environment names are the field names upper-cased with the
`PROMPTCACHE_` prefix (`PROMPTCACHE_PORT=9000`); list fields and capability flags take
comma-separated values (`PROMPTCACHE_ANTHROPIC_CAPABILITIES=strip_ttl,strip_scope`).

`load_settings` raises `SettingsError` whose message names every invalid setting and where it
came from; `promptcache serve` prints it and exits with status 2.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_PREFIX = "PROMPTCACHE_"


def default_state_dir() -> Path:
    """`$XDG_STATE_HOME/promptcache`, else `~/.local/state/promptcache`."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "promptcache"


class UpstreamCapabilities(BaseModel):
    """What an upstream accepts in `cache_control` markers (docs/provider-rules.md 1.2, 1.7).

    The upstream profile (`anthropic_profile`, `openai_profile`) sets these; the settings
    `anthropic_capabilities` / `openai_capabilities` add to the profile's (overrides)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strip_ttl: bool = False
    """Remove `ttl` from every marker (strict Anthropic-compatible upstreams reject it)."""
    strip_scope: bool = False
    """Remove `scope` (Bedrock, Vertex, Foundry reject `scope: "global"`)."""
    no_tool_message_markers: bool = False
    """Never place a marker on a tool message / tool_result block."""


class ProviderSettings(BaseModel):
    """One provider's settings (`Settings.providers[name]`): where its requests go and what
    that upstream accepts. Set through the flat `<provider>_upstream`, `<provider>_profile` and
    `<provider>_capabilities` settings (environment variables and YAML keys keep those names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    upstream: str
    """Base URL of the provider's API (`anthropic_upstream`, `openai_upstream`)."""
    profile: str
    """Upstream profile on its paths (`rules/profiles.yaml`)."""
    capabilities: UpstreamCapabilities
    """Overrides of the profile's marker capabilities."""


class Settings(BaseModel):
    """Every setting of `promptcache serve`, validated; see README "Configuration"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    upstream: str = "auto"
    """`auto` (the real APIs when reachable, else the built-in simulator), `real`, `sim`, or
    one base URL used for both providers."""
    anthropic_upstream: str = "https://api.anthropic.com"
    openai_upstream: str = "https://api.openai.com"
    mode: Literal["optimise", "observe"] = "optimise"
    """`observe` measures only and forwards the client's bytes unchanged."""
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    connect_timeout: float = Field(10.0, gt=0)
    """Seconds to open an upstream connection before answering 502."""
    read_timeout: float = Field(600.0, gt=0)
    """Seconds without an upstream byte before answering 504 (or ending the stream)."""
    store: str = ""
    """`memory://`, `sqlite:///path/to/file.db` or `redis://host:port/db`; empty means SQLite
    in `state_dir`."""
    state_dir: Path = Field(default_factory=default_state_dir)
    secret: str = ""
    """HMAC key for tenant hashes; empty means generated once and kept in `state_dir/secret`."""
    rules_dir: Path | None = None
    """Folder of rule files; empty means the packaged `rules/`."""
    session_headers: tuple[str, ...] = ("x-claude-code-session-id", "x-session-id")
    anthropic_profile: str = "direct"
    """Upstream profile on the Anthropic paths (`rules/profiles.yaml`): `direct`, `vertex`,
    `bedrock`, `foundry`, `strict-compatible`, or one of the rules folder's own."""
    openai_profile: str = "direct"
    """Upstream profile on the OpenAI paths: `direct`, `azure`, `openrouter`, `litellm` ..."""
    anthropic_capabilities: UpstreamCapabilities = UpstreamCapabilities()
    openai_capabilities: UpstreamCapabilities = UpstreamCapabilities()
    workers: int = Field(1, ge=1, le=256)
    """Worker processes, each with its own event loop, on one port (`SO_REUSEPORT`), sharing the
    store and aggregating `/metrics` (`proxy.workers`); more than 1 needs SQLite or Redis."""
    admin_port: int | None = Field(None, ge=0, le=65535)
    """Port of a separate listener for `/metrics`, `/debug` and `/ui`; none means the main one
    serves them."""
    admin_host: str = ""
    """Address of the admin listener (with `admin_port`); empty means `host`."""
    admin_token: str = ""
    """When set, `/metrics`, `/debug` and `/ui` need `Authorization: Bearer <token>` or
    `?token=<token>`; required when those routes listen on a non-loopback address."""
    memory_budget_mb: int = Field(16, ge=1)
    """MiB for the in-memory caches that grow with the sessions seen (decoded records, the
    session inference index, the forensic map's history, the replay masker's memos), split by
    fixed shares (`proxy.memory_budget`); the interpreter, the tokenizer and requests in flight come on
    top."""
    history_sessions: int = Field(512, ge=0)
    """Recent sessions kept in memory for `/ui/` and `/debug/sessions` (0 = none)."""
    history_sessions_per_tenant: int = Field(64, ge=1)
    """At most this many of them per tenant (the least recently seen go first)."""
    history_requests: int = Field(200, ge=1)
    """Request rows kept per session (the newest)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Any case (`debug` = `DEBUG`)."""
    log_format: Literal["text", "json"] = "text"
    """`json`: one JSON object per line (`ts`, `level`, `logger`, `message`, and the access
    line's fields), for log collectors."""
    record: Path | None = None
    """Append every pipeline request's client body to this JSONL trace (workload format;
    credentials never recorded)."""
    team_header: str = ""
    """Request header naming the team (`x-team`); only values in `teams` (or the file) count."""
    teams: tuple[str, ...] = ()
    """Allowlist of team names; any other value is counted as team `other`."""
    teams_file: Path | None = None
    """YAML `version: 1`, `teams: {<sha256 hex of an API key>: <team>}`; wins over the header."""
    cache_diagnostics: bool = False
    """Ask the upstream's cache diagnostics against the session's previous response: Anthropic
    `diagnostics.previous_message_id` on every turn, OpenAI GPT-5.6+ Responses
    `prompt_cache_options.comparison_response_id` from the second turn."""
    keep_warm: str = "off"
    """`off`, `on`, or a cap in USD per tenant per hour: after a turn-ending response, ping the
    upstream shortly before the 5-minute entry expires while the person is likely to come back
    (`proxy/keepwarm.py`)."""
    tracing: bool = False
    """OpenTelemetry spans per request, stage and upstream call, exported over OTLP/HTTP
    (`OTEL_EXPORTER_OTLP_*`); needs the `otel` extra (`proxy/otel.py`)."""
    client_idle_timeout: float = Field(75.0, gt=0)
    """Seconds a client connection may stay open without a complete request: idle keep-alive
    connections, and connections that never finish sending their headers, are then closed."""
    client_header_timeout: float = Field(30.0, gt=0)
    """Seconds from the first byte of a request head to its end; exceeded: 408 in the provider's
    error shape and the connection closed (`proxy.connections`)."""
    client_body_timeout: float = Field(60.0, gt=0)
    """Longest pause, in seconds, between two reads of a request body; exceeded: 408 and the
    connection closed."""
    max_header_bytes: int = Field(32 * 1024, ge=1024)
    """Bytes of a request line and headers together; more: 431 and the connection closed."""
    max_header_count: int = Field(128, ge=1)
    """Header lines a request may carry (aiohttp's own limit, 128, by default); more: 431 in the
    provider's error shape and the connection closed."""
    max_connections: int = Field(512, ge=1)
    """Client connections open at once; the one over it gets 503 (`Retry-After: 1`) and is
    closed. Each may also hold an upstream connection: keep it under the open-file limit."""
    shutdown_grace_seconds: float = Field(5.0, ge=0)
    """Seconds `serve` keeps answering requests on connections already open after SIGTERM or
    SIGINT (no new connection is accepted; every response says `Connection: close`; `/readyz`
    answers 503 `draining`); it stops sooner once every connection has closed
    (`proxy.shutdown`)."""
    max_connections_per_client: int | None = Field(None, ge=1)
    """Client connections open at once from one client address; the one over it gets 503 like
    one over `max_connections`. Unset: a quarter of `max_connections` (at least 1). Probes
    (`/healthz`, `/readyz`, `/metrics`) are served over either cap (`proxy.connections`)."""
    pipeline_budget_bytes: int = Field(8 * 1024 * 1024, ge=0)
    """Request bodies larger than this (bytes) skip every stage after `parse`: forwarded as
    sent, usage counted, nothing measured or stored (`proxy.pipeline.budget`), so one huge body
    cannot hold the event loop every tenant shares."""
    pipeline_inflight_bytes: int = Field(2 * 1024 * 1024, ge=0)
    """Client-body bytes in the request stages at once; a request beyond it waits, in arrival
    order, holding only its raw bytes (a body larger than this runs alone; 0: no bound). The
    stages are CPU work on one loop, so more at once only interleaves them, each holding its
    parsed and rewritten copies meanwhile (`proxy.admission`). 2 MiB: three 600 KB bodies
    (4 MiB let seven in, for a higher peak RSS and no more requests served)."""
    pipeline_budget_blocks: int = Field(10_000, ge=0)
    """The same for bodies of more blocks than this (messages, input items, tools, system and
    content blocks)."""
    pipeline_budget_nodes: int = Field(50_000, ge=0)
    """The same for bodies of more JSON objects and arrays than this, at any depth (tool inputs
    and schemas, nested tool results: what the stages walk below the blocks)."""
    pipeline_budget_values: int = Field(250_000, ge=0)
    """The same for bodies of more JSON values than this, scalars included (bounded from the raw
    bytes by their `,`, `{` and `[`)."""
    malloc_arena_max: int = Field(2, ge=0)
    """glibc arenas the process may make (`mallopt(M_ARENA_MAX)` at start): the event loop's
    heap and one shared by the other threads (SQLite's, the executor's); 0: glibc's default,
    eight per core, each free to grow its own heap (`proxy.allocator`)."""
    malloc_mmap_threshold: int = Field(0, ge=0, le=32 * 1024 * 1024)
    """Bytes from which an allocation gets its own mapping, returned to the system when freed
    (`mallopt(M_MMAP_THRESHOLD)`); 0: glibc's own, raised after each large block freed (so after
    the first large body every buffer comes from the heap). A fixed one costs a page fault per
    touched page of each larger buffer (`proxy.allocator`)."""
    malloc_trim_interval: float = Field(1.0, ge=0)
    """Seconds between `malloc_trim(0)` calls (free heap pages back to the system, from a
    thread) while pipeline requests are served, and once after they stop; 0: never
    (`proxy.allocator`)."""
    store_max_bytes: int = Field(1024 * 1024 * 1024, ge=1)
    """Bytes of session records the SQLite store may hold; past it the least recently written
    records (of any tenant) are evicted (`proxy.store.sqlite`). Redis: bounded by its own
    `maxmemory` (README)."""
    store_max_bytes_per_tenant: int | None = Field(None, ge=1)
    """Bytes of session records one tenant may hold in the SQLite store; past it that tenant's
    least recently written records are evicted, so one tenant cannot evict the others. A record
    larger than this alone is not stored, on every backend. Unset: a quarter of
    `store_max_bytes`, at most 256 MiB (`tenant_store_bytes`)."""
    classify_budget_chars: int = Field(4 * 1024 * 1024, ge=0)
    """Characters of client text the rules may scan per request (each pattern run costs the
    text's length); past it the rest of the request is not masked for replay (counted in
    `promptcache_rules_budget_exceeded_total`)."""
    reorder_budget_chars: int = Field(512 * 1024, ge=0)
    """Characters of system-prompt lines not classified before that the segment rules may
    classify per request (each line costs its length plus 64; reorder, pins and the session
    map share it). Past it the system prompt is left as sent, not reordered (counted in
    `promptcache_rules_budget_exceeded_total{stage}`); the lines classified so far are
    remembered, so a large new prompt is reordered from a later request on."""

    @property
    def tenant_store_bytes(self) -> int:
        """The per-tenant cap in force (bytes): `store_max_bytes_per_tenant`, else a quarter of
        `store_max_bytes` and at most 256 MiB, so lowering the total alone keeps tenants apart."""
        if self.store_max_bytes_per_tenant is not None:
            return self.store_max_bytes_per_tenant
        return max(1, min(256 * 1024 * 1024, self.store_max_bytes // 4))

    @field_validator("keep_warm", mode="before")
    @classmethod
    def _keep_warm(cls, value: Any) -> Any:
        """`off`, `on` or a number of USD >= 0 (per tenant per hour)."""
        text = str(value).strip().lower()
        if text in ("off", "on", "false", "true"):
            return {"false": "off", "true": "on"}.get(text, text)
        try:
            cap = float(text)
        except ValueError:
            raise ValueError("keep_warm must be off, on, or a cap in USD per tenant per hour") from None
        if not cap >= 0:
            raise ValueError("keep_warm must be off, on, or a cap in USD per tenant per hour")
        return text

    @cached_property
    def providers(self) -> dict[str, ProviderSettings]:
        """Provider name (`anthropic`, `openai`: the adapters' `name`) -> its settings, the one
        mapping per-provider code reads (never an attribute name built from the provider's)."""
        return {
            "anthropic": ProviderSettings(
                upstream=self.anthropic_upstream,
                profile=self.anthropic_profile,
                capabilities=self.anthropic_capabilities,
            ),
            "openai": ProviderSettings(
                upstream=self.openai_upstream, profile=self.openai_profile, capabilities=self.openai_capabilities
            ),
        }

    @field_validator("anthropic_capabilities", "openai_capabilities", mode="before")
    @classmethod
    def _capabilities(cls, value: Any) -> Any:
        """Also accept a list of flag names or a comma-separated string: `strip_ttl,strip_scope`."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, (list, tuple)):
            return {str(flag): True for flag in value}
        return value

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _case(cls, value: Any, info: Any) -> Any:
        if isinstance(value, str):
            return value.upper() if info.field_name == "log_level" else value.lower()
        return value

    @field_validator("session_headers", "teams", mode="before")
    @classmethod
    def _headers(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("teams")
    @classmethod
    def _teams(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from proxy.teams import TEAM_NAME

        for team in value:
            if not TEAM_NAME.match(team):
                raise ValueError(f"team {team!r} must match {TEAM_NAME.pattern}")
        return value

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str) -> str:
        if value and len(value) < 32:
            raise ValueError("must be at least 32 characters (or empty to generate one)")
        return value

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str) -> str:
        if value in ("auto", "real", "sim") or value.startswith(("http://", "https://")):
            return value
        raise ValueError("must be auto, real, sim or an http(s):// base URL")

    @field_validator("anthropic_upstream", "openai_upstream")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s):// base URL")
        return value.rstrip("/")

    @field_validator("tracing")
    @classmethod
    def _tracing(cls, value: bool) -> bool:
        if value and not _has_module("opentelemetry.sdk"):
            raise ValueError("needs the otel extra: pip install 'promptcache[otel]'")
        return value

    @field_validator("store")
    @classmethod
    def _store(cls, value: str) -> str:
        if value and not value.startswith(("memory://", "sqlite://", "redis://", "rediss://")):
            raise ValueError("must start with memory://, sqlite:// or redis://")
        return value


def _has_module(name: str) -> bool:
    """True when `name` imports; `find_spec` of a submodule raises when its parent is missing."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


class SettingsError(ValueError):
    """Invalid settings; the message names each bad setting and its source."""


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        values[key[len(ENV_PREFIX) :].lower()] = raw
    return values


def _nearest_setting(loc: list[str]) -> str | None:
    """The known setting name nearest to the unknown one at `loc` (difflib ratio >= 0.6), else
    `None`; nested settings (`anthropic_capabilities.strip_tl`) look among their own fields."""
    model: type[BaseModel] = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    return close[0] if close else None


def load_settings(
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge file, environment and overrides into `Settings`.

    Raises `SettingsError` naming the file, variable or flag behind each invalid value.
    """
    environ = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise SettingsError(f"{path}: cannot read: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path}: invalid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise SettingsError(f"{path}: top level must be a mapping of setting names")
        for key, value in loaded.items():
            merged[str(key)] = value
            origin[str(key)] = f"{path}: {key}"
    for key, value in _from_env(environ).items():
        merged[key] = value
        origin[key] = f"{ENV_PREFIX}{key.upper()}"
    for key, value in (overrides or {}).items():
        if value is not None:
            merged[key] = value
            origin[key] = f"--{key.replace('_', '-')}"
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            loc = [str(part) for part in error["loc"]]
            top = loc[0] if loc else "?"
            where = origin.get(top, top)
            dotted = ".".join(loc)
            message = error["msg"]
            if error["type"] == "extra_forbidden":
                near = _nearest_setting(loc)
                if near is not None and len(loc) == 1 and where.startswith(ENV_PREFIX):
                    near = f"{ENV_PREFIX}{near.upper()}"
                message = f'unknown setting; did you mean "{near}"?' if near else "unknown setting"
            lines.append(f"invalid setting {dotted} ({where}): {message}")
        raise SettingsError("\n".join(lines)) from None
    from proxy.admin import admin_exposure_error

    exposure = admin_exposure_error(settings)
    if exposure is not None:
        key = "admin_host" if settings.admin_port is not None and settings.admin_host else "host"
        where = origin.get(key, f"default {key}")
        raise SettingsError(f"invalid setting {exposure} (from {where})")
    return settings
