"""Citations stay inside the repository: every markdown file a docstring, comment or document
names exists in it, and every `docs/provider-rules.md <section>` names a section that page has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULES_PAGE = ROOT / "docs" / "provider-rules.md"
CITED_MD = re.compile(r"(?<![\w./-])((?:\.\.?/)*[\w./-]*\w\.md)\b")
SECTIONS = re.compile(r"docs/provider-rules\.md(?: sections?)? (\d+(?:\.\d+)?(?:(?:, | and |-)\d+(?:\.\d+)?)*)")
NOT_CITATIONS = frozenset({".aider.chat.history.md", "CLAUDE.md", "AGENTS.md", "/home/dev/project/CLAUDE.md"})
"""Markdown names that are not citations: files another program writes or reads (aider's chat
history; the project files Claude Code and Hermes load, which `proxy/workloads/long_client.py`
renders into its generated conversations)."""
SKIPPED = ("tests/clients/data/", "workloads/")
"""Captured client traffic: its text is the clients' own, not ours."""


def _tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.yaml", "*.yml", "*.json", "*.toml", "scripts/*"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    here = Path(__file__).resolve()
    return [ROOT / n for n in names if not n.startswith(SKIPPED) and (ROOT / n).is_file() and ROOT / n != here]


def _citations() -> list[tuple[str, int, str]]:
    found = []
    for path in _tracked():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in CITED_MD.finditer(line):
                found.append((str(path.relative_to(ROOT)), number, match.group(1)))
    return found


def _resolves(citing: str, cited: str) -> bool:
    """Whether `cited` names a file inside the repository, read from its root or from `citing`'s folder.

    A path that leaves the repository never counts, whatever lies beside the clone."""
    for candidate in ((ROOT / cited).resolve(), (ROOT / citing).parent.joinpath(cited).resolve()):
        if candidate.is_relative_to(ROOT) and candidate.is_file():
            return True
    return False


def test_every_cited_markdown_file_is_in_the_repository() -> None:
    citations = _citations()
    outside = [
        f"{citing}:{line}: {cited}"
        for citing, line, cited in citations
        if cited not in NOT_CITATIONS and not _resolves(citing, cited)
    ]
    assert outside == []
    assert sum(1 for _, _, cited in citations if cited == "docs/provider-rules.md") >= 90


def test_outside_paths_are_caught() -> None:
    line = "rules from ../shared/PROVIDERS.md 1.5 and DESIGN.md section 4; see rules/README.md"
    cited = [m.group(1) for m in CITED_MD.finditer(line)]
    assert cited == ["../shared/PROVIDERS.md", "DESIGN.md", "rules/README.md"]
    assert [_resolves("proxy/measure.py", c) for c in cited] == [False, False, True]


def _sections(text: str) -> set[str]:
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.MULTILINE))


def test_every_cited_provider_rule_section_exists() -> None:
    have = _sections(RULES_PAGE.read_text())
    assert {"1.4", "1.5", "1.6", "1.7", "2.1", "2.3", "9"} <= have
    missing = []
    cited = 0
    for path in _tracked():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in SECTIONS.finditer(line):
                cited += 1
                for section in re.split(r", | and |-", match.group(1)):
                    if section not in have:
                        missing.append(f"{path.relative_to(ROOT)}:{number}: {section}")
    assert missing == []
    assert cited >= 80


def test_every_provider_rule_section_names_its_source() -> None:
    parts = re.split(r"^## ", RULES_PAGE.read_text(), flags=re.MULTILINE)[1:]
    assert len(parts) >= 8
    for part in parts:
        if part.startswith("8. "):
            continue  # our simulator, not a provider's rule
        assert re.search(r"https://\S+", part), part.splitlines()[0]
