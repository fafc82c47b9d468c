"""Perplexity against evaluation length (LeX paper Figure 1 style) from ``--report-json`` files."""

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

__all__ = ["plot_reports"]


def _series(report: dict, protocol: str) -> Dict[str, List[tuple]]:
    series: Dict[str, List[tuple]] = {}
    for r in report["results"]:
        if r.get("protocol", "stream") == protocol:
            series.setdefault(r["window"], []).append((r["length"], r["ppl"]))
    return {k: sorted(v) for k, v in series.items()}


def plot_reports(paths: Sequence[Path], out: Path, labels: Optional[Sequence[str]] = None,
                 protocol: str = "stream", title: Optional[str] = None) -> int:
    """Draw ppl (log y) against length (log2 x) for every (report, window) pair into ``out`` (PNG).

    Args:
        paths: JSON reports written by ``fairseq-eval-lm --task lex_language_modeling --report-json``.
        labels: one label per report (default: the file stem).
        protocol: ``stream`` or ``fixed_target``.

    Returns:
        The number of lines drawn. Raises ValueError if a report holds no result for ``protocol``.
    """
    from ..plotting import figure, log_axes

    labels = list(labels) if labels else [Path(p).stem for p in paths]
    if len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} reports.")
    reports = [json.loads(Path(path).read_text()) for path in paths]
    for path, report in zip(paths, reports):
        if not _series(report, protocol):
            raise ValueError(f"{path} has no {protocol} results.")
    lines = 0
    with figure(out) as (_, ax):
        for report, label in zip(reports, labels):
            for window, points in _series(report, protocol).items():
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", label=f"{label}: {window}" if len(paths) > 1 else window)
                lines += 1
        for l in sorted({r.get("training_length") for r in reports} - {None}):
            ax.axvline(l, color="grey", linestyle=":", linewidth=1, label=f"training length l = {l}")
        log_axes(ax)
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("perplexity")
        ax.set_title(title or ("fixed-target perplexity" if protocol == "fixed_target" else "perplexity vs length"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    return lines
