"""The classifier's caches (line shapes, digit-blind line masks) change no segmentation."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.segments import Classifier, _digit_blind
from proxy.rules import RuleSet
from tests.pipeline.helpers import RULES

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(
    ("pattern", "blind"),
    [
        (r"\d{4}-\d{2}", True),
        (r"[0-9a-fA-F]{8}", True),
        (r"[^0-9]", True),
        (r"\b\w+\s", True),
        (r"(?=\d)x", True),
        (r"gpt-4", False),
        (r"[1-9]", False),
        (r"[0-5]", False),
        (r"(\d)\1", False),
        (r"(?P<a>x)(?(a)1|2)", False),
        (r"(?i)v2", False),
    ],
)
def test_digit_blind(pattern: str, blind: bool) -> None:
    assert _digit_blind(re.compile(pattern)) is blind


def test_packaged_rules_are_digit_blind() -> None:
    classifier = Classifier(RULES)
    assert classifier._blind and not classifier._sighted


def _fresh_segments(text: str, rules: RuleSet) -> tuple:
    return Classifier(rules)._segments(text)


lines = st.one_of(
    st.sampled_from(
        [
            "Current time: 2026-11-29T20:07:13Z",
            "Current time: 1999-01-02T03:04:05Z",
            "Today's date: 2026-11-29",
            "<env>",
            "</env>",
            "<environment_context>",
            "</environment_context>",
            "  <cwd>/home/dev/p1</cwd>",
            "# Memory",
            "- prefers small commits",
            "timestamp: 1764446833",
            "Context used: 546 tokens of 200000 (0%)",
            "",
            "plain text 12",
            "release v2 notes",
            "release v7 notes",
            "x-anthropic-billing-header: cc_version=2.1.3; cch=0a1b2;",
        ]
    ),
    st.text(alphabet="0123456789abc :-<>/#T", max_size=20),
)


SIGHTED = dataclasses.replace(
    RULES, rules=(*RULES.rules, dataclasses.replace(RULES.rules[-1], name="v2", pattern=re.compile(r"\bv2\b")))
)
"""The packaged rules and one that tells digits apart (`v2`, not `v3`)."""


@FAST
@given(st.lists(st.lists(lines, min_size=1, max_size=12), min_size=1, max_size=4), st.sampled_from([RULES, SIGHTED]))
def test_cached_segments_are_fresh_segments(texts: list[list[str]], rules: RuleSet) -> None:
    shared = Classifier(rules)
    for text_lines in texts:  # each text warms the caches the next one uses
        text = "\n".join(text_lines)
        assert shared.segments(text) == _fresh_segments(text, rules)
        digits_moved = text.translate(str.maketrans("0123456789", "9876543210"))
        assert shared.segments(digits_moved) == _fresh_segments(digits_moved, rules)
