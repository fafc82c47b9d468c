"""Perplexity (or LongPPL) against evaluation length (LeX paper Figure 1 style) from ``--report-json`` files."""

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

__all__ = ["plot_reports"]


METRICS = {"ppl": "perplexity", "longppl": "LongPPL (key tokens)"}


def _series(report: dict, protocol: str, metric: str = "ppl", modes: Optional[Sequence[str]] = None) -> Dict[str, List[tuple]]:
    series: Dict[str, List[tuple]] = {}
    for r in report["results"]:
        mode = r.get("attention", {}).get("mode", r["window"])
        if r.get("protocol", "stream") == protocol and r.get(metric) is not None and (not modes or mode in modes):
            series.setdefault(r["window"], []).append((r["length"], r[metric]))
    return {k: sorted(v) for k, v in series.items()}


def plot_reports(paths: Sequence[Path], out: Path, labels: Optional[Sequence[str]] = None,
                 protocol: str = "stream", title: Optional[str] = None, metric: str = "ppl",
                 modes: Optional[Sequence[str]] = None) -> int:
    """Draw ppl or LongPPL (log y) against length (log2 x) for every (report, window) pair into ``out`` (PNG).

    Args:
        paths: JSON reports written by ``fairseq-eval-lm --task lex_language_modeling --report-json``.
        labels: one label per report (default: the file stem).
        protocol: ``stream`` or ``fixed_target``.
        metric: ``ppl``, or ``longppl`` (reports written with ``--longppl``).
        modes: draw only the rows of these attention modes (``full``, ``bca``, ... as the report's ``attention.mode``);
            None: every row.

    Returns:
        The number of lines drawn. Raises ValueError if a report holds no result for ``protocol``, ``metric`` and
        ``modes``.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}.")
    from ..plotting import figure, log_axes

    labels = list(labels) if labels else [Path(p).stem for p in paths]
    if len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} reports.")
    reports = [json.loads(Path(path).read_text()) for path in paths]
    for path, report in zip(paths, reports):
        if not _series(report, protocol, metric, modes):
            raise ValueError(f"{path} has no {protocol} results with {metric}"
                             + (f" under {', '.join(modes)}" if modes else "")
                             + (" (write it with --longppl)." if metric == "longppl" else "."))
    lines = 0
    with figure(out) as (_, ax):
        for report, label in zip(reports, labels):
            for window, points in _series(report, protocol, metric, modes).items():
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", label=f"{label}: {window}" if len(paths) > 1 else window)
                lines += 1
        for l in sorted({r.get("training_length") for r in reports} - {None}):
            ax.axvline(l, color="grey", linestyle=":", linewidth=1, label=f"training length l = {l}")
        log_axes(ax)
        low, high = ax.get_ylim()
        if high / low < 10:  # within a decade: label 1.2x, 1.5x, 2x ... so that the axis reads between powers of 10
            from matplotlib.ticker import LogLocator

            ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)))
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel(METRICS[metric])
        ax.set_title(title or f"{'fixed-target ' if protocol == 'fixed_target' else ''}{METRICS[metric]} vs length")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: never over a line
    return lines
