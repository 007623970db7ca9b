"""Bounded-time rules (issue 11, item 1): every packaged rule pattern, as the reorder stage runs
it (one line at a time) and as the replay masker runs it (each volatile pattern over whole
message strings), takes time linear in its input on adversarial strings: runs of newlines,
spaces, tabs and bullets, and repeated prefixes of the rule's own literals, with and without a
non-ASCII character (which disables the prefilter). Time is measured as a ratio to a plain
character-class scan of the same text in the same run, at two sizes 8x apart: linear work keeps
the ratio, quadratic work multiplies it by 8. `check-rules` rejects the super-linear shapes."""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.pipeline.replay import Masker
from proxy.regexcheck import superlinear_reason
from proxy.rules import Rule, check_rules, load_rules

RULES = load_rules()
PLAIN = re.compile(r"[\x00-\x08]")
"""The baseline: one pass of `re` over the text that never matches."""
SMALL = 1_500
GROWTH = 8
MAX_GROWTH = 3.0
"""Ratio growth allowed between the two sizes (linear: about 1, quadratic: 8)."""


def literal_prefixes(pattern: str) -> list[str]:
    """Runs of letters, spaces and punctuation written in the pattern (what a match starts with)."""
    words = re.findall(r"[A-Za-z][A-Za-z _:=/-]{2,}", pattern.replace("\\s", " ").replace("\\b", ""))
    return [w for w in words if len(w) >= 3][:3]


def adversarial(rule: Rule, size: int) -> list[str]:
    """Strings of about `size` characters built to make a backtracking pattern work hard."""
    units = ["\n", " ", "\t", " \n", "- ", "-\n", "1", "1,", "a"]
    sources = [rule.pattern.pattern] + [p.pattern for p in (rule.end, rule.until) if p is not None]
    for source in sources:
        for literal in literal_prefixes(source):
            units += [literal + " ", literal[: len(literal) // 2], "- " + literal + "\n"]
    out = []
    for unit in units:
        body = unit * (size // len(unit) + 1)
        out += [body[:size], "é" + body[: size - 1]]
    return out


def seconds(run: Callable[[], object]) -> float:
    """CPU seconds of this thread per call of `run`, over a batch of at least 2 ms (CPU time:
    the other processes on a shared machine do not inflate it)."""
    count = 0
    started = time.thread_time()
    while True:
        run()
        count += 1
        elapsed = time.thread_time() - started
        if elapsed >= 0.002:
            return elapsed / count


Use = Callable[[re.Pattern[str]], Callable[[str], object]]


def cost_ratio(use: Use, pattern: re.Pattern[str], text: str, repeats: int) -> float:
    """Best time of `pattern` used on `text` over the best time of the same use of the plain
    pattern (a one-pass scan), measured alternately (the machine is shared: the minimum is the
    least disturbed; the same use cancels per-line and per-call overheads)."""
    run, plain = use(pattern), use(PLAIN)
    best_run = best_plain = float("inf")
    gc.disable()  # as timeit does: a collection's cost depends on the whole heap, not the text
    try:
        for _ in range(repeats):
            best_run = min(best_run, seconds(lambda: run(text)))
            best_plain = min(best_plain, seconds(lambda: plain(text)))
    finally:
        gc.enable()
    return best_run / best_plain


def growth(use: Use, pattern: re.Pattern[str], small: str, large: str) -> float:
    """How much the cost ratio to a plain scan grows from `small` to `large` (8x longer):
    a quick measurement, repeated carefully when it looks super-linear."""
    grew = cost_ratio(use, pattern, large, 1) / cost_ratio(use, pattern, small, 1)
    for _ in range(4):  # super-linear work stays high every time, a disturbance does not
        if grew < MAX_GROWTH:
            break
        grew = min(grew, cost_ratio(use, pattern, large, 7) / cost_ratio(use, pattern, small, 7))
    return grew


def by_line(pattern: re.Pattern[str]) -> Callable[[str], object]:
    """The reorder stage's use: each line searched on its own."""
    return lambda text: [pattern.search(line) for line in text.split("\n")]


def masking(pattern: re.Pattern[str]) -> Callable[[str], object]:
    """The replay masker's use: a masker without memo digesting one message string."""
    masker = Masker((pattern,), memo_size=0)

    def run(text: str) -> object:
        return masker.digest({"role": "user", "content": text})

    return run


@pytest.mark.parametrize("rule", RULES.rules, ids=lambda r: r.name)
def test_every_packaged_rule_runs_in_linear_time(rule: Rule) -> None:
    patterns = [rule.pattern] + [p for p in (rule.end, rule.until) if p is not None]
    small_texts = adversarial(rule, SMALL)
    large_texts = adversarial(rule, SMALL * GROWTH)
    worst = (0.0, "")
    for small, large in zip(small_texts, large_texts, strict=True):
        uses: list[tuple[Use, re.Pattern[str]]] = [(by_line, p) for p in patterns]
        if rule.tier == "volatile":
            uses.append((masking, rule.pattern))
        for use, pattern in uses:
            grew = growth(use, pattern, small, large)
            if grew > worst[0]:
                worst = (grew, repr(small[:12]))
    print(f"{rule.name}: worst growth {worst[0]:.2f} on {worst[1]}")
    assert worst[0] < MAX_GROWTH, f"{rule.name} grows {worst[0]:.1f}x on {worst[1]}"


@pytest.mark.parametrize(
    "pattern",
    [r"^\s*[-*]?\s*(request|trace)[ _-]?id", r"(a+)+$", r"(\d+,?)*%", r".*\d+x", r"\s+x"],
)
def test_check_rules_rejects_superlinear_patterns_naming_file_rule_and_line(tmp_path: Path, pattern: str) -> None:
    quoted = pattern.replace("'", "''")
    (tmp_path / "default.yaml").write_text(
        f"version: 1\nrules:\n  - name: fine\n    kind: line\n    pattern: 'ok'\n    tier: session\n"
        f"  - name: hostile\n    kind: line\n    pattern: '{quoted}'\n    tier: volatile\n",
        encoding="utf-8",
    )
    errors = check_rules(tmp_path)
    assert len(errors) == 1
    assert errors[0].startswith(f"{tmp_path / 'default.yaml'}:9: rules[1].pattern: rule 'hostile': ")
    assert "super-linearly" in errors[0]


@pytest.mark.parametrize(
    "pattern",
    [r"^\s*(?:[-*]\s*)?(request|trace)[ _-]?id", r"\b\d+%", r"(\s+\w+)*", r"a.{0,40}\d", r"^\s+x"],
)
def test_linear_rewrites_are_accepted(pattern: str) -> None:
    assert superlinear_reason(pattern) is None


def profile_patterns() -> list[tuple[str, re.Pattern[str], str]]:
    """`(id, pattern, use)` of every regex in `rules/profiles.yaml`: each profile's `model_name`
    (`match`: at the start of the request's model id) and each path template (its template:
    `fullmatch` against the whole request path)."""
    from proxy.profiles import load_profiles

    out = []
    for family, profiles in load_profiles().by_family.items():
        for name, profile in profiles.items():
            if profile.model_name is not None:
                out.append((f"{family}.{name}.model_name", profile.model_name, "match"))
            for k, path in enumerate(profile.paths):
                out.append((f"{family}.{name}.paths[{k}]", path.pattern, path.template))
    return out


PROFILE_PATTERNS = profile_patterns()


def anchored(how: str) -> Use:
    """The profile's use (`match` / `fullmatch`); the plain baseline still scans the whole text
    (`search`: an anchored baseline would stop at the first character)."""
    return lambda pattern: pattern.search if pattern is PLAIN else getattr(pattern, how)


def profile_texts(pattern: re.Pattern[str], template: str | None, unit: str, size: int) -> list[str]:
    """Adversarial inputs of about `size` characters: for a model pattern, runs of `unit` after
    prefixes a model id may have; for a path template, the template with every `{name}` segment
    (or only the last) a run of `unit`, so matching gets past the literal prefix."""
    run = unit * (size // len(unit) + 1)
    if template is None:
        return [(prefix + run)[:size] for prefix in ("", "claude-", "us.anthropic.", "a/claude-")]
    holes = template.count("{")
    filled = re.sub(r"\{[^}]+\}", lambda _: run[: size // max(1, holes)], template)
    last = re.sub(r"\{[^}]+\}", "x", template[: template.rfind("{")]) + run[:size] + template[template.rfind("}") + 1 :]
    return [filled, last]


@pytest.mark.parametrize(("name", "pattern", "how"), PROFILE_PATTERNS, ids=[p[0] for p in PROFILE_PATTERNS])
def test_every_profile_pattern_runs_in_linear_time(name: str, pattern: re.Pattern[str], how: str) -> None:
    template = None if how == "match" else how
    use = anchored("match" if template is None else "fullmatch")
    units = ["\n", " ", "/", ":", ":1", "-v1", "-v", "@", ".", "a.", "1", "a", "é", "claude", "anthropic."]
    for literal in literal_prefixes(template or pattern.pattern):
        units += [literal, literal[: len(literal) // 2], literal + "/", literal + ":"]
    worst = (0.0, "")
    for unit in units:
        small_texts = profile_texts(pattern, template, unit, SMALL)
        large_texts = profile_texts(pattern, template, unit, SMALL * GROWTH)
        for small, large in zip(small_texts, large_texts, strict=True):
            grew = growth(use, pattern, small, large)
            if grew > worst[0]:
                worst = (grew, repr(small[:12]))
    print(f"{name}: worst growth {worst[0]:.2f} on {worst[1]}")
    assert worst[0] < MAX_GROWTH, f"{name} grows {worst[0]:.1f}x on {worst[1]}"


def test_the_ratio_test_fails_a_quadratic_model_pattern() -> None:
    """The measurement itself: a pattern that backtracks quadratically grows far past the bound
    on the same inputs (so the bound is not loose enough to pass anything)."""
    quadratic = re.compile(r"^(?P<name>.*\..*)@x$")
    texts = profile_texts(quadratic, None, "a.", SMALL), profile_texts(quadratic, None, "a.", SMALL * GROWTH)
    assert growth(anchored("match"), quadratic, texts[0][0], texts[1][0]) > MAX_GROWTH


@pytest.mark.parametrize(
    "unit",
    ["### Memory\n</a>\n<b>\n", "</x>\n", "<a>\n# Memory\n</b>\n", "<b>\n" * 3 + "</a>\n"],
    ids=["tags-under-headings", "orphan-closing", "closing-across-headings", "opened-then-orphan"],
)
def test_heading_sections_with_many_tags_segment_in_linear_time(unit: str) -> None:
    """Attack pass (session 12): a heading section holding many opened tags looked each closing
    tag up in a list of the open ones, so `# Memory` followed by thousands of tag lines was
    quadratic (4x the lines, 13-15x the time). Segmenting (a fresh classifier: no cache) is
    timed against a plain scan of the same text at two sizes 8x apart."""
    from proxy.pipeline.segments import Classifier

    def texts(size: int) -> str:
        return "# Memory\n" + unit * (size // len(unit))

    def segmenting(pattern: re.Pattern[str]) -> Callable[[str], object]:
        if pattern is PLAIN:
            return lambda text: PLAIN.search(text)
        return lambda text: Classifier(RULES).segments(text)

    small, large = texts(SMALL * 16), texts(SMALL * 16 * GROWTH)
    assert "".join(s.text for s in Classifier(RULES).segments(large)) == large
    grew = growth(segmenting, re.compile("segments"), small, large)
    assert grew < MAX_GROWTH, f"segmenting grows {grew:.1f}x"
