"""Which upstream each provider really talks to, said out loud (banner, `/readyz`, metric).

Pure core: `resolve_upstreams(settings, sim_url)` turns the `upstream` setting into one
`ActiveUpstream` per provider:
- `real`: the configured `anthropic_upstream` / `openai_upstream`;
- `sim`: the built-in simulator at `sim_url` (with `upstream: auto` when no real API was
  reachable at start, `fallback` is then true);
- `custom`: one base URL given as `upstream` for both providers.
`host` is `hostname[:port]` of the base URL (the port only when not the scheme's default): the
value of `promptcache_upstream_info{provider,mode,host}`, the banner and `/readyz`.

`redact_url(url)` drops a password from a store URL before it is printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from proxy.settings import Settings

PROVIDER_NAMES: Final = ("anthropic", "openai")
MODES: Final = ("real", "sim", "custom")


@dataclass(frozen=True, slots=True)
class ActiveUpstream:
    provider: str
    mode: str
    """One of `MODES`."""
    url: str
    """Base URL requests go to (no trailing slash)."""
    fallback: bool = False
    """True when `upstream: auto` chose the simulator because no real API was reachable."""

    @property
    def host(self) -> str:
        """The first base URL's host (an upstream may list several: `proxy.affinity`)."""
        return host_of(self.url.split(",", 1)[0])

    def as_json(self) -> dict[str, object]:
        return {"mode": self.mode, "host": self.host, "url": self.url, "fallback": self.fallback}


def host_of(url: str) -> str:
    """`hostname[:port]` of `url`; the port only when it is not the scheme's default."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    default = 443 if parts.scheme == "https" else 80
    return f"{host}:{parts.port}" if parts.port and parts.port != default else host


def resolve_upstreams(settings: Settings, sim_url: str | None, *, fallback: bool = False) -> dict[str, ActiveUpstream]:
    """Provider -> `ActiveUpstream`; `sim_url` is the running simulator's base URL when the
    simulator serves (`upstream: sim`, or `auto` that fell back: `fallback=True`)."""
    if sim_url is not None:
        return {p: ActiveUpstream(p, "sim", sim_url.rstrip("/"), fallback) for p in PROVIDER_NAMES}
    if settings.upstream.startswith(("http://", "https://")):
        base = settings.upstream.rstrip("/")
        return {p: ActiveUpstream(p, "custom", base) for p in PROVIDER_NAMES}
    providers = settings.providers
    return {p: ActiveUpstream(p, "real", providers[p].upstream) for p in PROVIDER_NAMES}


def redact_url(url: str) -> str:
    """`url` with any password replaced by `***` (`redis://:pw@host/0` -> `redis://:***@host/0`)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    netloc = f"{user}:***@{parts.hostname or ''}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
