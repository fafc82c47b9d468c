"""Every plot a reader compares is readable: rendered with many rows, no two of its text boxes (tick labels,
titles, axis labels, legend entries, cell values) overlap."""

import itertools
import math

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    """The figures the package draws, kept open (``plotting.figure`` closes each after saving it)."""
    kept = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for fig in kept:
        close(fig)


def _overlaps(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    hidden = set()  # tick labels outside their axis' view: matplotlib does not draw them
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not low - 1e-9 * abs(high - low) <= tick.get_loc() <= high + 1e-9 * abs(high - low):
                    hidden |= {id(tick.label1), id(tick.label2)}
    shown = [t for t in fig.findobj(Text) if id(t) not in hidden
             and t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible())]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in shown]
    boxes = [(text, box) for text, box in boxes if box.width > 0 and box.height > 0]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
            if box_a.x0 < box_b.x1 - 0.5 and box_b.x0 < box_a.x1 - 0.5 and box_a.y0 < box_b.y1 - 0.5 and box_b.y0 < box_a.y1 - 0.5]


def test_the_overlap_check_sees_overlapping_labels(figures, tmp_path):
    from lex_plugin.plotting import figure

    with figure(tmp_path / "bad.png") as (fig, ax):  # the old layout's failure: labels of close points
        ax.plot([1, 1.01], [0.5, 0.5], "o")
        ax.set_xlim(0.9, 1.6)
        ax.annotate("rerope (xPos)", (1, 0.5))
        ax.annotate("leaky rerope (xPos)", (1.01, 0.5))
    assert _overlaps(figures[-1])


def _flat_rows(n):
    runs = ["xpos", "rope", "alibi"]
    return [{"run": runs[i % 3], "method": f"method_{i}", "ratio": 1.0 + 0.001 * (i % 4), "passkey": 0.1 * (i % 2),
             "interval": (0.0, 0.3)} for i in range(n)]


def test_flat_and_retrieving_has_a_line_per_label(figures, tmp_path):
    """40 points at four ratios and two accuracies: the old scatter put their labels on top of each other."""
    from lex_plugin.experiments.reproduce.plots import plot_flat_and_retrieving

    assert plot_flat_and_retrieving(_flat_rows(40), 256, 4096, tmp_path / "flat.png")
    assert not _overlaps(figures[-1])
    labels = [t.get_text() for t in figures[-1].axes[0].get_yticklabels()]
    assert len(labels) == 40 and len(set(labels)) == 40


@pytest.mark.e2e  # starts a process
def test_the_committed_flat_and_retrieving_rows_redraw(figures, tmp_path):
    """scripts/plot_flat_and_retrieving.py on the committed rows (RESULTS' tables): one readable row per method and
    scheme, each accuracy the row's hits over its trials."""
    import json
    import subprocess
    import sys

    from conftest import REPO

    rows = REPO / "examples" / "lex_lm" / "flat_and_retrieving.json"
    out = tmp_path / "alibi.png"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_flat_and_retrieving.py"), str(rows), "--runs",
                           "alibi", "-o", str(out)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0 and "(10 rows)" in done.stdout
    unknown = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_flat_and_retrieving.py"), str(rows), "--runs",
                              "alibi,alibbi", "-o", str(tmp_path / "x.png")], capture_output=True, text=True, cwd=REPO)
    assert unknown.returncode == 2 and "no row of alibbi" in unknown.stderr and not (tmp_path / "x.png").exists()
    data = json.loads(rows.read_text())
    assert len({(r["run"], r["method"]) for r in data["rows"]}) == len(data["rows"]) == 58
    from lex_plugin.experiments.reproduce.plots import plot_flat_and_retrieving
    from lex_plugin.experiments.reproduce.probe_tables import wilson_interval

    every = [{**r, "passkey": r["retrieved"] / r["trials"], "interval": wilson_interval(r["retrieved"], r["trials"])}
             for r in data["rows"]]
    assert plot_flat_and_retrieving(every, data["training_length"], data["longest"], tmp_path / "all.png")
    assert not _overlaps(figures[-1])


def test_the_schemes_plot_draws_the_tables_rows_with_their_seeds(figures, tmp_path):
    """README's plot of the 1,000-update schemes, from the reports its table reads: one labelled line per row, the
    row never probed says so, and a seeded figure's bar spans its seeds' range (ALiBi + ReRoPE's greedy 16l: 49 of
    50 prompts under each of three seeds, a bar of zero width at 0.98; LeX + ReRoPE's: 0.24 to 0.72)."""
    from matplotlib.collections import LineCollection

    from conftest import REPO
    from lex_plugin.experiments.published import scheme_rows
    from lex_plugin.experiments.reproduce.plots import plot_schemes

    rows = scheme_rows(REPO)
    plot_schemes(rows, tmp_path / "schemes.png")
    fig = figures[-1]
    assert (tmp_path / "schemes.png").stat().st_size > 0 and not _overlaps(fig)
    flat, found = fig.axes
    labels = [t.get_text() for t in flat.get_yticklabels()]
    assert len(labels) == len(set(labels)) == len(rows) == 9
    assert "ALiBi, ReRoPE (w = l/2), 3 seeds" in labels and "RoPE, BCA" in labels
    assert "RoPE, ReRoPE (w = l/2), 3 seeds" in labels
    assert [t.get_text() for t in found.texts] == ["not probed"]
    bars = sorted((round(float(seg[0][0]), 2), round(float(seg[1][0]), 2)) for c in found.collections
                  if isinstance(c, LineCollection) for seg in c.get_segments() if seg[0][1] == seg[1][1])
    assert (0.98, 0.98) in bars and (0.24, 0.72) in bars


def test_probe_heat_maps_and_length_plots(figures, tmp_path):
    from lex_plugin.evaluation.babilong import BabilongResult, plot_babilong
    from lex_plugin.evaluation.passkey import PasskeyResult, plot_passkey
    from lex_plugin.experiments.reproduce.plots import plot_ppl
    from lex_plugin.evaluation.ruler import RulerResult, plot_ruler

    lengths = [256 * 2 ** k for k in range(5)]
    windows = ["full", "bca(128)", "sliding(256)", "rerope(w=256)"]
    ruler = [RulerResult(t, w, L, d, trials=4, score=2.5, queries=4, greedy=1.25)
             for t in ("niah_single_3", "vt") for w in windows for L in lengths for d in (0.1, 0.5, 0.9)]
    ruler += [RulerResult("cwe", w, L, None, trials=0 if L == 256 else 4, score=1.0, queries=0 if L == 256 else 4)
              for w in windows for L in lengths]
    plot_ruler(ruler, tmp_path / "ruler.png", 256)
    babilong = [BabilongResult(t, w, L, trials=20, greedy=7, ranked=13, candidates=6)
                for t in ("qa1", "qa2", "qa3", "qa4", "qa5") for w in windows for L in lengths]
    plot_babilong(babilong, tmp_path / "babilong.png", 256)
    passkey = [PasskeyResult(w, L, d, trials=10, retrieved=7) for w in windows for L in lengths for d in (0.1, 0.3, 0.5, 0.7, 0.9)]
    plot_passkey(passkey, tmp_path / "passkey.png", 256)
    ppl = {run: {w: {L: 100 + math.log(L) for L in lengths} for w in ("full", "bca", "sliding")} for run in
           ("xpos", "rope", "alibi", "sinusoidal", "sandwich", "none")}
    plot_ppl(ppl, list(ppl), ["full", "bca", "sliding"], 256, tmp_path / "ppl.png", "perplexity against length")
    assert len(figures) == 3 + 1 + 1 + 1  # ruler: one per task
    for fig in figures:
        assert not _overlaps(fig), (fig.texts and fig.texts[0].get_text(), _overlaps(fig)[:3])


def test_lex_plot_draws_longppl_and_refuses_reports_without_it(figures, tmp_path):
    import json

    from lex_plugin.evaluation.plot import plot_reports

    rows = [{"window": w, "length": L, "protocol": "stream", "ppl": 80.0 + L / 1000, "longppl": 180.0 - k * L / 100}
            for k, w in enumerate(["full", "bca(128)", "sliding(256)", "rerope(window=128)", "self_extend(G=8,w=64)"])
            for L in (256, 1024, 4096)]
    with_longppl, without = tmp_path / "a.json", tmp_path / "b.json"
    with_longppl.write_text(json.dumps({"training_length": 256, "results": rows}))
    without.write_text(json.dumps({"training_length": 256, "results": [{k: v for k, v in r.items() if k != "longppl"}
                                                                        for r in rows]}))
    assert plot_reports([with_longppl], tmp_path / "l.png", metric="longppl") == 5
    axis = figures[-1].axes[0]
    assert axis.get_ylabel() == "LongPPL (key tokens)" and [line.get_ydata()[-1] for line in axis.get_lines()[:2]] == [180.0 - 0, 180.0 - 40.96]
    assert not _overlaps(figures[-1])
    assert len([t for t in axis.get_yticklabels(minor=True) if t.get_text()]) >= 3  # a decade or less: labelled between powers of 10
    with pytest.raises(ValueError, match="write it with --longppl"):
        plot_reports([without], tmp_path / "m.png", metric="longppl")


def test_lex_plot_draws_only_the_windows_asked_for(figures, tmp_path):
    """--window full,bca keeps those attention modes' rows (the report's attention.mode), one line per report and
    mode; a mode no report holds is refused, naming it."""
    import json

    from lex_plugin.evaluation.plot import plot_reports

    rows = [{"window": label, "attention": {"mode": mode}, "length": L, "protocol": "stream", "ppl": 80.0 + k + L / 1000}
            for k, (mode, label) in enumerate([("full", "full"), ("bca", "bca(128)+sinks(4)"), ("sliding", "sliding(256)")])
            for L in (256, 1024)]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        path.write_text(json.dumps({"training_length": 256, "results": rows}))
    assert plot_reports([a, b], tmp_path / "w.png", labels=["A", "B"], modes=["full", "bca"]) == 4
    drawn = [line.get_label() for line in figures[-1].axes[0].get_lines() if not line.get_label().startswith("training")]
    assert drawn == ["A: full", "A: bca(128)+sinks(4)", "B: full", "B: bca(128)+sinks(4)"]
    with pytest.raises(ValueError, match="under rerope"):
        plot_reports([a], tmp_path / "x.png", modes=["rerope"])


def test_the_flat_line_is_where_a_cell_as_written_flips(figures, tmp_path):
    """The flat-and-retrieving plot draws flat's line at 1.0045, where the table's ratio written at 3 decimals flips
    (1.0045 -> "1.005", not flat), not at 1.005; retrieving's at 0.895 (the score is written at its own 2 decimals)."""
    from lex_plugin.experiments.reproduce.plots import plot_flat_and_retrieving
    from lex_plugin.experiments.reproduce.probe_tables import flat_and_retrieving_row

    rows = [flat_and_retrieving_row("rope", "full", 1.0044, 9, 10), flat_and_retrieving_row("rope", "rerope", 1.0046, 5, 10)]
    assert [r["flat"] for r in rows] == [True, False]
    assert plot_flat_and_retrieving(rows, 256, 4096, tmp_path / "flat.png")
    flat, found = figures[-1].axes[:2]
    lines = lambda ax: [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == ":"]  # noqa: E731
    assert lines(flat) == [pytest.approx(1.0045)] and lines(found) == [pytest.approx(0.895)]
