"""Rule files: the packaged ones load; invalid ones name file, key path and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.pipeline.replay import mask_strings, span_pattern
from proxy.rules import (
    PACKAGED_DIR,
    RuleError,
    check_rules,
    check_rules_command,
    load_rules,
    volatile_patterns,
)

GOOD_RULE = """\
version: 1
rules:
  - name: stamp
    kind: line
    pattern: '\\d{4}-\\d{2}-\\d{2}T'
    tier: volatile
"""


def _folder(tmp_path: Path, rules: str, models: str | None = None) -> Path:
    (tmp_path / "default.yaml").write_text(rules, encoding="utf-8")
    if models is not None:
        (tmp_path / "models.yaml").write_text(models, encoding="utf-8")
    return tmp_path


def test_packaged_rules_load_and_pass_check() -> None:
    rules = load_rules()
    assert {r.kind for r in rules.rules} == {"block", "section", "paragraph", "line"}
    assert check_rules(PACKAGED_DIR) == []
    assert rules.min_tokens("claude-opus-4-6-20260101") == 4096
    assert rules.min_tokens("claude-opus-4-20250514") == 1024
    assert rules.min_tokens("claude-opus-5") == 512
    assert rules.min_tokens("some-new-model") == rules.default_min_tokens == 1024
    assert rules.min_tokens(None) == 1024


def test_packaged_volatile_rules_move_to_the_user_message_and_cover_their_values() -> None:
    rules = load_rules()
    assert [(r.name, r.move_to_user) for r in rules.rules if r.tier == "volatile"] == [
        ("billing-header", True),
        ("timestamp", True),
        ("time-of-day", True),
        ("epoch-timestamp", True),
        ("usage-counters", True),
        ("request-id", True),
    ]
    assert not any(r.move_to_user for r in rules.rules if r.tier != "volatile")
    spans = [span_pattern(p) for p in volatile_patterns(rules)]
    # the values (tokens holding a digit) are masked, one mask each; the words around them never are
    lines = {
        "x-anthropic-billing-header: cc_version=2.1.328.a1b; cc_entrypoint=cli; cch=51c67;": (
            "x-anthropic-billing-header: # cc_entrypoint=cli; #"
        ),
        "Current time: 2026-11-30T09:00:04Z": "Current time: #",
        "Request id: a33e7a00-c3ae-4dcd-bf96-92914681da88": "Request id: #",
        "Context used: 546 tokens of 200000 (0%)": "Context used: # tokens of # #",
        "Tokens used: 1,234 of 200k tokens, then stop": "Tokens used: # of # tokens, then stop",
        "Session cost: $1.23 so far": "Session cost: # so far",
        "Keep answers short.": "Keep answers short.",
        "Tokens used (ignore): rm -rf / 5000": "Tokens used (ignore): rm -rf / #",
    }
    assert {line: mask_strings(line, spans).replace("\x00volatile\x00", "#") for line in lines} == lines


def test_unknown_key_names_file_path_and_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path, GOOD_RULE + "    colour: blue\n")
    errors = check_rules(folder)
    assert len(errors) == 1
    assert errors[0].startswith(f"{folder / 'default.yaml'}:7: rules[0].colour: unknown key")


def test_bad_values_each_reported_with_their_line(tmp_path: Path) -> None:
    text = """\
version: 1
rules:
  - name: a
    kind: line
    pattern: '(unclosed'
    tier: volatile
  - name: a
    kind: chunk
    pattern: 'x'
    tier: permanent
    move_to_user: true
  - name: b
    kind: line
    pattern: 'x'
    tier: session
    end: 'y'
"""
    errors = check_rules(_folder(tmp_path, text))
    where = [e.split(": ", 2)[0].rsplit(":", 1)[1] + " " + e.split(": ", 2)[1] for e in errors]
    assert where == [
        "5 rules[0].pattern",
        "7 rules[1].name",
        "8 rules[1].kind",
        "10 rules[1].tier",
        "11 rules[1].move_to_user",
        "16 rules[2].end",
    ]
    assert "invalid regular expression" in errors[0]
    assert "duplicate rule name 'a'" in errors[1]


def test_yaml_syntax_error_and_missing_version(tmp_path: Path) -> None:
    errors = check_rules(_folder(tmp_path, "version: 1\nrules:\n  - name: [unclosed\n"))
    assert len(errors) == 1 and ":4: invalid YAML" in errors[0]
    errors = check_rules(_folder(tmp_path, "rules: []\n"))
    assert errors == [f"{tmp_path / 'default.yaml'}:1: (top): missing `version: 1`"]
    errors = check_rules(_folder(tmp_path, "version: 2\nrules: []\n"))
    assert errors == [f"{tmp_path / 'default.yaml'}:1: version: unsupported version 2 (supported: 1)"]


def test_models_file_errors(tmp_path: Path) -> None:
    models = "version: 1\ndefault_min_tokens: lots\nmin_tokens:\n  claude-x: -5\n  gpt-: 1024\n"
    errors = check_rules(_folder(tmp_path, GOOD_RULE, models))
    assert errors == [
        f"{tmp_path / 'models.yaml'}:2: default_min_tokens: must be a whole number of tokens >= 0",
        f"{tmp_path / 'models.yaml'}:4: min_tokens.claude-x: must be a whole number of tokens >= 0",
    ]


def test_load_raises_with_every_error_and_extra_files_merge(tmp_path: Path) -> None:
    folder = _folder(tmp_path, GOOD_RULE)
    (folder / "extra.rules.yaml").write_text(GOOD_RULE, encoding="utf-8")
    (folder / "simulator.yaml").write_text("not: [our, file\n", encoding="utf-8")  # never read here
    with pytest.raises(RuleError) as caught:
        load_rules(folder)
    assert caught.value.errors == [
        f"{folder / 'extra.rules.yaml'}:3: rules[0].name: duplicate rule name 'stamp' "
        f"(first at {folder / 'default.yaml'}:3)"
    ]
    (folder / "extra.rules.yaml").write_text(GOOD_RULE.replace("stamp", "other"), encoding="utf-8")
    assert [r.name for r in load_rules(folder).rules] == ["stamp", "other"]


def test_check_rules_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_rules_command(str(PACKAGED_DIR)) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    assert check_rules_command(None) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    assert check_rules_command(str(_folder(tmp_path, "version: 1\nrules: 3\n"))) == 1
    assert capsys.readouterr().err == f"{tmp_path / 'default.yaml'}:2: rules: must be a list of rules\n"
    assert check_rules_command(str(tmp_path / "missing")) == 1
    assert capsys.readouterr().err == f"{tmp_path / 'missing'}: no such file or folder\n"


def test_check_rules_accepts_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_rules_command(str(PACKAGED_DIR / "default.yaml")) == 0
    assert capsys.readouterr().out == f"ok: {len(load_rules(PACKAGED_DIR).rules)} rules\n"
    assert check_rules_command(str(PACKAGED_DIR / "models.yaml")) == 0
    assert capsys.readouterr().out == f"ok: {len(load_rules(PACKAGED_DIR).min_tokens_by_prefix)} model minimums\n"
    for name in ("pricing.yaml", "profiles.yaml", "simulator.yaml"):
        assert check_rules_command(str(PACKAGED_DIR / name)) == 0
        assert capsys.readouterr().out == f"ok: {name} loads\n"
    broken = tmp_path / "pricing.yaml"
    broken.write_text("version: 1\n")
    assert check_rules_command(str(broken)) == 1
    assert capsys.readouterr().err.startswith(f"{broken}")
    bad = tmp_path / "team.rules.yaml"
    bad.write_text("version: 1\nrules: 3\n")
    assert check_rules_command(str(bad)) == 1
    assert capsys.readouterr().err == f"{bad}:2: rules: must be a list of rules\n"


def test_pin_options_are_validated(tmp_path: Path) -> None:
    text = """\
version: 1
rules:
  - name: env
    kind: section
    pattern: '^<env>'
    end: '</env>'
    tier: session
    pin: true
    pin_changes_to_user: true
  - name: stamp
    kind: line
    pattern: 'x'
    tier: volatile
    pin: true
  - name: cwd
    kind: line
    pattern: 'cwd:'
    tier: session
    pin: 'yes'
    pin_changes_to_user: true
  - name: date
    kind: line
    pattern: 'date:'
    tier: session
    pin_changes_to_user: 1
"""
    errors = check_rules(_folder(tmp_path, text))
    where = [e.split(": ", 2)[0].rsplit(":", 1)[1] + " " + e.split(": ", 2)[1] for e in errors]
    assert where == [
        "14 rules[1].pin",
        "19 rules[2].pin",
        "20 rules[2].pin_changes_to_user",
        "25 rules[3].pin_changes_to_user",
    ]
    assert errors[0].endswith("only a `session` segment can be pinned")
    assert errors[1].endswith("must be true or false") and errors[2].endswith("needs `pin: true`")
    good = text.split("  - name: stamp")[0]
    (rule,) = load_rules(_folder(tmp_path, good)).rules
    assert (rule.pin, rule.pin_changes_to_user) == (True, True)


def test_packaged_pins_are_session_context_rules() -> None:
    rules = load_rules()
    assert [r.name for r in rules.rules if r.pin] == ["env-block", "date", "cwd-host-home"]
    assert all(r.tier == "session" and not r.pin_changes_to_user for r in rules.rules if r.pin)


def test_check_rules_folder_checks_the_other_files_serve_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path, (PACKAGED_DIR / "default.yaml").read_text(encoding="utf-8"))
    (folder / "profiles.yaml").write_text("version: 2\n", encoding="utf-8")
    (folder / "pricing.yaml").write_text("version: 1\n", encoding="utf-8")
    assert check_rules_command(str(folder)) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in err] == [str(folder / "pricing.yaml"), str(folder / "profiles.yaml")]
    (folder / "profiles.yaml").write_text((PACKAGED_DIR / "profiles.yaml").read_text(encoding="utf-8"))
    (folder / "pricing.yaml").write_text((PACKAGED_DIR / "pricing.yaml").read_text(encoding="utf-8"))
    assert check_rules_command(str(folder)) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_serve_prices_from_the_rules_folder(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from proxy.app import create_app
    from proxy.appkeys import SERVICES
    from proxy.pricing import PricingError, default_pricing
    from proxy.settings import Settings

    packaged = (PACKAGED_DIR / "pricing.yaml").read_text(encoding="utf-8")
    # Fable 5.1 input at 11.00 instead of 10.00 USD per million tokens.
    row = "prefixes: [claude-fable-5-1, claude-mythos-5-1]\n    input: "
    edited = packaged.replace(row + "10.00", row + "11.00")
    assert edited != packaged
    (tmp_path / "pricing.yaml").write_text(edited, encoding="utf-8")
    (tmp_path / "default.yaml").write_text(GOOD_RULE, encoding="utf-8")
    app = create_app(Settings(rules_dir=tmp_path), CollectorRegistry())
    assert app[SERVICES].pricing.prices("anthropic", "claude-fable-5-1").input == 11.0
    assert default_pricing().prices("anthropic", "claude-fable-5-1").input == 10.0
    no_pricing = tmp_path / "bare"
    no_pricing.mkdir()
    (no_pricing / "default.yaml").write_text(GOOD_RULE, encoding="utf-8")
    app = create_app(Settings(rules_dir=no_pricing), CollectorRegistry())
    assert app[SERVICES].pricing is default_pricing()
    (tmp_path / "pricing.yaml").write_text("version: 1\n", encoding="utf-8")
    with pytest.raises(PricingError):
        create_app(Settings(rules_dir=tmp_path), CollectorRegistry())
