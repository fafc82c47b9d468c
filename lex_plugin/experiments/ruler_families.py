"""RULER-lite by task family (issue: BCA that retrieves): the verdict reads the mean at 8l over RULER-lite's tasks
scored at every length from l (9 of its 11 at l = 256: niah_multikey_3 and cwe need more);
this splits it into the families the goal names (Hsieh et al. 2024, RULER, section 3: single needle, multi-key,
multi-value, multi-query, variable tracking, aggregation; RULER-lite has no QA task), each the mean of its tasks'
ranking accuracy over the depths, under the attention mode the verdict reads, from the same committed reports."""

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .reproduce.catalogue import LABELS
from ..evaluation.figures import mode_rows
from .reproduce.verdict import ruler_reports

__all__ = ["FAMILIES", "family_means", "ruler_families_table"]

# family -> RULER-lite's tasks in it (evaluation.ruler.tasks.TASKS)
FAMILIES: Dict[str, Tuple[str, ...]] = {
    "single": ("niah_single_1", "niah_single_2", "niah_single_3"),
    "multi-key": ("niah_multikey_1", "niah_multikey_2", "niah_multikey_3"),
    "multi-value": ("niah_multivalue",),
    "multi-query": ("niah_multiquery",),
    "tracing": ("vt",),
    "aggregation": ("fwe", "cwe"),
}


def family_means(report: dict, length: int, mode: str = "full") -> Optional[Dict[str, float]]:
    """Each family's mean ranking accuracy at ``length`` under attention ``mode``, over the tasks the verdict's mean
    reads (those scored at every length of the report: ``ruler.probe.effective_length``), each task's score over its
    depths as that mean takes it; "mean" the verdict's RULER-lite figure itself. None where the report has no rows of
    that mode; a family none of whose tasks is read is left out."""
    from ..evaluation.ruler import RulerResult
    from ..evaluation.ruler.probe import MEASURES, effective_length

    results = [RulerResult.from_dict(dict(r, window=mode)) for by in mode_rows(report, mode).values() for r in by]
    if not results:
        return None
    summary = effective_length(results, mode, "ranking")
    if summary["averages"].get(length) is None:
        return None
    score = {t: MEASURES["ranking"]([r for r in results if r.task == t and r.length == length]) for t in summary["tasks"]}
    out = {}
    for family, tasks in FAMILIES.items():
        found = [score[t] for t in tasks if t in score]
        if found:
            out[family] = sum(found) / len(found)
    out["mean"] = summary["averages"][length]
    return out


def _seed_means(reports: List[dict], mode: str) -> Optional[Dict[str, float]]:
    """The family means at 8l of one row's reports, one a fine-tuning seed, averaged over the seeds (each family and
    "mean" the seeds' mean, as the verdict averages RULER-lite over seeds); a family some seed lacks is left out; None
    where no report has rows of ``mode``."""
    found = [m for m in (family_means(r, 8 * int(r["training_length"]), mode) for r in reports) if m is not None]
    if not found:
        return None
    return {key: sum(m[key] for m in found) / len(found) for key in found[0] if all(key in m for m in found)}


def _rows(root: Path, run) -> List[Tuple[str, Dict[str, float]]]:
    """(label, family means at 8l) of each verdict row that has a RULER-lite report: the references' (the report, or
    the run folder's reports over its fine-tuning seeds, and the mode their ``ruler`` entry names), then the runs'
    (``ruler_answers.json`` and its seeds' ``ruler_answers_seedN.json``, full attention)."""
    rows = []
    for path in run.references:
        listing = root / path
        for ref in json.loads(listing.read_text()):
            if "ruler" in ref:
                given = ref["ruler"]
                paths = ([listing.parent / given["report"]] if "report" in given
                         else [p for p in ruler_reports(listing.parent / given["run"]) if p.is_file()])
                means = _seed_means([json.loads(p.read_text()) for p in paths], given["mode"])
                if means is not None:
                    rows.append((ref["label"], means))
    for given in run.runs:
        name = given.partition("/")[0]
        paths = [p for p in ruler_reports(root / run.work / "runs" / given) if p.is_file()]
        means = _seed_means([json.loads(p.read_text()) for p in paths], "full")
        if means is not None:
            rows.append((LABELS.get(name, name) + (", recalibrated" if "/" in given else ""), means))
    return rows


def ruler_families_table(root: Path, run) -> str:
    """Markdown: RULER-lite at 8l by family for every verdict row with a report (``run``: a ``published.VerdictRun``);
    ranking accuracy, 2 decimals; "-" for a family whose tasks were skipped at some length (too long for them)."""
    head = ["row", *FAMILIES, "mean (tasks that fit in l)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for label, means in _rows(root, run):
        cells = [f"{means[f]:.2f}" if f in means else "-" for f in (*FAMILIES, "mean")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
