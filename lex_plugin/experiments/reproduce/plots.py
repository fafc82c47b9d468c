"""The reproduction's plot: perplexity against length, one panel per window, every run."""

from pathlib import Path
from typing import Dict, Optional, Sequence

from .catalogue import LABELS, WINDOW_LABEL

__all__ = ["plot_budgets", "plot_flat_and_retrieving", "plot_ppl", "plot_schemes"]


def plot_ppl(ppl, runs: Sequence[str], windows: Sequence[str], l: int, out: Path, title: str,
             reference: Optional[Dict[str, str]] = None):
    """Write the PNG ``out``: one panel per window, ppl (log) against length (log2) for every run (the
    paper's Figure 1 in shape), a dotted line at l; ``reference`` ({window: other window}): also draw the
    other window's curve of each run, dashed in the same colour (a method against what it modifies)."""
    from ...plotting import figure, log_axes

    cols = min(3, len(windows))
    rows = -(-len(windows) // cols)
    with figure(out, rows, cols, (4.6 * cols, 4.2 * rows), dpi=110, sharey=True, squeeze=False) as (fig, axes):
        for ax in axes.flat[len(windows):]:
            ax.axis("off")
        for ax, window in zip(axes.flat, windows):
            for name in runs:
                row = ppl.get(name, {}).get(window)
                if row:
                    xs = sorted(row)
                    line, = ax.plot(xs, [row[x] for x in xs], marker="o", label=LABELS.get(name, name))
                    base = ppl.get(name, {}).get((reference or {}).get(window))
                    if base:
                        xs = sorted(base)
                        ax.plot(xs, [base[x] for x in xs], linestyle="--", linewidth=1, color=line.get_color(), alpha=0.7)
            ax.axvline(l, color="grey", linestyle=":", linewidth=1)
            log_axes(ax)
            other = (reference or {}).get(window)
            ax.set_title(WINDOW_LABEL[window] + (f"\n(dashed: {WINDOW_LABEL[other]})" if other else ""), fontsize=10)
            ax.set_xlabel("evaluation length (tokens)")
            ax.grid(alpha=0.3, which="both")
        for row in axes:
            row[0].set_ylabel("test perplexity")
        legend = {}  # every run's line once, whichever panels it appears in
        for ax in axes.flat:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(label, handle)
        axes.flat[len(windows) - 1].legend(list(legend.values()), list(legend), fontsize=8)
        fig.suptitle(title)


def plot_flat_and_retrieving(rows, l: int, top: int, out: Path) -> bool:
    """Write the PNG ``out``: a ranked dot chart, one row per window or method and checkpoint with a passkey result
    (``probe_tables.flat_and_retrieving`` rows), its name as the row's label; left panel ppl(L_max) / ppl(l), right panel
    passkey accuracy at 8l with its 95% Wilson interval, the flat and retrieving thresholds as lines, the colour the
    checkpoint. Rows ranked by accuracy, then by flatness: every label has a line of its own, however many
    methods. Returns False (and writes nothing) when no row has a passkey result."""
    from ...plotting import figure
    from ..definitions import FLAT, RETRIEVES_RANKED
    from .probe_tables import RATIO_AT, SCORE_AT

    points = sorted((r for r in rows if r["passkey"] is not None), key=lambda r: (r["passkey"], -r["ratio"]))
    if not points:
        return False
    runs = list(dict.fromkeys(r["run"] for r in points))
    colours = {run: f"C{i}" for i, run in enumerate(runs)}
    labels = [f"{WINDOW_LABEL.get(r['method'], r['method'])} ({LABELS.get(r['run'], r['run'])})" for r in points]
    height = 1.6 + 0.24 * len(points)
    with figure(out, 1, 2, (10.5, height), dpi=110, sharey=True, constrained_layout=True) as (fig, (flat, found)):
        ys = range(len(points))
        for ax in (flat, found):
            ax.grid(axis="x", alpha=0.3)
            for y in ys:
                ax.axhline(y, color="grey", linewidth=0.3, alpha=0.4)
        for y, r in zip(ys, points):
            flat.plot(r["ratio"], y, "o", color=colours[r["run"]])
            low, high = r["interval"] or (r["passkey"], r["passkey"])
            found.errorbar(r["passkey"], y, xerr=[[r["passkey"] - low], [high - r["passkey"]]], fmt="o",
                           color=colours[r["run"]], capsize=2, linewidth=1)
        from matplotlib.ticker import MaxNLocator

        flat.xaxis.set_major_locator(MaxNLocator(4))  # ratios differ in the third decimal: few, wide tick labels
        flat.set_yticks(list(ys), labels, fontsize=8)
        flat.set_ylim(-0.7, len(points) - 0.3)
        flat.axvline(FLAT.edge(written_at=RATIO_AT), color="grey", linestyle=":", linewidth=1)  # as the table judges
        found.axvline(RETRIEVES_RANKED.edge(written_at=SCORE_AT), color="grey", linestyle=":", linewidth=1)
        flat.set_xlabel(f"ppl({top // l}l) / ppl(l)  (flat: left of the line)")
        found.set_xlabel("passkey accuracy at 8l, 95% interval  (retrieves: right of the line)")
        found.set_xlim(-0.03, 1.03)
        handles = [flat.plot([], [], "o", color=colours[run])[0] for run in runs]
        fig.legend(handles, [LABELS.get(run, run) for run in runs], loc="outside lower center", ncol=len(runs), fontsize=8,
                   frameon=False)
        fig.suptitle("flat and retrieving? one row per window or method, ranked by passkey accuracy")
    return True


def plot_schemes(rows: Sequence[dict], out: Path) -> None:
    """Write the PNG ``out``: one line per checkpoint and window (``published.scheme_rows``' rows, in their order),
    ppl(16l) / ppl(l) on the left, the passkey after fine-tuning on the right (ranked among 10 at 8l: circles;
    written whole by greedy decoding at 16l: squares), each the mean over the fine-tuning seeds with a bar over
    their range; the definitions' bars as dotted lines; a row never probed says so in its panel. The colour is the
    scheme, explained once below the panels; every label has a line of its own."""
    from ...plotting import figure
    from ..definitions import FLAT, RETRIEVES, RETRIEVES_RANKED
    from .verdict import GOALS

    schemes = list(dict.fromkeys(r["label"] for r in rows))
    colours = {label: f"C{i}" for i, label in enumerate(schemes)}
    ys = list(range(len(rows)))[::-1]  # the first row on top
    probes = (("passkey_8l", "o", "ranked among 10 at 8l"), ("greedy_16l", "s", "greedy, whole key at 16l"))
    with figure(out, 1, 2, (10.5, 1.9 + 0.42 * len(rows)), dpi=110, sharey=True, constrained_layout=True) as (
            fig, (flat, found)):
        for ax in (flat, found):
            ax.grid(axis="x", alpha=0.3)
            for y in ys:
                ax.axhline(y, color="grey", linewidth=0.3, alpha=0.4)
        for y, r in zip(ys, rows):
            colour = colours[r["label"]]
            flat.plot(r["ratio"], y, "o", color=colour)
            figures = r["probed"]
            if all(getattr(figures, key) is None for key, _, _ in probes):
                found.text(0.5, y, "not probed", ha="center", va="center", fontsize=8, color="grey")
            for (key, marker, _), dy in zip(probes, (0.12, -0.12)):
                value = getattr(figures, key)
                if value is None:
                    continue
                low, high, _ = figures.spread.get(key, (value, value, 1))
                found.errorbar(value, y + dy, xerr=[[value - low], [high - value]], fmt=marker, color=colour,
                               capsize=2, linewidth=1, markersize=5)
        flat.set_yticks(ys, [f"{r['label']}, {r['window']}{_seeds(r['probed'])}" for r in rows], fontsize=8)
        flat.set_ylim(-0.7, len(rows) - 0.3)
        goals = {g.key: g for g in GOALS}  # each line where the verdict's cell, as written, flips
        flat.axvline(FLAT.edge(written_at=goals["ratio"].decimals), color="grey", linestyle=":", linewidth=1)
        for edge in sorted({RETRIEVES.edge(written_at=goals["greedy_16l"].decimals), RETRIEVES_RANKED.edge()}):
            found.axvline(edge, color="grey", linestyle=":", linewidth=1)
        flat.set_xlabel("ppl(16l) / ppl(l)  (flat: left of the line)")
        found.set_xlabel("passkey after fine-tuning, mean over seeds, bar: their range\n(retrieves: right of the line)")
        found.set_xlim(-0.03, 1.03)
        handles = [flat.plot([], [], "o", color=colours[label])[0] for label in schemes]
        handles += [found.plot([], [], marker, color="black")[0] for _, marker, _ in probes]
        fig.legend(handles, schemes + [name for _, _, name in probes], loc="outside lower center",
                   ncol=len(handles), fontsize=8, frameon=False)
        fig.suptitle("flat and retrieving? the 1,000-update checkpoints under each window")


def _seeds(figures) -> str:
    """", N seeds" (or ", one seed") behind a probed row's label; nothing for a row never probed."""
    if figures.passkey_8l is None and figures.greedy_16l is None:
        return ""
    n = max((spread[2] for spread in figures.spread.values()), default=1)
    return ", one seed" if n == 1 else f", {n} seeds"


def plot_budgets(budgets, runs: Sequence[str], windows: Sequence[str], lengths: Sequence[int], l: int,
                 tokens_per_update: int, out: Path, title: str) -> None:
    """Write the PNG ``out``: ppl(L) / ppl(l) (log) against training tokens (log, ticks at the snapshots, in
    millions), one panel per window; a run's colour, an evaluation length L's line style (4l, 16l and the longest:
    solid, dashed, dotted), explained once in a legend below the panels, off the data. ``budgets``: {run: {updates:
    {window: {length: ppl}}}}, the snapshots of each run."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    from ...plotting import figure, log_axes

    shown = [L for L in dict.fromkeys([4 * l, 16 * l, max(lengths)]) if L in lengths and L > l]
    styles = dict(zip(shown, ("-", "--", ":")))
    colors = {}
    ticks = set()
    with figure(out, 1, len(windows), (5.2 * len(windows), 4.4), dpi=110, sharey=True, squeeze=False) as (fig, axes):
        for ax, window in zip(axes[0], windows):
            for name in runs:
                snaps = sorted(budgets.get(name, {}).items())
                for L in shown:
                    points = [(u * tokens_per_update, s[window][L] / s[window][l]) for u, s in snaps
                              if window in s and L in s[window] and l in s[window]]
                    if points:
                        line, = ax.plot(*zip(*points), marker="o", linestyle=styles[L], color=colors.get(name))
                        colors.setdefault(name, line.get_color())
                        ticks.update(x for x, _ in points)
            ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
            log_axes(ax, x_base=10)
            ax.xaxis.set_major_locator(FixedLocator(sorted(ticks)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value / 1e6:.3g}M"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_title(WINDOW_LABEL[window], fontsize=10)
            ax.set_xlabel("training tokens")
            ax.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel("ppl(L) / ppl(l)")
        handles = [Line2D([], [], color=c, marker="o") for c in colors.values()]
        handles += [Line2D([], [], color="black", linestyle=styles[L]) for L in shown]
        labels = [LABELS.get(name, name) for name in colors] + [f"L = {L // l}l" for L in shown]
        fig.suptitle(title)
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels), fontsize=8,
                   frameon=False)
