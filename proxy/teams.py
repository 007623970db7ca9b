"""Teams: which team a request's cost and tokens are attributed to, with bounded cardinality.

Sources, first match wins:
1. `teams_file`: a YAML mapping of credential hashes to team names. A credential hash is the
   SHA-256 hex of the API key exactly as the client sends it (`printf %s "$KEY" | sha256sum`),
   so an operator can write the file without the server's secret and the file never holds a key.
   Shape: `version: 1` and `teams: {<64 hex>: <team>, ...}`.
2. `team_header` (e.g. `x-team`): the header's value, when it is in the allowlist.
The allowlist is `teams` plus every team named in `teams_file`. Anything else (an unknown
header value, no header, an unmapped key) is `OTHER`, so the `team` label has at most
`len(allowlist) + 1` values (prometheus.io/docs/practices/naming: no unbounded label sets).

`TeamResolver.team_of(headers)` is pure and cheap (one dict lookup, one SHA-256 of the key when a
file is configured). `load_team_file(path)` raises `TeamFileError` naming the file and key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import yaml

from proxy.tenant import credential_of

OTHER: Final = "other"
"""The team of every request no configured source names."""
TEAM_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""A team name: 1-64 characters, letters, digits, `_`, `.`, `-` (a safe label value)."""
_HASH: Final = re.compile(r"^[0-9a-f]{64}$")


class TeamFileError(ValueError):
    """An unreadable or invalid `teams_file`; the message names the file and the key."""


def credential_hash(credential: str) -> str:
    """SHA-256 hex of an API key as sent (the `teams_file` key)."""
    return hashlib.sha256(credential.encode()).hexdigest()


def load_team_file(path: Path) -> dict[str, str]:
    """Credential hash -> team from `path` (see the module docstring)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise TeamFileError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise TeamFileError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("teams"), dict):
        raise TeamFileError(f"{path}: must be a mapping with version: 1 and teams: {{<sha256 hex>: <team>}}")
    out: dict[str, str] = {}
    for key, team in data["teams"].items():
        key_text = str(key).lower()
        if not _HASH.match(key_text):
            raise TeamFileError(f"{path}: teams.{key}: not a SHA-256 hex credential hash (64 hex digits)")
        if not isinstance(team, str) or not TEAM_NAME.match(team):
            raise TeamFileError(f"{path}: teams.{key}: team must match {TEAM_NAME.pattern}")
        out[key_text] = team
    return out


@dataclass(frozen=True, slots=True)
class TeamResolver:
    header: str = ""
    """Request header naming the team (`x-team`); empty = not used."""
    allowed: frozenset[str] = frozenset()
    """Teams a header may name (the `teams` setting plus the file's teams)."""
    by_hash: Mapping[str, str] = field(default_factory=dict)
    """Credential hash -> team (`teams_file`)."""

    @classmethod
    def build(cls, header: str, teams: Iterable[str], file_map: Mapping[str, str]) -> TeamResolver:
        return cls(header.lower(), frozenset(teams) | frozenset(file_map.values()), dict(file_map))

    @property
    def labels(self) -> tuple[str, ...]:
        """Every value `team_of` can return, `OTHER` last."""
        return (*sorted(self.allowed - {OTHER}), OTHER)

    def team_of(self, headers: Mapping[str, str]) -> str:
        """The request's team, `OTHER` when no source names an allowed one."""
        if self.by_hash:
            credential = credential_of(headers)
            if credential:
                team = self.by_hash.get(credential_hash(credential))
                if team is not None:
                    return team
        if self.header:
            value = headers.get(self.header, "").strip()
            if value in self.allowed:
                return value
        return OTHER
