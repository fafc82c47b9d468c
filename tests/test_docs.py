"""The documentation's relative links and anchors resolve: README.md, docs/ and examples/ (every .md), each link
``[text](path)`` or ``[text](path#anchor)`` outside code, against the file system and the target's headings
(GitHub's anchor rule: lower case, punctuation but '-' and '_' dropped, spaces to '-', repeats numbered)."""
import re
from collections import Counter
from pathlib import Path

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str, code_spans: bool = False) -> str:
    """``text`` without fenced code blocks, and without inline code spans unless ``code_spans`` (links there are
    examples, not links; a heading's code spans are part of its anchor)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line if code_spans else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text: markup removed, lower case, every character but letters, digits,
    spaces, '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set:
    seen: Counter = Counter()
    out = set()
    for line in _prose(path.read_text(encoding="utf-8"), code_spans=True).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = github_anchor(m.group(1))
            out.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return out


def links(path: Path):
    for m in LINK.finditer(_prose(path.read_text(encoding="utf-8"))):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        yield target


def test_github_anchor_rule():
    assert github_anchor("Run 1: one NVIDIA H200 (2026-11-26)") == "run-1-one-nvidia-h200-2026-11-26"
    assert github_anchor("Position schemes (`--pos-emb`): xPos and the baselines") == "position-schemes---pos-emb-xpos-and-the-baselines"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(doc):
    broken = []
    for target in links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{doc.relative_to(REPO)}:\n" + "\n".join(broken)


def test_the_link_check_sees_a_broken_link(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n\n## The `--bca` flag\n\nsee [b](b.md), [here](#title), [gone](#nowhere)\n\n```\n"
                   "[x](not-a-link.md)\n# not a heading\n```\n")
    found = list(links(doc))
    assert found == ["b.md", "#title", "#nowhere"]
    assert anchors(doc) == {"title", "the---bca-flag"}
