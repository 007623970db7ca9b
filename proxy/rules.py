"""Rule files: loading, validation and `promptcache check-rules`.

A rules folder (the packaged one is `rules/` at the repository root, next to `proxy/`) holds:

- `default.yaml` and any `*.rules.yaml`: segment rules that classify system-prompt text as
  `stable`, `session` or `volatile` (schema and one example per kind: `rules/README.md`). Files
  are merged in file-name order; rule names are unique across them.
- `models.yaml`: the minimum cacheable prefix per model-id prefix (tokens), read by the
  breakpoint planner. A folder without one uses the packaged table.
- anything else (`simulator.yaml`, `pricing.yaml` ...) belongs to other components; not read here.

`load_rules(dir)` returns a frozen `RuleSet` or raises `RuleError` listing every problem at once.
Each problem names the file, the key path and the line (`default.yaml:12: rules[3].tier: ...`).
Files are parsed with PyYAML's safe loader (node by node, to keep line numbers); unknown keys,
duplicate keys, bad regular expressions, patterns that can backtrack super-linearly
(`proxy.regexcheck`: nested or adjacent unbounded quantifiers over overlapping classes; the
message names the rule) and a missing or unknown `version` are errors. A
`RuleSet` is never edited: a reload builds a new one.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeGuard

import yaml

from proxy.paths import packaged_rules_dir
from proxy.regexcheck import superlinear_reason

PACKAGED_DIR: Final = packaged_rules_dir()
TIERS: Final = ("stable", "session", "volatile")
KINDS: Final = ("block", "section", "paragraph", "line")
VERSION: Final = 1
MODELS_FILE: Final = "models.yaml"
MAX_RULE_LINE_CHARS: Final = 16 * 1024
"""Longest line the rules are run on (characters). A rule describes a short line (a timestamp,
a cwd, a header); a longer line is content (minified JSON, a pasted log), classified as no
rule's and never masked, so one hostile line cannot hold the event loop (issue 11)."""

LINE_SCAN_COST: Final = 64
"""Characters one line's classification costs beyond its length (the per-line work of running
every pattern: many distinct short lines are not free)."""


_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")


def is_value_token(token: str) -> bool:
    """Whether a whitespace token is a value a volatile rule's match may change every request:
    it holds a digit (`2026-11-29T20:09:13Z`, `1,046`, `(0.5%)`, `$1.25`) or is 4+ hex
    characters (an id without a digit). Replay masks these inside a volatile span
    (`proxy.pipeline.replay`), and session identity leaves them out of a one-line volatile
    segment (`proxy.pipeline.segments.without_volatile`)."""
    return any(c.isdigit() for c in token) or (len(token) >= 4 and _HEX_DIGITS.issuperset(token))


class Budget:
    """Characters the rules may still scan for one request. Replay masking
    (`proxy.pipeline.replay.Masker.budget`): each pattern run over a text costs its length;
    once spent, the rest of the request is not masked (its messages keep their exact digests:
    replay then needs identical text). Segment classification
    (`proxy.pipeline.segments.Classifier`): each line not seen before costs its length plus
    `LINE_SCAN_COST`; once spent, the caller leaves the text as sent. `is_spent` is then set,
    so the caller can count it."""

    __slots__ = ("left", "is_spent")

    def __init__(self, chars: int) -> None:
        self.left = chars
        self.is_spent = False

    def take(self, chars: int) -> bool:
        """Spend `chars`; `False` (and nothing spent) when not enough is left."""
        if chars > self.left:
            self.is_spent = True
            return False
        self.left -= chars
        return True


_RULE_KEYS: Final = frozenset(
    {"name", "kind", "pattern", "tier", "end", "until", "move_to_user", "pin", "pin_changes_to_user", "description"}
)
_RULES_TOP: Final = frozenset({"version", "description", "rules"})
_MODELS_TOP: Final = frozenset({"version", "description", "default_min_tokens", "min_tokens"})


class RuleError(ValueError):
    """Invalid rule files; `errors` holds one message per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class Rule:
    """One segment rule. Patterns are matched against single lines (no newline)."""

    name: str
    kind: str
    """`block`, `section`, `paragraph` or `line` (see rules/README.md)."""
    pattern: re.Pattern[str]
    tier: str
    end: re.Pattern[str] | None = None
    """`section` only: the section ends with the first later line matching it (included)."""
    until: re.Pattern[str] | None = None
    """`section` only: the section ends before the first later line matching it."""
    move_to_user: bool = False
    """`volatile` only: move the segment onto the newest user message instead of sorting it
    to the end of the system prompt (every volatile rule of the packaged `default.yaml` sets
    it; see rules/README.md)."""
    source: str = ""
    """`file:line` where the rule is written."""
    pin: bool = False
    """`stable` or `session` only: the segment is sent with its first-seen bytes while its fields are
    unchanged, whitespace and formatting aside (`proxy.pipeline.pins`, rules/README.md)."""
    pin_changes_to_user: bool = False
    """With `pin`: when the fields do change, the first-seen bytes stay in the system prompt and
    the new value travels as a leading text block of the newest user message."""


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...]
    min_tokens_by_prefix: tuple[tuple[str, int], ...]
    """`(model-id prefix, minimum cacheable tokens)`, longest prefix first."""
    default_min_tokens: int
    sources: tuple[str, ...] = ()

    def min_tokens(self, model: Any) -> int:
        """Minimum cacheable prefix of `model` in tokens (longest matching prefix wins)."""
        if isinstance(model, str):
            for prefix, tokens in self.min_tokens_by_prefix:
                if model.startswith(prefix):
                    return tokens
        return self.default_min_tokens


class _Doc:
    """A YAML document as plain values plus the line of every key path."""

    def __init__(self, path: Path, errors: list[str]) -> None:
        self.name = str(path)
        self.lines: dict[tuple[Any, ...], int] = {}
        self.errors = errors
        self.value: Any = None
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            errors.append(f"{self.name}: cannot read: {exc.strerror}")
            return
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                self.value = self._build(loader, node, ())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            errors.append(f"{self.name}{line}: invalid YAML: {problem}")
        finally:
            loader.dispose()

    def _build(self, loader: yaml.SafeLoader, node: yaml.Node, path: tuple[Any, ...]) -> Any:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node, deep=True)
                if key in out:
                    self.error(path + (key,), "duplicate key", key_node.start_mark.line + 1)
                out[key] = self._build(loader, value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._build(loader, item, path + (i,)) for i, item in enumerate(node.value)]
        return loader.construct_object(node, deep=True)

    def error(self, path: tuple[Any, ...], message: str, line: int | None = None) -> None:
        if line is None:
            probe = path
            while probe not in self.lines and probe:
                probe = probe[:-1]
            line = self.lines.get(probe, 1)
        self.errors.append(f"{self.name}:{line}: {_dotted(path) or '(top)'}: {message}")


def _dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _top(doc: _Doc, allowed: frozenset[str]) -> dict[str, Any] | None:
    if not isinstance(doc.value, dict):
        if doc.value is not None or not doc.errors:
            doc.error((), "the file must be a mapping with a `version` key")
        return None
    for key in doc.value:
        if key not in allowed:
            doc.error((key,), f"unknown key (allowed: {', '.join(sorted(allowed))})")
    if "version" not in doc.value:
        doc.error((), f"missing `version: {VERSION}`")
    elif doc.value["version"] != VERSION:
        doc.error(("version",), f"unsupported version {doc.value['version']!r} (supported: {VERSION})")
    return doc.value


def _regex(doc: _Doc, path: tuple[Any, ...], value: Any, rule: Any = None) -> re.Pattern[str] | None:
    if not isinstance(value, str) or not value:
        doc.error(path, "must be a non-empty regular expression string")
        return None
    try:
        compiled = re.compile(value)
    except re.error as exc:
        doc.error(path, f"invalid regular expression: {exc}")
        return None
    reason = superlinear_reason(value)
    if reason is not None:
        named = f"rule {rule!r}: " if isinstance(rule, str) else ""
        doc.error(path, f"{named}pattern can backtrack super-linearly: {reason}")
        return None
    return compiled


def _rule(doc: _Doc, i: int, raw: Any, names: dict[str, str]) -> Rule | None:
    at = ("rules", i)
    if not isinstance(raw, dict):
        doc.error(at, "each rule must be a mapping")
        return None
    count = len(doc.errors)
    for key in raw:
        if key not in _RULE_KEYS:
            doc.error(at + (key,), f"unknown key (allowed: {', '.join(sorted(_RULE_KEYS))})")
    for key in ("name", "kind", "pattern", "tier"):
        if key not in raw:
            doc.error(at, f"missing `{key}`")
    name, kind, tier = raw.get("name"), raw.get("kind"), raw.get("tier")
    if "name" in raw and (not isinstance(name, str) or not name):
        doc.error(at + ("name",), "must be a non-empty string")
    elif isinstance(name, str) and name in names:
        doc.error(at + ("name",), f"duplicate rule name {name!r} (first at {names[name]})")
    elif isinstance(name, str):
        names[name] = f"{doc.name}:{doc.lines.get(at, 1)}"
    if "kind" in raw and kind not in KINDS:
        doc.error(at + ("kind",), f"must be one of {', '.join(KINDS)} (got {kind!r})")
    if "tier" in raw and tier not in TIERS:
        doc.error(at + ("tier",), f"must be one of {', '.join(TIERS)} (got {tier!r})")
    pattern = _regex(doc, at + ("pattern",), raw.get("pattern"), name) if "pattern" in raw else None
    end = until = None
    for key in ("end", "until"):
        if key in raw:
            if kind != "section":
                doc.error(at + (key,), "only a `section` rule has an end")
            compiled = _regex(doc, at + (key,), raw[key], name)
            end, until = (compiled, until) if key == "end" else (end, compiled)
    if "end" in raw and "until" in raw:
        doc.error(at + ("until",), "give `end` or `until`, not both")
    move = raw.get("move_to_user", False)
    if not isinstance(move, bool):
        doc.error(at + ("move_to_user",), "must be true or false")
    elif move and tier != "volatile":
        doc.error(at + ("move_to_user",), "only a `volatile` segment can move to the user message")
    pin = raw.get("pin", False)
    if not isinstance(pin, bool):
        doc.error(at + ("pin",), "must be true or false")
    elif pin and tier not in ("stable", "session"):
        doc.error(at + ("pin",), "only a `stable` or `session` segment can be pinned")
    to_user = raw.get("pin_changes_to_user", False)
    if not isinstance(to_user, bool):
        doc.error(at + ("pin_changes_to_user",), "must be true or false")
    elif to_user and pin is not True:
        doc.error(at + ("pin_changes_to_user",), "needs `pin: true`")
    if "description" in raw and not isinstance(raw["description"], str):
        doc.error(at + ("description",), "must be a string")
    if len(doc.errors) != count or pattern is None:
        return None
    # no error: name, kind and tier passed the checks above (non-empty string, one of KINDS, TIERS)
    if not (isinstance(name, str) and isinstance(kind, str) and isinstance(tier, str)):
        return None
    return Rule(name, kind, pattern, tier, end, until, bool(move), names[name], bool(pin), bool(to_user))


def _rules_file(path: Path, errors: list[str], names: dict[str, str]) -> list[Rule]:
    doc = _Doc(path, errors)
    top = _top(doc, _RULES_TOP)
    if top is None:
        return []
    raw_rules = top.get("rules", [])
    if not isinstance(raw_rules, list):
        doc.error(("rules",), "must be a list of rules")
        return []
    return [r for i, raw in enumerate(raw_rules) if (r := _rule(doc, i, raw, names)) is not None]


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _models_file(path: Path, errors: list[str]) -> tuple[tuple[tuple[str, int], ...], int]:
    doc = _Doc(path, errors)
    top = _top(doc, _MODELS_TOP)
    if top is None:
        return (), 0
    default = top.get("default_min_tokens")
    if not _is_count(default):
        doc.error(("default_min_tokens",), "must be a whole number of tokens >= 0")
        default = 0
    table = top.get("min_tokens", {})
    pairs: list[tuple[str, int]] = []
    if not isinstance(table, dict):
        doc.error(("min_tokens",), "must map model-id prefixes to token counts")
        table = {}
    for prefix, tokens in table.items():
        if not isinstance(prefix, str) or not prefix:
            doc.error(("min_tokens", prefix), "a model-id prefix must be a non-empty string")
        elif not _is_count(tokens):
            doc.error(("min_tokens", prefix), "must be a whole number of tokens >= 0")
        else:
            pairs.append((prefix, tokens))
    pairs.sort(key=lambda pair: (-len(pair[0]), pair[0]))
    return tuple(pairs), default


def _rule_files(folder: Path) -> list[Path]:
    files = [folder / "default.yaml"] if (folder / "default.yaml").is_file() else []
    return files + sorted(folder.glob("*.rules.yaml"))


def _load(folder: Path) -> tuple[RuleSet | None, list[str]]:
    errors: list[str] = []
    if not folder.is_dir():
        return None, [f"{folder}: {'not a folder' if folder.exists() else 'no such file or folder'}"]
    files = _rule_files(folder)
    if not files:
        errors.append(f"{folder}: no rule files (default.yaml or *.rules.yaml)")
    names: dict[str, str] = {}
    rules = [rule for path in files for rule in _rules_file(path, errors, names)]
    models = folder / MODELS_FILE
    if not models.is_file():
        models = PACKAGED_DIR / MODELS_FILE
    table, default = _models_file(models, errors)
    sources = tuple(str(p) for p in [*files, models])
    if errors:
        return None, errors
    return RuleSet(tuple(rules), table, default, sources), []


def load_rules(dir: Path | str | None = None) -> RuleSet:
    """The rules of `dir` (default: the packaged `rules/`); raises `RuleError`."""
    ruleset, errors = _load(Path(dir) if dir is not None else PACKAGED_DIR)
    if ruleset is None:
        raise RuleError(errors)
    return ruleset


@functools.lru_cache(maxsize=8)
def cached_rules(dir: Path | None = None) -> RuleSet:
    """`load_rules(dir)`, loaded once per folder (for stages running before the app wires
    `services.rules`)."""
    return load_rules(dir)


def check_rules(dir: Path | str | None = None) -> list[str]:
    """Every problem in the rule files of `dir` (default: the packaged `rules/`) and in the
    other files `serve` reads from it (`pricing.yaml`, `profiles.yaml`, `simulator.yaml`, each
    by its own loader); empty when they all load."""
    folder = Path(dir) if dir is not None else PACKAGED_DIR
    errors = _load(folder)[1]
    for name in _OTHER_FILES:
        if (folder / name).is_file():
            errors.extend(check_rule_file(folder / name)[1])
    return errors


def _check_pricing(path: Path) -> None:
    from proxy.pricing import load_pricing

    load_pricing(path)


def _check_profiles(path: Path) -> None:
    from proxy.profiles import parse_profiles

    parse_profiles(path.read_text(encoding="utf-8"), str(path))


def _check_simulator(path: Path) -> None:
    from proxy.sim.config import SimConfig

    SimConfig.load(path)


_OTHER_FILES: Final = {
    "pricing.yaml": _check_pricing,
    "profiles.yaml": _check_profiles,
    "simulator.yaml": _check_simulator,
}
"""The other files of a rules folder, by name, each validated by its own loader."""


def check_rule_file(path: Path | str) -> tuple[str, list[str]]:
    """`(summary, problems)` for one file: `pricing.yaml`, `profiles.yaml` and `simulator.yaml`
    by their own loaders, the model table when it is named `models.yaml`, else a rule file
    (`default.yaml`, `*.rules.yaml` or any YAML of that schema)."""
    path = Path(path)
    errors: list[str] = []
    other = _OTHER_FILES.get(path.name)
    if other is not None:
        try:
            other(path)
        except (ValueError, OSError) as exc:  # PricingError, ProfileError, ConfigError name file and key
            return "", str(exc).splitlines()
        return f"ok: {path.name} loads", []
    if path.name == MODELS_FILE:
        table, _ = _models_file(path, errors)
        return f"ok: {len(table)} model minimums", errors
    rules = _rules_file(path, errors, {})
    return f"ok: {len(rules)} rules", errors


def check_rules_command(dir: str | None = None) -> int:
    """`promptcache check-rules [DIR | FILE]`: print the problems (exit 1) or a summary (exit 0).

    A folder is checked as `serve` loads it; a single file on its own (its rule names only
    need to be unique within it)."""
    if dir is not None and Path(dir).is_file():
        summary, errors = check_rule_file(dir)
    else:
        errors = check_rules(dir)
        summary = ""
        if not errors:
            ruleset = load_rules(dir)
            summary = f"ok: {len(ruleset.rules)} rules, {len(ruleset.min_tokens_by_prefix)} model minimums"
    if errors:
        for line in errors:
            print(line, file=sys.stderr)
        return 1
    print(summary)
    return 0


def pinned_rules(ruleset: RuleSet) -> dict[str, Rule]:
    """Rule name -> rule, for the rules with `pin: true` (read-only; the pins stage)."""
    return {rule.name: rule for rule in ruleset.rules if rule.pin}


def volatile_patterns(ruleset: RuleSet) -> tuple[re.Pattern[str], ...]:
    """Patterns of the `volatile` rules and of the pinned rules whose changes move to the user
    message (their value may change within a session), in rule order (read-only; replay and
    session inference mask with them)."""
    return tuple(
        rule.pattern for rule in ruleset.rules if rule.tier == "volatile" or rule.pin_changes_to_user
    )
