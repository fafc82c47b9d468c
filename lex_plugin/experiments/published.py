"""The published tables, generated from committed reports: each a :class:`Block` of a document, written between two
markers by ``python scripts/results.py`` and compared by ``python scripts/results.py --check`` (a test runs it), so a
table in RESULTS.md, BENCHMARKS.md, the README or the walkthrough (examples/lex_lm/README.md) is what its
reports give, never typed.

A block in a document::

    <!-- generated: NAME (python scripts/results.py) -->
    ...the table...
    <!-- end: NAME -->

The blocks (:data:`BLOCKS`) read the definitions of ``experiments.definitions`` and the verdict's rows
(``experiments.reproduce.verdict``) built from ``examples/lex_lm/designs_1000`` and the reports the reference rows
name (``verdict_reference.json``). The published plots (:data:`PLOTS`) are drawn by the same command from the
same reports; ``--check`` compares the tables only (a PNG's bytes depend on the matplotlib build).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Sequence, Tuple

from .benchmark import markdown_table
from .benchmark_tables import design_costs_markdown, limits_markdown, provenance_line
from .definitions import DEFINITIONS, FAR_CONTEXT
from ..evaluation.figures import attention_mode, mode_rows
from .reproduce.plots import plot_schemes
from .reproduce.tables import _num, markdown_claims, markdown_ppl, markdown_resolution, ppl_table
from .reproduce.verdict import (GOALS, Figures, design_figures, far_context_ratio, figure_meets, markdown_verdict,
                                passkey_seeds, reference_figures, shown)
from .ruler_families import ruler_families_table

__all__ = ["BLOCKS", "Block", "PLOTS", "Plot", "VERDICT_1000", "VerdictRun", "decision_table", "definitions_table",
           "designs_ppl", "draw_plots", "generate", "replace_block", "scheme_rows", "schemes_1000", "verdict_1000_rows"]

_GOALS = {g.key: g for g in GOALS}  # the verdict's columns by figure


@dataclass(frozen=True)
class VerdictRun:
    """The verdict at 1,000 updates as committed: the reproduction's work directory (relative to the repository),
    its runs in the table's order, its budget and l, the cost reports and the transcribed references."""

    work: str
    runs: Tuple[str, ...]
    updates: int
    training_length: int
    costs: Tuple[str, ...]
    references: Tuple[str, ...]

    def command(self) -> str:
        """The ``scripts/verdict.py`` command that prints the same table."""
        costs = " ".join(f"--costs {c}" for c in self.costs)
        refs = " ".join(f"--reference {r}" for r in self.references)
        return (f"python scripts/verdict.py --work {self.work} --updates {self.updates} --runs {','.join(self.runs)} \\\n"
                f"  {costs} \\\n  {refs} -o examples/lex_lm/verdict_1000.png")


VERDICT_1000 = VerdictRun(
    work="examples/lex_lm/designs_1000",
    runs=("irope", "xpos_bca_nope", "rnope_swa", "gemma_5to1", "rope_ssmax", "rope_learned_sinks", "rope_drope",
          "rope_drope/recalibrated", "xpos_sink_token", "rope_gate_elementwise", "rope_diff", "xpos_moba",
          "xpos_bca_nope_moba", "xpos_bca_nope_landmark", "xpos_bca_nope_gate", "fox_nope"),
    updates=1000, training_length=256,
    costs=("examples/lex_lm/designs_1000/costs16k.json", "examples/lex_lm/designs_1000/costs16k_gate_diff.json",
           "examples/lex_lm/designs_1000/costs16k_moba.json", "examples/lex_lm/designs_1000/costs16k_fox.json",
           "examples/lex_lm/designs_1000/costs16k_moba_landmark.json",
           "examples/lex_lm/designs_1000/costs16k_gate_references.json"),
    references=("examples/lex_lm/verdict_reference.json",))


def verdict_1000_rows(root: Path, run: VerdictRun = VERDICT_1000) -> List[Figures]:
    """The verdict's rows (references first, then each run) from the committed reports under ``root``.

    Raises:
        FileNotFoundError, ValueError: as ``design_figures`` and ``reference_figures``.
    """
    rows = [row for path in run.references for row in reference_figures(root / path)]
    for given in run.runs:
        name, _, variant = given.partition("/")
        rows.append(design_figures(root / run.work, name, run.training_length, run.updates,
                                   costs=[root / c for c in run.costs], recalibrated=bool(variant)))
    return rows


def definitions_table() -> str:
    """Markdown: each definition, its rule and how it is read (the rounding)."""
    lines = ["| word | means | read at |", "|---|---|---|"]
    for d in DEFINITIONS:
        lines.append(f"| {d.name} | {d.rule} | {d.decimals} decimals, rounded half up |")
    return "\n".join(lines)


def _figures(f: Figures) -> str:
    parts = []
    for key, name in (("ratio", "ppl 16l/l"), ("greedy_16l", "greedy passkey 16l"), ("ruler_8l", "RULER-lite 8l")):
        if getattr(f, key) is not None:
            parts.append(f"{name} {shown(f, key, _GOALS[key].fmt)}")
    return ", ".join(parts) or "-"


def _cost(f: Figures) -> str:
    parts = [f"{what} {shown(f, g.key, g.fmt)}" if getattr(f, g.key) is not None else f"{what} not measured"
             for what, g in (("eval", _GOALS["eval_time"]), ("cache", _GOALS["cache_64k"]))]
    return ", ".join(parts)


def _meets(f: Figures, key: str) -> bool:
    """Whether ``f``'s figure ``key`` meets its goal in the verdict (:data:`verdict.GOALS`, judged as written), over
    every seed where several were run (``figure_meets``)."""
    return figure_meets(f, key, _GOALS[key].test) is True


# each need: its words, which rows answer it, which of those is used (the cheapest), and the caveat
NEEDS: Tuple[Tuple[str, Callable[[Figures], bool], str], ...] = (
    ("flat perplexity at any length, on an existing checkpoint",
     lambda f: f.reference and _meets(f, "ratio"),
     "flat ignores the far context under a window (LongPPL, RULER-lite)"),
    ("flat perplexity, training a new model",
     lambda f: not f.reference and _meets(f, "ratio"),
     "one seed of training"),
    ("one passkey, written by greedy decoding at 16l",
     lambda f: _meets(f, "greedy_16l"),
     "greedy counts move between fine-tuning runs: the range over its fine-tuning seeds, each meeting the bar"),
    ("several needles (RULER-lite)",
     lambda f: _meets(f, "ruler_8l"),
     "the mean over the tasks that fit in l (9 of 11 at l = 256); the multi-needle tasks are lower"),
    ("the lowest cost that stays flat",
     lambda f: _meets(f, "ratio") and f.eval_time is not None,
     "evaluation time at 16k over full attention's, random weights"),
)


def decision_table(rows: Sequence[Figures]) -> str:
    """Markdown: for each need (:data:`NEEDS`), the row to use (of those that meet it, the one with the lowest
    evaluation time; unmeasured times last), its figures, its cost and the caveat; "none at this scale" where no row
    meets it."""
    lines = ["| need | use | figures | cost | rows that meet it | caveat |", "|---|---|---|---|---:|---|"]
    for need, meets, caveat in NEEDS:
        answering = [f for f in rows if meets(f)]
        if not answering:
            lines.append(f"| {need} | none at this scale | - | - | 0 | {caveat} |")
            continue
        best = min(answering, key=lambda f: (f.eval_time is None, f.eval_time or 0.0))
        lines.append(f"| {need} | {best.label} | {_figures(best)} | {_cost(best)} | {len(answering)} | {caveat} |")
    return "\n".join(lines)


def _results_json(root: Path, name: str) -> dict:
    """A committed ``reproduce_*results.json`` (``scripts/reproduce.py``'s results.json) with integer lengths."""
    raw = json.loads((root / "examples/lex_lm" / name).read_text())
    ppl = {run: {mode: {int(n): v for n, v in by.items()} for mode, by in modes.items()} for run, modes in raw["ppl"].items()}
    # results.json keeps R by window and length; the table reads lex resolution's report form
    resolution = {run: {mode: {"lengths": {str(n): {"R": v} for n, v in by.items()}} for mode, by in modes.items()}
                  for run, modes in raw.get("resolution", {}).items()}
    return {**raw, "ppl": ppl, "resolution": resolution}


WINDOWS = ["full", "sliding", "bca"]
PAPER_RUNS = ["xpos", "rope", "alibi", "sinusoidal", "sandwich", "none"]  # LeX Table 2's schemes and NoPE
ABLATIONS = ["xpos", "xpos_no_rotation", "xpos_scalar_zeta", "rope"]  # LeX Table 4's rows


def _paper_table(root: Path, name: str, table: int) -> str:
    """LeX Table ``table`` (2-5) in shape from the committed results ``name``, as the reproduction writes it."""
    r = _results_json(root, name)
    l, lengths = int(r["options"]["train_length"]), [int(n) for n in r["options"]["lengths"]]
    runs = [n for n in PAPER_RUNS if n in r["ppl"]]
    if table == 2:
        return (markdown_ppl(r["ppl"], runs, WINDOWS, lengths, l)
                + f"\n\nReport: [`{name}`]({name}). {provenance_line(r['provenance'])}")
    if table == 3:
        return markdown_resolution(r["resolution"], [n for n in r["ppl"] if n in r["resolution"]], [l, 2 * l])
    if table == 4:
        return markdown_ppl(r["ppl"], ABLATIONS, ["full", "bca"], [l, 8 * l], l)
    return markdown_ppl(r["ppl"], runs, WINDOWS, [l, 4 * l, 16 * l], l)


def _claims(root: Path, name: str) -> str:
    return markdown_claims(_results_json(root, name)["claims"])


def _wall_times(root: Path, name: str) -> str:
    """The reproduction's wall time per step (its progress record) and the total."""
    from .reproduce.runner import fmt_time

    wall = json.loads((root / "examples/lex_lm" / name).read_text())["wall_seconds"]
    return "\n".join(["| step | wall time |", "|---|---:|", *(f"| {k} | {fmt_time(v)} |" for k, v in wall.items()),
                      f"| **total** | **{fmt_time(sum(wall.values()))}** |"])


SCHEME_LABELS = {"xpos": "LeX (xPos)", "rope": "RoPE", "alibi": "ALiBi"}
MODE_LABELS = {"full": "full attention", "bca": "BCA", "rerope": "ReRoPE (w = l/2)"}


def scheme_rows(root: Path) -> List[dict]:
    """The 1,000-update xPos, RoPE and ALiBi checkpoints under full attention, BCA and ReRoPE, one dict each: scheme,
    label, mode, window (its name), ppl_l and ppl_16l (test perplexity), ratio (ppl(16l) / ppl(l)); far_context
    (LongPPL at 16l on the common evaluator's key tokens over the same model's under a window of l,
    ``designs_1000/runs/SCHEME/longppl_common.json``, the verdict's ``FAR_CONTEXT``; None where not measured);
    longppl_own (LongPPL(16l) / LongPPL(l) on the checkpoint's own key tokens, ``longppl_SCHEME.json``, judged by
    nothing); probed (a :class:`Figures` with passkey_8l, ranked, and greedy_16l after fine-tuning, from the reports
    the verdict reads, ``designs_1000/runs/SCHEME/passkey_finetuned*.json`` by :func:`passkey_seeds`: over several
    fine-tuning seeds the mean, with the range and the seeds in its spread; None where not probed).

    Raises:
        FileNotFoundError: a report is missing; ValueError: a seed lacks a mode another seed has (passkey_seeds).
    """
    rows = []
    for scheme, label in SCHEME_LABELS.items():
        report = json.loads((root / f"examples/lex_lm/longppl_{scheme}.json").read_text())
        run = root / f"examples/lex_lm/designs_1000/runs/{scheme}"
        common = json.loads((run / "longppl_common.json").read_text())
        l = int(report["training_length"])
        for mode, name in MODE_LABELS.items():
            by = mode_rows(report, mode)
            low, high = by[l][0], by[16 * l][0]
            ranked_8l, _, greedy_16l, spread = passkey_seeds(run, l, mode)
            rows.append({"scheme": scheme, "label": label, "mode": mode, "window": name, "ppl_l": low["ppl"],
                         "ppl_16l": high["ppl"], "ratio": high["ppl"] / low["ppl"],
                         "far_context": far_context_ratio(common, l, mode,
                                                          f"designs_1000/runs/{scheme}/longppl_common.json"),
                         "longppl_own": high["longppl"] / low["longppl"],
                         "probed": Figures(name=scheme, label=label, updates=0, passkey_8l=ranked_8l,
                                           greedy_16l=greedy_16l, spread=spread)})
    return rows


def schemes_1000(root: Path) -> str:
    """:func:`scheme_rows` as README's scheme table (a figure not measured reads "-")."""
    lines = ["| scheme | window / method | ppl at l | ppl at 16l | ppl(16l) / ppl(l) | "
             f"{FAR_CONTEXT.figure} | LongPPL(16l) / LongPPL(l), own key tokens | passkey at 8l (ranked) | "
             "passkey at 16l (greedy) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in scheme_rows(root):
        far = r["far_context"]
        far_cell = "-" if far is None else f"{FAR_CONTEXT.rounded(far):.{FAR_CONTEXT.decimals}f}"
        lines.append(f"| {r['label']} | {r['window']} | {r['ppl_l']:.2f} | {r['ppl_16l']:.2f} | {r['ratio']:.4f} | "
                     f"{far_cell} | {r['longppl_own']:.2f} | {shown(r['probed'], 'passkey_8l', '{:.2f}')} | "
                     f"{shown(r['probed'], 'greedy_16l', '{:.2f}')} |")
    return "\n".join(lines)


FIRST_RUNS = "examples/lex_lm/designs_1000/gpu"  # runs/NAME: a row's first run, on the GPU machine


def first_runs_table(root: Path, run: VerdictRun = VERDICT_1000) -> str:
    """Each verdict row whose first run (on the GPU machine, before reports carried provenance; its reports kept in
    ``FIRST_RUNS/runs/NAME``) was trained and probed again on the CPU by the same command: the figures the verdict
    reads of both, one line each, with where each was measured (the length report's provenance)."""
    first = root / FIRST_RUNS
    lines = ["| design | run | ppl(16l) / ppl(l) | greedy passkey 16l | passkey 8l (ranked) | RULER-lite 8l | "
             "measured on (commit, wall time) |", "|---|---|---:|---:|---:|---:|---|"]
    for name in [n for n in run.runs if (first / "runs" / n).is_dir()]:
        for which, work in (("first, GPU machine", first), ("again, the verdict's", root / run.work)):
            f = design_figures(work, name, run.training_length, run.updates)
            cells = [shown(f, "ratio", "{:.4f}"),
                     *(shown(f, key, "{:.2f}") for key in ("greedy_16l", "passkey_8l", "ruler_8l"))]
            lines.append(f"| {f.label} | {which} | {' | '.join(cells)} | {f.measured_on} |")
    return "\n".join(lines)


LONGPPL_EVALUATOR = "examples/lex_lm/designs_1000/longppl_evaluator.json"


def longppl_evaluator_table(root: Path) -> str:
    """The common LongPPL evaluator (``scripts/longppl_evaluator.py``): how it was trained, the rule, its key tokens,
    its own perplexity and LongPPL at each length, and its report's provenance."""
    r = json.loads((root / LONGPPL_EVALUATOR).read_text())
    lp, training = r["longppl"], r["evaluator_training"]
    lines = [f"Evaluator: RoPE, `lex_lm_tiny`, trained at {training['training_length']:,} tokens for "
             f"{training['updates']:,} updates; rule alpha = {lp['alpha']:g}, beta = {lp['beta']:g} nats, K = "
             f"{lp['trunc_len']}, S = {lp['sliding_window']}, on samples of {lp['length']:,}: {lp['key_tokens']:,} key "
             f"tokens of {r['split_tokens']:,}.", "",
             "| length | ppl | LongPPL on its own key tokens |", "|---:|---:|---:|"]
    lines += [f"| {row['length']:,} | {row['ppl']:.2f} | {row['longppl']:.2f} |" for row in r["results"]]
    return "\n".join(lines + ["", provenance_line(r["provenance"])])


def designs_ppl(root: Path, run: VerdictRun = VERDICT_1000) -> str:
    """Each trained design's perplexity by length under full attention, the sliding window and BCA (its length
    report), as the reproduction's "Trained designs" table."""
    names = [n for n in run.runs if "/" not in n]
    reports = {n: json.loads((root / run.work / "runs" / n / "length_report.json").read_text()) for n in names}
    ppl = ppl_table(reports)
    lengths = sorted({n for modes in ppl.values() for by in modes.values() for n in by})
    return markdown_ppl(ppl, names, WINDOWS, lengths, run.training_length)


RETRIEVAL = "examples/lex_lm/retrieval"  # block retrieval at evaluation (--bca --retrieval-blocks K) on trained checkpoints


def retrieval_tables(root: Path, run: VerdictRun = VERDICT_1000) -> str:
    """Block retrieval at evaluation on the committed 1,000-update checkpoints: RoPE's perplexity by length under full
    attention and BCA (its length report) and BCA plus retrieved blocks (``retrieval/length_rope.json``); the xPos BCA
    x3 + NoPE pattern's passkey at 16l after its fine-tuning, full attention against the retrieval on its global layer
    (``retrieval/passkey_xpos_bca_nope_16l.json``), each with its provenance line."""
    l = run.training_length
    base = json.loads((root / run.work / "runs" / "rope" / "length_report.json").read_text())
    retrieval = json.loads((root / RETRIEVAL / "length_rope.json").read_text())
    rows: dict = {}
    for report in (base, retrieval):
        for r in report["results"]:
            if r.get("protocol", "stream") == "stream" and r["window"].split("(")[0] in ("full", "bca", "bca+retrieval"):
                rows.setdefault(r["window"], {})[int(r["length"])] = float(r["ppl"])
    lengths = sorted({n for by in rows.values() for n in by})
    lines = ["| RoPE, 1,000 updates | " + " | ".join(f"{n} ({n // l}l)" for n in lengths) + " | ppl(16l) / ppl(l) |",
             "|---|" + "---:|" * (len(lengths) + 1)]
    for window, by in rows.items():
        lines.append(f"| {window} | " + " | ".join(f"{by[n]:.2f}" for n in lengths) + f" | {by[16 * l] / by[l]:.4f} |")
    passkey = json.loads((root / RETRIEVAL / "passkey_xpos_bca_nope_16l.json").read_text())
    lines += ["", provenance_line(retrieval["provenance"]), "",
              "| xPos BCA x3 + NoPE, passkey at 16l | ranked | greedy writes the key |", "|---|---:|---:|"]
    by_window: dict = {}
    for r in passkey["results"]:
        if int(r["length"]) == 16 * l:
            cell = by_window.setdefault(r["window"], [0, 0, 0])
            cell[0] += r["retrieved"]
            cell[1] += r["greedy"]
            cell[2] += r["trials"]
    for window, (ranked, greedy, trials) in by_window.items():
        lines.append(f"| {window} | {ranked / trials:.2f} | {greedy} of {trials} |")
    lines += ["", provenance_line(passkey["provenance"])]
    return "\n".join(lines)


def first_token_table(root: Path, run: VerdictRun = VERDICT_1000) -> str:
    """The attention mass on the first token per layer (``lex first-token``: the mean over heads and queries at l) of
    each 1,000-update checkpoint with a committed ``first_token.json`` (gated attention's claim, Qiu et al. 2025)."""
    from .reproduce.catalogue import LABELS

    names = ["rope", *(n for n in run.runs if "/" not in n)]
    found = [(n, json.loads(p.read_text())) for n in names
             for p in [root / run.work / "runs" / n / "first_token.json"] if p.is_file()]
    depth = max(len(r["layers"]) for _, r in found)
    lines = ["| model | " + " | ".join(f"layer {i}" for i in range(depth)) + " | mean |",
             "|---|" + "---:|" * (depth + 1)]
    for name, report in found:
        cells = (["-" if layer["mean"] is None else f"{layer['mean']:.3f}" for layer in report["layers"]]
                 + ["-"] * (depth - len(report["layers"])))
        lines.append(f"| {LABELS.get(name, name)} | " + " | ".join(cells) + f" | {report['mean']:.3f} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Block:
    """One generated table: ``document`` (relative to the repository root), the marker ``name`` and ``make(root)``,
    its markdown from the committed reports under ``root``."""

    document: str
    name: str
    make: Callable[[Path], str]


RESULTS, README, BENCHMARKS = "examples/lex_lm/RESULTS.md", "README.md", "examples/lex_lm/BENCHMARKS.md"
WALKTHROUGH = "examples/lex_lm/README.md"


def _bench_report(root: Path, path: str) -> dict:
    return json.loads((root / path).read_text())


def demo_length_table(root: Path, path: str = "examples/lex_lm/length_report.json") -> str:
    """The walkthrough's length table from ``make demo``'s eval-lm report (``--report-json``): perplexity at each
    length under full attention and BCA (the stream protocol's rows, read and written as the reproduction's tables
    read and write them: ``tables.ppl_table``, two decimals half up), and the report's provenance line.

    Raises:
        ValueError: the report does not hold exactly the modes full and BCA at the same lengths.
    """
    report = _bench_report(root, path)
    ppl = ppl_table({"demo": report}).get("demo", {})
    if set(ppl) != {"full", "bca"} or ppl["full"].keys() != ppl["bca"].keys():
        raise ValueError(f"{path}: expected the modes full and bca at the same lengths, found {sorted(ppl)}")
    block = next(r["window"] for r in report["results"] if attention_mode(r) == "bca")[len("bca("):-1]
    l = report["training_length"]
    rows = [[str(n), str(n // l), _num(ppl["full"][n]), _num(ppl["bca"][n])] for n in sorted(ppl["full"])]
    return "\n".join([markdown_table(["length", "x l", "full attention ppl", f"BCA (blocks of {block}) ppl"], rows), "",
                      provenance_line(report["provenance"])])


def demo_measured(root: Path, path: str = "examples/lex_lm/demo_report.json") -> str:
    """The walkthrough's "Measured" block from ``make demo``'s report (``experiments.demo_report``): the wall time of
    each step, the training throughput, validation perplexity by update and fairseq-eval-lm's own figures (each run's
    command, tokens scored, loss and perplexity), then the report's provenance line."""
    from .demo_report import demo_steps_table, demo_valid_table

    report = _bench_report(root, path)
    runs = markdown_table(["fairseq-eval-lm", "tokens scored", "loss (bits)", "ppl"],
                          [[f"`{r['command']}`", f"{r['tokens']:,}", f"{r['loss_bits']:.4f}", _num(r["ppl"])]
                           for r in report["eval_lm"].values()])
    return "\n\n".join([demo_steps_table(report), "Validation perplexity during training (the first 10 batches of "
                         "`valid`, at each checkpoint):", demo_valid_table(report),
                         "fairseq-eval-lm's own pass over the whole test split (every token scored):", runs,
                         provenance_line(report["provenance"])])


ANALYSIS = "examples/lex_lm/analysis"  # the walkthrough's analysis reports (lex resolution, receptive-field, decay-curve)


def _provenance_lines(root: Path, names: Sequence[str], folder: str = ANALYSIS) -> str:
    """One line per report ``folder/NAME``: its name and its provenance line."""
    return "\n".join(f"- `{name}`: {provenance_line(_bench_report(root, f'{folder}/{name}')['provenance'])}"
                     for name in names)


def analysis_resolution(root: Path) -> str:
    """The walkthrough's attention resolution table: R(s), mean over layers, at each length under full attention and
    BCA (``lex resolution --json``), each written at 4 decimals, then the reports' provenance."""
    names = ("resolution_full.json", "resolution_bca.json")
    full, bca = (_bench_report(root, f"{ANALYSIS}/{name}") for name in names)
    if full["lengths"].keys() != bca["lengths"].keys():
        raise ValueError(f"{ANALYSIS}: the resolution reports hold other lengths ({sorted(full['lengths'])} and "
                         f"{sorted(bca['lengths'])}): measure both at the same --lengths.")
    l = int(min(full["lengths"], key=int))
    rows = [[f"{n} ({int(n) // l}l)", f"{full['lengths'][n]['R']:.4f}", f"{bca['lengths'][n]['R']:.4f}",
             ", ".join(f"{r:.4f}" for r in full["lengths"][n]["R_layers"]),
             ", ".join(f"{r:.4f}" for r in bca["lengths"][n]["R_layers"])] for n in sorted(full["lengths"], key=int)]
    return "\n\n".join([markdown_table(["length", "full attention", f"BCA (blocks of {bca['attention']['stride']})",
                                         "full, per layer", "BCA, per layer"], rows), _provenance_lines(root, names)])


def analysis_receptive_field(root: Path) -> str:
    """The walkthrough's receptive-field table (``lex receptive-field --json``): each window's ERF, its bound and the
    cumulative gradient c at 64, 256 and 1024 tokens back, then the reports' provenance."""
    names = ("rf_full.json", "rf_sliding.json", "rf_bca.json")
    rows = []
    for name in names:
        r = _bench_report(root, f"{ANALYSIS}/{name}")
        rows.append([r["window"], f"{r['erf']:,}", f"{r['theoretical']:,}",
                     *(f"{r['c'][n]:.3f}" for n in (64, 256, 1024))])
    return "\n\n".join([markdown_table(["window", "ERF", "theoretical bound", "c[64]", "c[256]", "c[1024]"], rows),
                         _provenance_lines(root, names)])


def analysis_decay(root: Path) -> str:
    """The walkthrough's decay-curve table (``lex decay-curve --json``, Eq. 10): R(g) and g[n] at 512, 1024 and 2048
    for each scheme, then the report's provenance."""
    r = _bench_report(root, f"{ANALYSIS}/decay_curve.json")
    rows = [[scheme, f"{r['R'][scheme]:.4f}", *(f"{r['g'][scheme][n]:.2f}" for n in (512, 1024, 2048))]
            for scheme in r["R"]]
    return "\n\n".join([markdown_table(["scheme", "R(g)", "g[512]", "g[1024]", "g[2048]"], rows),
                         _provenance_lines(root, ["decay_curve.json"])])


LM_EVAL_CROSSCHECK = "examples/lex_lm/lm_eval_crosscheck"  # lm-eval's results and lex score's report, one checkpoint


def lm_eval_crosscheck(root: Path) -> str:
    """The walkthrough's lm-evaluation-harness check: the total log-likelihood of WikiText-2's test articles under
    ``lex score`` on the fairseq checkpoint (its ``--json``) and under lm-eval's rolling log-likelihood on the export
    (``lm_eval ... --tasks lex_wikitext2``: each ``lm_eval_results*.json``, one per ``max_length``), each run's
    relative difference from ``lex score`` and its time; the tokens and per-token perplexity ``lex score`` reports,
    lm-eval's word perplexity and the longest article; then where each was measured.

    Raises:
        ValueError: a run scored another number of articles than ``lex score``.
    """
    import math

    score = _bench_report(root, f"{LM_EVAL_CROSSCHECK}/lex_score.json")
    ours = -sum(d["loss"] * d["tokens"] * math.log(2) for d in score["documents"])  # bits per token -> nats
    rows = [[f"lex score on the checkpoint ({score['window']} attention)", str(len(score["documents"])), f"{ours:,.3f}",
             "-", f"{score['provenance']['wall_s']:.0f} s"]]
    notes = [_provenance_lines(root, ["lex_score.json"], LM_EVAL_CROSSCHECK)]
    for path in sorted((root / LM_EVAL_CROSSCHECK).glob("lm_eval_results*.json")):
        lm = json.loads(path.read_text())
        task, args = lm["results"]["lex_wikitext2"], lm["config"]["model_args"]
        if task["sample_len"] != len(score["documents"]):
            raise ValueError(f"{path}: lm-eval scored {task['sample_len']} articles, lex score {len(score['documents'])}: "
                             "score the same articles.")
        theirs = task["loglikelihood,none"]
        rows.append([f"lm-eval, rolling, on the export, max_length {args['max_length']:,}", str(task["sample_len"]),
                     f"{theirs:,.3f}", f"{abs(theirs - ours) / abs(ours):.1e}",
                     f"{float(lm['total_evaluation_time_seconds']):.0f} s"])
        notes.append(f"- `{path.name}`: lm-eval {lm['lm_eval_version']}, transformers {lm['transformers_version']}, "
                     f"model_args {json.dumps(args)}, {lm['config']['device']} (its own record: no command line; word "
                     f"perplexity {task['word_perplexity,none']:,.0f}).")
    table = markdown_table(["run", "articles", "log-likelihood (nats)", "relative difference", "time"], rows)
    summary = (f"{score['tokens']:,} tokens, perplexity {_num(score['ppl'])} per token; the longest article is "
               f"{max(d['tokens'] for d in score['documents']):,} tokens.")
    return "\n\n".join([table, summary, "\n".join(notes)])


def cost_report_tables(root: Path, paths: Sequence[str]) -> str:
    """Cost reports of ``scripts/bench_design_costs.py`` (paths from the repository's root), each its link, its table
    and its provenance line."""
    parts = []
    for path in paths:
        report = _bench_report(root, path)
        parts += [f"[`{Path(path).name}`]({Path(path).relative_to('examples/lex_lm')}):", "",
                  design_costs_markdown(report["rows"]), "", provenance_line(report["provenance"]), ""]
    return "\n".join(parts)


def design_costs_tables(root: Path, run: VerdictRun = VERDICT_1000) -> str:
    """The cost reports the verdict reads (its ``--costs``, then those its reference rows name, each once), each its
    table and its provenance line."""
    named = [(Path(ref).parent / raw["costs"]["report"]).as_posix() for ref in run.references
             for raw in json.loads((root / ref).read_text()) if "costs" in raw]
    return cost_report_tables(root, list(dict.fromkeys([*run.costs, *named])))


# the forget gate's cost before its decay horizon (every key of a chunk attended) and after (the verdict's report)
FOX_HORIZON = ("examples/lex_lm/designs_1000/costs16k_fox_before_horizon.json", "examples/lex_lm/designs_1000/costs16k_fox.json")
SHORT, LONG = "reproduce_results.json", "reproduce_long_results.json"  # 300 and 1,000 updates
BLOCKS: Tuple[Block, ...] = (
    Block(RESULTS, "definitions", lambda root: definitions_table()),
    Block(RESULTS, "longppl_evaluator", longppl_evaluator_table),
    Block(RESULTS, "decision", lambda root: decision_table(verdict_1000_rows(root))),
    Block(RESULTS, "verdict_1000", lambda root: f"```bash\n{VERDICT_1000.command()}\n```\n\n"
                                                 + markdown_verdict(verdict_1000_rows(root))),
    Block(RESULTS, "ruler_families_1000", lambda root: ruler_families_table(root, VERDICT_1000)),
    Block(RESULTS, "designs_1000_ppl", designs_ppl),
    Block(RESULTS, "retrieval_1000", retrieval_tables),
    Block(RESULTS, "first_token_1000", first_token_table),
    Block(RESULTS, "first_runs_gpu_1000", first_runs_table),
    Block(RESULTS, "table2_1000", lambda root: _paper_table(root, LONG, 2)),
    Block(RESULTS, "table3_1000", lambda root: _paper_table(root, LONG, 3)),
    Block(RESULTS, "table2_300", lambda root: _paper_table(root, SHORT, 2)),
    Block(RESULTS, "table3_300", lambda root: _paper_table(root, SHORT, 3)),
    Block(RESULTS, "table4_300", lambda root: _paper_table(root, SHORT, 4)),
    Block(RESULTS, "table5_300", lambda root: _paper_table(root, SHORT, 5)),
    Block(RESULTS, "claims_300", lambda root: _claims(root, SHORT)),
    Block(RESULTS, "wall_300", lambda root: _wall_times(root, SHORT)),
    Block(BENCHMARKS, "design_costs", design_costs_tables),
    Block(BENCHMARKS, "fox_horizon", lambda root: cost_report_tables(root, FOX_HORIZON)),
    Block(BENCHMARKS, "limits", lambda root: limits_markdown(_bench_report(root, "examples/lex_lm/limits.json"))),
    Block(README, "decision", lambda root: decision_table(verdict_1000_rows(root))),
    Block(README, "schemes_1000", schemes_1000),
    Block(WALKTHROUGH, "demo_measured", demo_measured),
    Block(WALKTHROUGH, "demo_length", demo_length_table),
    Block(WALKTHROUGH, "analysis_resolution", analysis_resolution),
    Block(WALKTHROUGH, "analysis_receptive_field", analysis_receptive_field),
    Block(WALKTHROUGH, "analysis_decay", analysis_decay),
    Block(WALKTHROUGH, "lm_eval_crosscheck", lm_eval_crosscheck),
)


@dataclass(frozen=True)
class Plot:
    """A published PNG: its ``path`` under the repository and how to ``draw`` it (root, out) from the reports."""
    path: str
    draw: Callable[[Path, Path], None]


PLOTS: Tuple[Plot, ...] = (
    Plot("examples/lex_lm/flat_and_retrieving_1000.png", lambda root, out: plot_schemes(scheme_rows(root), out)),
)


def draw_plots(root: Path, plots: Sequence[Plot] = PLOTS) -> List[Path]:
    """Draw every published PNG under ``root`` from its reports; returns the paths written.

    Raises:
        FileNotFoundError: a report a plot reads is missing.
    """
    written = []
    for plot in plots:
        plot.draw(root, root / plot.path)
        written.append(root / plot.path)
    return written


def _markers(name: str) -> Tuple[str, str]:
    return f"<!-- generated: {name} (python scripts/results.py) -->", f"<!-- end: {name} -->"


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` holding ``body``.

    Raises:
        ValueError: the document lacks the block's markers (or holds them twice, or out of order).
    """
    start, end = _markers(name)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"no block {name!r}: the document needs the lines {start!r} and {end!r} once each, in order.")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body.strip()}\n{end}{tail}"


def generate(root: Path, check: bool = False, blocks: Sequence[Block] = BLOCKS) -> List[str]:
    """Write every block into its document under ``root`` (``check``: write nothing); returns ``DOCUMENT: NAME`` for
    each block whose document differed from what its reports give.

    Raises:
        ValueError: a document without a block's markers; FileNotFoundError: a report a block reads is missing.
    """
    texts, changed = {}, []
    for block in blocks:
        path = root / block.document
        text = texts.get(block.document) or path.read_text()
        new = replace_block(text, block.name, block.make(root))
        if new != text:
            changed.append(f"{block.document}: {block.name}")
        texts[block.document] = new
    if not check:
        for document, text in texts.items():
            path = root / document
            if path.read_text() != text:
                path.write_text(text)
    return changed
