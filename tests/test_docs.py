"""The documentation's relative links and anchors resolve: README.md, docs/ and examples/ (every .md), each link
outside code (inline ``[text](path "title")`` and images, reference definitions ``[r]: path``, HTML ``href`` /
``src``) against the files git tracks (what a reader of the repository sees) and the target's headings (GitHub's
anchor rule: lower case, punctuation but '-' and '_' dropped, spaces to '-', repeats numbered)."""
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").rglob("*.md"))]
INLINE = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")  # [text](target "title"), ![alt](target)
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?(?:\s|$)", re.M)  # [ref]: target
HTML = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
FENCE = re.compile(r"^(`{3,}|~{3,})")


def _prose(text: str, code_spans: bool = False) -> str:
    """``text`` without fenced code blocks (a fence closes on the same character, at least as long), and without
    inline code spans unless ``code_spans`` (links there are examples, not links; a heading's code spans are part
    of its anchor)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line.lstrip())
        if m and fence is None:
            fence = m.group(1)
            continue
        if m and fence is not None and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not line.strip()[len(m.group(1)):].strip():
            fence = None
            continue
        if fence is None:
            out.append(line if code_spans else re.sub(r"`[^`\n]*`", "", line))
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
    """Every relative link target of ``path`` (URLs with a scheme, http: or mailto:, left out), in order of kind."""
    prose = _prose(path.read_text(encoding="utf-8"))
    for pattern in (INLINE, DEFINITION, HTML):
        for m in pattern.finditer(prose):
            target = m.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                yield target


def _tracked() -> set:
    """The files git tracks, and every folder above them (absolute paths); None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return None
    files = {(REPO / f).resolve() for f in out.split("\0") if f}
    return files | {p for f in files for p in f.parents}


TRACKED = _tracked()


def test_github_anchor_rule():
    assert github_anchor("Run 1: one NVIDIA H200 (2026-11-26)") == "run-1-one-nvidia-h200-2026-11-26"
    assert github_anchor("Position schemes (`--pos-emb`): xPos and the baselines") == "position-schemes---pos-emb-xpos-and-the-baselines"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(doc):
    broken = []
    for target in links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists() or (TRACKED is not None and dest not in TRACKED and doc in TRACKED):
            broken.append(f"{target}: no file {dest} in the repository")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{doc.relative_to(REPO)}:\n" + "\n".join(broken)


def test_the_link_check_sees_a_broken_link(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n\n## The `--bca` flag\n\nsee [b](b.md), [here](#title), [gone](#nowhere)\n\n```\n"
                   "[x](not-a-link.md)\n# not a heading\n```\n"
                   '[t](c.md "a title") [![img](i.png)](d.md) <a href="e.md">e</a>\n\n[ref]: f.md#g\n'
                   "~~~\n```\n[y](inside-a-tilde-fence.md)\n~~~\n[h](h.md)\n")
    found = list(links(doc))
    assert found == ["b.md", "#title", "#nowhere", "c.md", "i.png", "d.md", "h.md", "f.md#g", "e.md"]
    assert anchors(doc) == {"title", "the---bca-flag"}


def test_every_report_the_documents_link_records_its_provenance():
    """Each JSON report that README, RESULTS, BENCHMARKS or the walkthrough links (:func:`links`) carries a provenance
    block with every field a report records ("unknown" where nothing recorded it). Not reports: the verdict's list of
    reference rows (a configuration). (flat_and_retrieving.json, copied from tables of the session log, is linked from
    the log alone.)"""
    import json

    not_reports = {"examples/lex_lm/verdict_reference.json"}
    fields = {"command", "commit", "dirty", "device", "torch", "python", "seed", "date", "wall_s"}
    linked = set()
    for doc in ("README.md", "examples/lex_lm/RESULTS.md", "examples/lex_lm/BENCHMARKS.md", "examples/lex_lm/README.md"):
        for target in links(REPO / doc):
            file_part = target.partition("#")[0]
            if file_part.endswith(".json"):
                linked.add(((REPO / doc).parent / file_part).resolve().relative_to(REPO).as_posix())
    assert len(linked) > 30 and not_reports <= linked
    for name in sorted(linked - not_reports):
        report = json.loads((REPO / name).read_text())
        assert fields <= set(report.get("provenance", {})), name
