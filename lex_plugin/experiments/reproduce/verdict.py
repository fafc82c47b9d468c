"""The verdict of the trained designs (issue "Trained to extrapolate"): one row per design or reference method, one
column per goal, each cell met, missed or not measured.

The goal, from the issue: a trained design that is flat, reads the far context, retrieves and reaches ReRoPE's
RULER-lite mean at 8l (each as ``experiments.definitions`` states it, read at its rounding: a ratio of 1.0049 is flat,
1.0050 is not), evaluates in at most 1.1x full attention's time at 16k and keeps at most half of full attention's
key/value cache at 64k. Where no row meets every goal, the closest is the row with the most goals
met (then the fewest missed, then the fewest unmeasured, then the smallest sum of its shortfalls, each relative to its
goal's bar: :func:`shortfall`), and its shortfalls say by how much.

A row's figures (:class:`Figures`) come from a reproduction's work directory (:func:`design_figures`: the run's length
report, its passkey reports after fine-tuning, a LongPPL report, the benchmarks' JSON) or, for the reference methods
(an evaluation-time method on a checkpoint trained without a design), from a JSON list naming the reports and run
folders each row reads (:func:`reference_figures`, each row with its source).
"""

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ...evaluation.figures import mode_rows, passkey_rates, ruler_mean
from ...rounding import written
from ..definitions import (CHEAP_TO_EVALUATE, FAR_CONTEXT, FAR_CONTEXT_BASELINE, FLAT, RETRIEVES, RULER, SMALL_CACHE,
                           Definition)
from .catalogue import (LABELS, LONGPPL_COMMON_REPORT, LONGPPL_REPORT, RECALIBRATED, RULER_REPORT, RUNS, full_attention_only,
                        run_arguments)

__all__ = ["GOALS", "Figures", "Goal", "closest", "design_figures", "far_context_ratio", "figure_meets",
           "markdown_verdict", "passkey_seeds", "plot_verdict", "provenance_cell", "reference_figures",
           "ruler_reports", "shortfall", "shown"]


@dataclass(frozen=True)
class Figures:
    """What the verdict reads of one row; None: not measured.

    Attributes:
        name: the run (``rnope_swa``) or reference (``xpos+rerope``); label: how the table names it.
        updates: the training budget of the checkpoint behind the quality figures.
        ratio: ppl(16l) / ppl(l) on the test stream under the row's window (a design: its full attention); None
            where 16l was not evaluated.
        longppl_ratio: LongPPL(16l) under the row's window over the same model's LongPPL(16l) under a sliding window
            of l, on the key tokens of the common evaluator (``scripts/longppl_evaluator.py``: RoPE trained at 16l),
            the figure "reads the far context" judges (``definitions.FAR_CONTEXT``).
        longppl_self: LongPPL(16l) / LongPPL(l) on the row's own key tokens (its checkpoint under full attention),
            shown beside it and judged by nothing: a checkpoint's own key tokens favour its own full attention.
        passkey_8l: passkey accuracy at 8l after fine-tuning, ranking the key among 10 (chance 0.10).
        greedy_8l, greedy_16l: the fraction of those prompts whose greedy continuation writes the key whole, at 8l / 16l.
        ruler_8l: the RULER-lite mean over its tasks at 8l (ranking), after its fine-tuning.
        eval_time, gen_time: evaluation time per token at 16k, and generation time per token after 16k of context,
            over full attention's of the same model in the same benchmark run.
        cache_64k: key/value cache positions kept at 64k over the base model's under full attention (every layer keeps
            64k), as ``scripts/bench_design_costs.py`` measured them (``experiments.design_costs``).
        source: where the figures were measured (a RESULTS / BENCHMARKS section, or the reports read).
        measured_on: the device, code commit and wall time of the row's length report (its provenance,
            :func:`provenance_cell`), "unknown" where a report predates provenance.
        spread: for a figure measured over several fine-tuning seeds, {field: (lowest, highest, seeds)}; the field
            itself then holds the mean, and a goal on it is met only when every seed meets it.
        reference: a reference method measured elsewhere (:func:`reference_figures`), not a trained design.
        without_value: {field: what the cell says} for a figure measured that has no value, and so misses its goal (a
            LongPPL report whose evaluator found no key token at l or 16l: nothing the long context helps).
        not_measurable: {field: what the cell says} for a goal the row cannot be measured on, counted as not
            measured (a design whose global layers choose their own keys takes no window of l, the denominator of
            "reads the far context").
    """

    name: str
    label: str
    updates: int
    ratio: Optional[float] = None
    longppl_ratio: Optional[float] = None
    longppl_self: Optional[float] = None
    passkey_8l: Optional[float] = None
    greedy_8l: Optional[float] = None
    greedy_16l: Optional[float] = None
    ruler_8l: Optional[float] = None
    eval_time: Optional[float] = None
    gen_time: Optional[float] = None
    cache_64k: Optional[float] = None
    source: str = ""
    measured_on: str = "unknown"
    spread: Dict[str, Tuple[float, float, int]] = field(default_factory=dict)
    reference: bool = False
    without_value: Dict[str, str] = field(default_factory=dict)
    not_measurable: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Goal:
    """One column of the verdict: the figure it reads (``key``, a :class:`Figures` field) and the definition that judges
    it (``experiments.definitions``), written at ``decimals`` (at least the definition's) followed by ``unit``. A cell
    is judged as written: 1.00496 is written 1.0050 and is not flat, though it rounds to 1.00 from more decimals.

    Raises:
        ValueError: ``decimals`` below the definition's (a cell would hide the digit the goal is decided on).
    """

    key: str
    definition: Definition
    decimals: int
    unit: str = ""

    def __post_init__(self):
        if self.decimals < self.definition.decimals:
            raise ValueError(f"goal {self.key}: written at {self.decimals} decimals, but '{self.definition.name}' is "
                             f"read at {self.definition.decimals}; write it at {self.definition.decimals} or more.")

    @property
    def heading(self) -> str:
        return f"{self.definition.name}: {self.definition.rule}"

    @property
    def bar(self) -> float:
        return self.definition.bar

    @property
    def fmt(self) -> str:
        """How a cell writes the figure (``rounding.written``): ``{:.2f}x``."""
        return f"{{:.{self.decimals}f}}{self.unit}"

    def test(self, value: float) -> bool:
        """Whether ``value``, as the cell writes it, meets the definition."""
        return self.definition.meets(value, written_at=self.decimals)


GOALS = (
    Goal("ratio", FLAT, 4),
    Goal("longppl_ratio", FAR_CONTEXT, 2),
    Goal("greedy_16l", RETRIEVES, 2),
    Goal("ruler_8l", RULER, 2),
    Goal("eval_time", CHEAP_TO_EVALUATE, 2, "x"),
    Goal("cache_64k", SMALL_CACHE, 3, "x"),
)
CONTEXT = 16384  # the tokens the cost columns are measured at (the verdict's 16k)
# shown beside the goals, judged by nothing
CONTEXT_COLUMNS = (("longppl_self", "LongPPL 16l / l, own key tokens", "{:.2f}"),
                   ("passkey_8l", "passkey 8l (ranked)", "{:.2f}"), ("greedy_8l", "greedy 8l", "{:.2f}"),
                   ("gen_time", "gen time 16k", "{:.2f}x"))


def figure_meets(f: Figures, key: str, test: Callable[[float], bool]) -> Optional[bool]:
    """Whether ``f``'s figure ``key`` passes ``test`` (None: not measured; False: measured without a value,
    ``f.without_value``); over several seeds, whether every seed does (the lowest and the highest both pass the
    one-sided test). The verdict and the decision table read a goal so."""
    value = getattr(f, key)
    if value is None:
        return False if key in f.without_value else None
    if key in f.spread:
        low, high, _ = f.spread[key]
        return bool(test(low)) and bool(test(high))
    return bool(test(value))


def _met(f: Figures, goal: Goal) -> Optional[bool]:
    return figure_meets(f, goal.key, goal.test)


def shown(f: Figures, key: str, fmt: str) -> str:
    """A figure as a cell, written by ``fmt`` (``rounding.written``): its value, and over several seeds its mean with the
    range and the number of seeds; what ``f.without_value`` says for a figure measured without a value,
    ``f.not_measurable`` for one that cannot be; "-" not measured."""
    value = getattr(f, key)
    if value is None:
        return f.without_value.get(key) or f.not_measurable.get(key, "-")
    if key in f.spread:
        low, high, n = f.spread[key]
        return f"{written(value, fmt)} ({written(low, fmt)}-{written(high, fmt)}, {n} seeds)"
    return written(value, fmt)


def shortfall(f: Figures, goal: Goal) -> float:
    """How far ``f`` misses ``goal``, relative to the goal's bar: 0.0 for a goal met or not measured; for a figure
    measured without a value (``f.without_value``), 1.0; otherwise |value - bar| / |bar| of the figure farthest on
    the wrong side among the value and, over several seeds, the lowest and highest seed (a greedy passkey of 0.87
    with seeds 0.82-0.92 against 0.90 misses by 0.089; a cache of 1.0x against 0.5x by 1.0).

    Raises:
        ValueError: for a goal whose bar is 0 (no relative distance); none of :data:`GOALS` has one.
    """
    if _met(f, goal) is not False:
        return 0.0
    value = getattr(f, goal.key)
    if value is None:
        return 1.0
    if goal.bar == 0:
        raise ValueError(f"goal {goal.key} has bar 0: a shortfall relative to it is undefined; give it a non-zero bar")
    low, high, _ = f.spread.get(goal.key, (value, value, 1))
    return max(abs(v - goal.bar) / abs(goal.bar) for v in (value, low, high) if not goal.test(v))


def _rank(f: Figures) -> Tuple[int, int, int, float]:
    """(goals met, - goals missed, - goals not measured, - summed shortfall): what :func:`closest` maximises."""
    return (sum(_met(f, g) is True for g in GOALS), -sum(_met(f, g) is False for g in GOALS),
            -sum(_met(f, g) is None for g in GOALS), -round(sum(shortfall(f, g) for g in GOALS), 6))


def closest(rows: Sequence[Figures]) -> Optional[Figures]:
    """The row with the most goals met, then the fewest missed, then the fewest not measured, then the smallest
    summed :func:`shortfall` (the first such row; :func:`markdown_verdict` names the rows it was chosen over on the
    shortfall and those still tied with it); None for no rows."""
    if not rows:
        return None
    return max(rows, key=_rank)


def _shortfalls(f: Figures) -> List[str]:
    return [f"{g.key}: {shown(f, g.key, g.fmt)}" if getattr(f, g.key) is None else
            f"{g.key} {shown(f, g.key, g.fmt)} against {written(g.bar, g.fmt)}" for g in GOALS if _met(f, g) is False]


def _closest_line(kind: str, best: Figures, group: Sequence[Figures]) -> str:
    """The verdict's sentence on ``best``, the closest of ``group``: its goals met, its shortfalls, what is not
    measured, the rows it was chosen over on the summed shortfall and those tied with it."""
    tied = [f.label for f in group if f is not best and _rank(f) == _rank(best)]
    behind = sorted((f for f in group if _rank(f)[:3] == _rank(best)[:3] and _rank(f) != _rank(best)),
                    key=_rank, reverse=True)
    total = -_rank(best)[3]
    met = sum(_met(best, g) is True for g in GOALS)
    return (f"Closest {kind}: {best.label}, {met} goal{'' if met == 1 else 's'} met; short on "
            + ("; ".join(_shortfalls(best)) or "none") + "; not measured: "
            + (", ".join(g.key for g in GOALS if _met(best, g) is None) or "none")
            + (f"; shortfalls summing to {total:.2f} of their bars, against "
               + ", ".join(f"{f.label} {-_rank(f)[3]:.2f}" for f in behind)
               + " (as many goals met, missed and not measured)" if behind else "")
            + (f"; tied with {', '.join(tied)} (as many goals met, missed and not measured, "
               "the same summed shortfall)" if tied else "")
            + ".")


def markdown_verdict(rows: Sequence[Figures]) -> str:
    """The verdict table (one row per design or reference, the goals then the context columns; **bold** a met goal,
    ``-`` not measured) and the closing line: the rows that meet every goal, or the closest and its shortfalls."""
    head = ["| design | updates | " + " | ".join(g.heading for g in GOALS) + " | goals met | "
            + " | ".join(c[1] for c in CONTEXT_COLUMNS) + " | measured on (commit, wall time) |",
            "|---|---:|" + "---:|" * len(GOALS) + "---:|" + "---:|" * len(CONTEXT_COLUMNS) + "---|"]
    body = []
    for f in rows:
        cells = []
        for g in GOALS:
            cells.append(f"**{shown(f, g.key, g.fmt)}**" if _met(f, g) else shown(f, g.key, g.fmt))
        met = sum(_met(f, g) is True for g in GOALS)
        measured = sum(_met(f, g) is not None for g in GOALS)
        context = [shown(f, key, fmt) for key, _, fmt in CONTEXT_COLUMNS]
        body.append(f"| {f.label} | {f.updates:,} | " + " | ".join(cells) + f" | {met} of {measured} measured | "
                    + " | ".join(context) + f" | {f.measured_on} |")
    winners = [f.label for f in rows if all(_met(f, g) is True for g in GOALS)]
    lines = ["**Every goal met:** " + "; ".join(winners) if winners else "**No row meets every goal.**"]
    best = None if winners else closest(rows)
    if best is not None and best.reference:
        lines.append(_closest_line("row", best, rows))
        designs = [f for f in rows if not f.reference]
        if designs:
            lines.append(_closest_line("trained design", closest(designs), designs))
    elif best is not None:  # also the closest trained design (max keeps the first of equals): named once
        lines.append(_closest_line("row, a trained design", best, rows))
    line = " ".join(lines)
    return "\n".join(head + body + ["", line])


def plot_verdict(rows: Sequence[Figures], out: Path, title: str) -> None:
    """Write the PNG ``out``: a grid, one row per design, one column per goal, each cell green (met), red (missed) or
    grey (not measured) with its value written inside; the rows' labels on the left, the goals' headings on top,
    wrapped. A grid needs no label placement: every text has a cell of its own."""
    import textwrap

    from matplotlib.colors import ListedColormap

    from ...plotting import figure

    state = [[{None: 0, False: 1, True: 2}[_met(f, g)] for g in GOALS] for f in rows]
    height = 1.9 + 0.42 * len(rows)
    with figure(out, 1, 1, (15, height), dpi=110) as (fig, ax):
        ax.imshow(state, cmap=ListedColormap(["#d9d9d9", "#f4a6a6", "#9fd89f"]), vmin=0, vmax=2, aspect="auto")
        for i, f in enumerate(rows):
            for j, g in enumerate(GOALS):
                value = getattr(f, g.key)
                said = g.key in f.without_value or g.key in f.not_measurable
                text = "not measured" if value is None and not said else shown(f, g.key, g.fmt)
                ax.text(j, i, text.replace(" (", "\n("), ha="center", va="center",
                        fontsize=8)
        ax.set_xticks(range(len(GOALS)), ["\n".join(textwrap.wrap(g.heading, 22)) for g in GOALS], fontsize=8)
        ax.xaxis.tick_top()
        ax.set_yticks(range(len(rows)), [f"{f.label} ({f.updates:,} upd.)" for f in rows], fontsize=8)
        ax.set_xticks([x + 0.5 for x in range(len(GOALS) - 1)], minor=True)
        ax.set_yticks([y + 0.5 for y in range(len(rows) - 1)], minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.tick_params(which="minor", length=0)
        ax.set_title(title, fontsize=10, pad=12)
        ax.set_xlabel("green: goal met; red: missed; grey: not measured", fontsize=8)


# each entry of a reference row: the forms (sets of keys) it may take, :func:`reference_figures`
READ_FORMS: Dict[str, Tuple[frozenset, ...]] = {
    "length": (frozenset({"report", "mode"}),), "longppl_common": (frozenset({"report", "mode"}),),
    "ruler": (frozenset({"report", "mode"}), frozenset({"run", "mode"})), "costs": (frozenset({"report"}),),
    "passkey": (frozenset({"run", "mode"}),)}


def reference_figures(path: Path) -> List[Figures]:
    """The rows of a JSON list of reference methods (each an object with :class:`Figures`' fields, ``source`` naming
    where the figures come from). Figures with a committed report are read from it, not transcribed, each from
    ``{"report": PATH, "mode": MODE}`` or, for the fine-tuned probes, ``{"run": DIR, "mode": MODE}`` (PATH and DIR
    relative to the list's folder; MODE the attention mode whose rows are read: ``full``, ``bca``, ``rerope`` ...), as
    a design's are read (:func:`design_figures`; :data:`READ_FORMS` lists each entry's forms):

    - ``"length"``: an eval-lm report with ``--longppl`` gives ``ratio`` (ppl(16l) / ppl(l)) and ``longppl_self``
      (LongPPL's ratio on the checkpoint's own key tokens);
    - ``"longppl_common"``: an eval-lm report with ``--longppl --key-tokens`` (the common evaluator's key tokens) gives
      ``longppl_ratio``, over its rows under the sliding window of l (``definitions.FAR_CONTEXT_BASELINE``);
    - ``"ruler"``: a ``lex ruler`` report gives ``ruler_8l``, the mean over its tasks at 8l
      (:func:`~lex_plugin.evaluation.figures.ruler_mean`);
      or ``{"run": DIR, "mode": MODE}``, the reproduction's run folder, its ``ruler_answers.json`` and one report more
      for each other fine-tuning seed (``ruler_answers_seedN.json``), the seeds' mean and range (:func:`_ruler_seeds`);
    - ``"costs"``: a ``scripts/bench_design_costs.py`` report (``{"report": PATH}``, no mode) gives ``eval_time``,
      ``gen_time`` and ``cache_64k`` from its row named as the reference (measured at 16k and the length report's l);
    - ``"passkey"``: the passkey reports after fine-tuning (``{"run": DIR, "mode": MODE}``: the reproduction's run
      folder holding the probe's reports to 8l and 16l, ``passkey_finetuned{,_16l}.json``, and one pair more for each
      other fine-tuning seed, ``..._seedN.json``) give ``passkey_8l``, ``greedy_8l`` and ``greedy_16l`` at the length
      report's l, summed over depths and, over several seeds, their mean and range, as a design's are
      (:func:`passkey_seeds`).

    Raises:
        ValueError: a row with a field :class:`Figures` does not have, or without name, label or updates; an entry
            in none of its forms (:data:`READ_FORMS`); a figure (or its seeds' range) both transcribed and read; a
            report without that mode at l and 16l (8l for RULER-lite; for ``longppl_common``, at 16l, beside the
            sliding window of l there: :func:`far_context_ratio`); a run folder whose seeds do not all hold the mode
            (:func:`passkey_seeds`, :func:`_ruler_seeds`); a report measured at another l than the row's length
            report; ``measured_on`` typed beside a length report (it is read from the report's provenance).
        FileNotFoundError: a named report that does not exist, or a run folder without the probe's report.
    """
    known = {f.name for f in fields(Figures)} - {"reference"}
    rows = []
    for raw in json.loads(Path(path).read_text()):
        raw = dict(raw)
        read = {key: raw.pop(key) for key in ("length", "longppl_common", "ruler", "costs", "passkey") if key in raw}
        unknown = sorted(set(raw) - known)
        if unknown or not {"name", "label", "updates"} <= set(raw):
            raise ValueError(f"{path}: a verdict row takes {sorted(known)}, length, longppl_common, ruler, costs and passkey (name, label and updates "
                             f"required); got {sorted(raw)}.")
        for key, given in read.items():
            if not isinstance(given, dict) or frozenset(given) not in READ_FORMS[key]:
                forms = " or ".join("{" + ", ".join(f'"{k}"' for k in sorted(form)) + "}" for form in READ_FORMS[key])
                raise ValueError(f"{path}: {raw['name']}'s {key} is {forms}; got "
                                 f"{sorted(given) if isinstance(given, dict) else given!r}.")
            if "report" in given and not (Path(path).parent / given["report"]).is_file():
                raise FileNotFoundError(f"{path}: {raw['name']} reads its {key} from {Path(path).parent / given['report']}, "
                                        "which does not exist: correct the path (relative to the list) or measure it first.")
        length_report = json.loads((Path(path).parent / read["length"]["report"]).read_text()) if "length" in read else None
        length = None if length_report is None else int(length_report["training_length"])  # the l cost rows must have
        for key, given in read.items():
            raw.update(_read_figures(Path(path), raw, key, given, length))
        if length_report is not None:
            if "measured_on" in raw:
                raise ValueError(f"{path}: {raw['name']} gives measured_on and a length report, whose provenance it "
                                 "is read from; give one.")
            raw["measured_on"] = provenance_cell(length_report)
        rows.append(Figures(**raw, reference=True))
    return rows


def _read_figures(path: Path, raw: dict, key: str, given: dict, length: Optional[int]) -> dict:
    """The figures reference row ``raw`` of the list ``path`` reads from the report or run folder ``given`` names
    (``key``: length, longppl_common, ruler, costs or passkey, in one of its :data:`READ_FORMS`; ``length``: l of the
    row's length report, None without one; :func:`reference_figures`), with ``spread`` where a run folder holds
    several fine-tuning seeds."""
    if (key == "costs" or "run" in given) and length is None:
        raise ValueError(f"{path}: {raw['name']} reads its {key} without a length report, whose l they must have "
                         "been measured at: give \"length\" too.")
    spread = {}
    if key == "ruler" and "run" in given:
        run = path.parent / given["run"]
        if not (run / RULER_REPORT).is_file():
            raise FileNotFoundError(f"{run / RULER_REPORT} does not exist: probe the run with "
                                    "scripts/reproduce.py --methods ruler first.")
        ruler_8l, spread = _ruler_seeds(run, length, given["mode"])
        figures = {"ruler_8l": ruler_8l}
    elif key == "passkey":
        run = path.parent / given["run"]
        if not (run / "passkey_finetuned.json").is_file():
            raise FileNotFoundError(f"{run / 'passkey_finetuned.json'} does not exist: probe the run with "
                                    "scripts/reproduce.py --methods passkey_finetuned first.")
        ranked_8l, greedy_8l, greedy_16l, spread = passkey_seeds(run, length, given["mode"])
        figures = {"passkey_8l": ranked_8l, "greedy_8l": greedy_8l, "greedy_16l": greedy_16l}
    elif key == "costs":
        row = _costs_row([path.parent / given["report"]], raw["name"], length, CONTEXT)
        if row is None:
            raise ValueError(f"{path}: {given['report']} has no row {raw['name']!r}: measure it with "
                             f"scripts/bench_design_costs.py --runs {raw['name']}.")
        figures = {k: row[k] for k in ("eval_time", "gen_time", "cache_64k")}
    else:
        report = json.loads((path.parent / given["report"]).read_text())
        if length is not None and int(report["training_length"]) != length:
            raise ValueError(f"{path}: {raw['name']} reads its {key} from {given['report']}, measured at "
                             f"l = {report['training_length']}, and its length from a report at l = {length}: give "
                             "reports of one model.")
        figures = _report_figures(report, key, given["mode"], str(path.parent / given["report"]))
    source = given.get("report") or given["run"]
    twice = sorted((set(figures) | set(spread)) & (set(raw) | set(raw.get("spread", {}))))
    if twice:
        raise ValueError(f"{path}: {raw['name']} gives {', '.join(twice)} and reads it from {source}; give one.")
    missing = [k for k, value in figures.items() if value is None]
    if missing:
        raise ValueError(f"{path}: {source} lacks the {given.get('mode')} rows {raw['name']} reads for "
                         f"{', '.join(missing)} (of {', '.join(figures)}): measure them there (a length report's "
                         "LongPPL needs fairseq-eval-lm --longppl), or read the figure from a report that has them.")
    return {**figures, "spread": {**raw.get("spread", {}), **spread}} if spread else figures


def _report_figures(report: dict, key: str, mode: str, source: str) -> dict:
    """A length (``--longppl``), common-evaluator LongPPL (``--longppl --key-tokens``) or RULER-lite report's figures
    under attention mode ``mode`` (``key``: length, longppl_common or ruler), None where it lacks them.

    Raises:
        ValueError: a common-evaluator report (``source``) lacks the sliding window of l at 16l
            (:func:`far_context_ratio`).
    """
    l = int(report["training_length"])
    if key == "ruler":
        return {"ruler_8l": ruler_mean(report, 8 * l, mode)}
    if key == "longppl_common":
        return {"longppl_ratio": far_context_ratio(report, l, mode, source)}
    by = mode_rows(report, mode)
    at = {n: by[n][0] for n in (l, 16 * l) if n in by}
    both = len(at) == 2
    longppl = (at[16 * l]["longppl"] / at[l]["longppl"] if both and at[l].get("longppl") and at[16 * l].get("longppl")
               else None)
    return {"ratio": at[16 * l]["ppl"] / at[l]["ppl"] if both else None, "longppl_self": longppl}


def provenance_cell(report: Optional[dict]) -> str:
    """Where and from what a report was measured, in one cell: its device (with the threads torch used, where the
    report records them), its code commit (10 characters, "+" when the tree was dirty) and its wall time; "unknown"
    for each part it does not record."""
    prov = (report or {}).get("provenance") or {}
    commit = str(prov.get("commit", "unknown"))
    commit = commit if commit == "unknown" else commit[:10] + ("+" if prov.get("dirty") is True else "")
    wall = prov.get("wall_s", "unknown")
    wall = f"{wall:.0f} s" if isinstance(wall, (int, float)) else "unknown"
    threads = prov.get("threads")
    threads = "" if threads is None else f", {threads} thread" + ("s" if threads != 1 else "")
    return f"{prov.get('device', 'unknown')}{threads} ({commit}, {wall})"


def _report(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.is_file() else None


def passkey_seeds(run: Path, l: int, mode: str = "full") -> tuple:
    """(ranked at 8l, greedy at 8l, greedy at 16l, spread) of a run's passkey reports after fine-tuning under attention
    ``mode`` (default full attention): the run's seed (``passkey_finetuned.json``, ``passkey_finetuned_16l.json``) and
    each other fine-tuning seed (``passkey_finetuned_seedN.json``, ``..._16l_seedN.json``); over several seeds each
    figure is the mean and ``spread`` holds its (lowest, highest, seeds).

    Raises:
        ValueError: one seed gives a figure that another seed's reports lack (a report missing, or without ``mode``
            at that length): the mean would silently leave that seed out; a seed's report not named ``..._seedN``
            (:func:`_seeds`).
    """
    per_seed = []
    for n in [None, *_seeds(run, ("passkey_finetuned", "passkey_finetuned_16l"))]:
        sfx = "" if n is None else f"_seed{n}"
        reports = [_report(run / f"passkey_finetuned{sfx}.json"), _report(run / f"passkey_finetuned_16l{sfx}.json")]
        if reports == [None, None]:
            continue
        ranked_8l, greedy_8l = passkey_rates(reports, 8 * l, mode)
        per_seed.append({"passkey_8l": ranked_8l, "greedy_8l": greedy_8l,
                         "greedy_16l": passkey_rates(reports, 16 * l, mode)[1],
                         "seed": "the run's seed" if n is None else f"seed {n}"})
    means, spread = {}, {}
    for key in ("passkey_8l", "greedy_8l", "greedy_16l"):
        means[key], range_ = _over_seeds(run, {seed["seed"]: seed[key] for seed in per_seed}, f"{key} under {mode}")
        if range_:
            spread[key] = range_
    return means["passkey_8l"], means["greedy_8l"], means["greedy_16l"], spread


def _over_seeds(run: Path, by_seed: Dict[str, Optional[float]], what: str) -> Tuple[Optional[float], Optional[tuple]]:
    """(mean, (lowest, highest, seeds)) of one figure over a run's fine-tuning seeds (``by_seed``: {seed's name: its
    value, None where its reports lack the figure}); the range None under fewer than two seeds, the mean None under
    none.

    Raises:
        ValueError: a seed lacks the figure (``what``, in words) that another seed gives: the mean would silently
            leave it out.
    """
    lacking = [seed for seed, value in by_seed.items() if value is None]
    if lacking and len(lacking) < len(by_seed):
        raise ValueError(f"{run}: {', '.join(lacking)} lack {what}, which the other seeds give: probe that seed again "
                         "under the same windows and lengths (scripts/reproduce.py --finetune-seeds), or remove its "
                         "reports.")
    values = [value for value in by_seed.values() if value is not None]
    if not values:
        return None, None
    return sum(values) / len(values), ((min(values), max(values), len(values)) if len(values) > 1 else None)


def _seeds(run: Path, stems: Sequence[str]) -> List[int]:
    """N of each other fine-tuning seed's report ``STEM_seedN.json`` in ``run`` under any of ``stems``, ascending,
    each once (``reproduce.steps._fine_tuning_seeds`` names them so).

    Raises:
        ValueError: a ``STEM_seed*.json`` whose N is not a whole number (which seed would it be?).
    """
    found = set()
    for stem in stems:
        for path in run.glob(f"{stem}_seed*.json"):
            n = path.stem[len(f"{stem}_seed"):]
            if not n.isdigit():
                raise ValueError(f"{path}: a fine-tuning seed's report is named {stem}_seedN.json with N the seed; "
                                 f"rename it, or move it out of {run}.")
            found.add(int(n))
    return sorted(found)


def ruler_reports(run: Path) -> List[Path]:
    """A run folder's RULER-lite reports after fine-tuning, one a fine-tuning seed: the run's seed
    (``ruler_answers.json``, listed whether or not it exists), then ``ruler_answers_seedN.json`` by N.

    Raises:
        ValueError: a seed's report not named ``ruler_answers_seedN.json`` (:func:`_seeds`).
    """
    stem = Path(RULER_REPORT).stem
    return [run / RULER_REPORT, *(run / f"{stem}_seed{n}.json" for n in _seeds(run, (stem,)))]


def _ruler_seeds(run: Path, l: int, mode: str = "full") -> tuple:
    """(RULER-lite's mean at 8l, spread) of a run's reports after fine-tuning under attention ``mode`` (default full
    attention): the run's seed (``ruler_answers.json``) and each other fine-tuning seed (``ruler_answers_seedN.json``);
    over several seeds the mean of the seeds' means and ``spread`` = {"ruler_8l": (lowest, highest, seeds)}.

    Raises:
        ValueError: a seed's report lacks ``mode`` at 8l where another seed's has it (the mean would leave it out).
    """
    found = {p.name: ruler_mean(_report(p), 8 * l, mode) for p in ruler_reports(run) if p.is_file()}
    mean, range_ = _over_seeds(run, found, f"RULER-lite under {mode} at 8l")
    return mean, ({"ruler_8l": range_} if range_ else {})


def _costs_row(costs: Sequence[Path], name: str, training_length: int, context: int) -> Optional[dict]:
    """Run ``name``'s row of the cost reports ``costs`` (``scripts/bench_design_costs.py --json-out``: the design and
    its base measured in one process); None without a row for ``name``.

    Raises:
        ValueError: the row was measured at another context or training length than the verdict reads; ``name`` in
            two reports (which one holds?).
    """
    found = [(path, r) for path in costs for r in _report(path).get("rows", []) if r["run"] == name]
    if len(found) > 1:
        raise ValueError(f"run {name} has a cost row in {found[0][0]} and in {found[1][0]}: give one report per run.")
    if not found:
        return None
    path, row = found[0]
    if (row["context"], row["training_length"]) != (context, training_length):
        raise ValueError(f"{path}: run {name} was measured at context {row['context']} and l = {row['training_length']}; "
                         f"the verdict reads context {context} and l = {training_length}: measure it again with "
                         f"scripts/bench_design_costs.py --context {context} --training-length {training_length}.")
    return row


def far_context_ratio(report: dict, l: int, mode: str, source: str) -> Optional[float]:
    """LongPPL(16l) under ``mode`` over LongPPL(16l) under the sliding window of l (:data:`FAR_CONTEXT_BASELINE`) in
    the eval-lm report ``report`` (``--longppl``, read from ``source``): the figure of ``definitions.FAR_CONTEXT``;
    None where the report has no LongPPL under ``mode`` at 16l.

    Raises:
        ValueError: the report has LongPPL under ``mode`` at 16l but none under the window of l there.
    """
    row = mode_rows(report, mode).get(16 * l, [{}])[0]
    if not row.get("longppl"):
        return None
    base = mode_rows(report, FAR_CONTEXT_BASELINE).get(16 * l, [{}])[0]
    if not base.get("longppl"):
        raise ValueError(f"{source} has no LongPPL at {16 * l} under a sliding window of l, which '{FAR_CONTEXT.name}' "
                         f"divides by: run scripts/reproduce.py --methods longppl_common again (it measures that window "
                         f"beside the row's).")
    return row["longppl"] / base["longppl"]


def _longppl_ratio(path: Path, l: int, *, far_context: bool = False) -> Tuple[Optional[float], Optional[str]]:
    """(the ratio, what the cell says without a value) of the eval-lm report ``path`` (``--longppl``) under full
    attention: LongPPL(16l) / LongPPL(l), or with ``far_context`` LongPPL(16l) over the sliding window of l's there
    (:func:`far_context_ratio`); (None, None) without the report; (None, "no key token") where its evaluator found none.

    Raises:
        ValueError: with ``far_context``, the report lacks the window of l (:func:`far_context_ratio`).
    """
    if not path.is_file():
        return None, None
    report = json.loads(path.read_text())
    scored = {L: rows[0] for L, rows in mode_rows(report).items()}
    lp = {L: row.get("longppl") for L, row in scored.items()}
    read = (16 * l,) if far_context else (l, 16 * l)  # the lengths the ratio reads under full attention
    if far_context:
        ratio = far_context_ratio(report, l, "full", str(path))
    else:
        ratio = lp[16 * l] / lp[l] if lp.get(l) and lp.get(16 * l) else None
    if ratio is not None:
        return ratio, None
    return None, ("no key token" if any(scored.get(L, {}).get("key_tokens") == 0 for L in read) else None)


def design_figures(work: Path, name: str, training_length: int, updates: int, *, longppl: Optional[Path] = None,
                   costs: Sequence[Path] = (), context: int = CONTEXT,
                   recalibrated: bool = False) -> Figures:
    """The figures of run ``name`` of the reproduction in ``work``: its length report's full-attention ratio, LongPPL
    at 16l on the common evaluator's key tokens over the sliding window of l's, from ``longppl`` (an eval-lm report
    with ``--longppl --key-tokens``; None: the run's ``longppl_common.json``, the reproduction's ``longppl_common``
    probe), LongPPL(16l) / LongPPL(l) on its own key tokens (the run's ``longppl.json``, the ``longppl`` probe), the passkey after fine-tuning (``passkey_finetuned.json``
    and ``passkey_finetuned_16l.json`` in the run's directory, full attention: the reproduction's ``passkey_finetuned``
    probe writes both for a trained design), RULER-lite
    at 8l (``ruler_answers.json``, the mean over tasks; over several fine-tuning seeds, with ``ruler_answers_seedN.json``,
    the seeds' mean and range), and the cost figures of ``costs`` (``scripts/bench_design_costs.py``
    reports: evaluation and generation time at ``context``, the cache at 64k, each over the base model's measured in the
    same process; no row for the run: not measured).
    With ``recalibrated``, a DroPE run's figures under its recalibration (the same files in
    WORK/runs/NAME/recalibrated/, ``reproduce.steps._recalibrate``; labelled with its C): the time ratios stay the run's,
    since the temperature is one multiplication of the queries.

    Raises:
        KeyError: ``name`` is not a run of the reproduction. FileNotFoundError: the run (or its recalibration) has no
            length report; ``longppl`` is given and does not exist. ValueError: its cost row was measured at another context or l (:func:`_costs_row`); its
            common-evaluator report lacks the sliding window of l (:func:`far_context_ratio`).
    """
    if name not in RUNS:
        raise KeyError(f"{name} is not a run of the reproduction (catalogue.RUNS).")
    run = work / "runs" / name / (RECALIBRATED if recalibrated else "")
    if not (run / "length_report.json").exists():
        what = "been recalibrated (a DroPE run's last step)" if recalibrated else "been evaluated"
        raise FileNotFoundError(f"{run / 'length_report.json'} does not exist: run {name} has not {what}. Run "
                                f"scripts/reproduce.py --work {work} --runs {name} first, or leave it out of --runs.")
    if longppl is not None and not longppl.is_file():
        raise FileNotFoundError(f"{longppl} does not exist: measure run {name} with fairseq-eval-lm --longppl "
                                "--key-tokens (the common evaluator's) under --eval-windows full,sliding, or give no "
                                f"report to read the run's {LONGPPL_COMMON_REPORT}.")
    report = json.loads((run / "length_report.json").read_text())
    l = training_length
    ppl = {L: rows[0]["ppl"] for L, rows in mode_rows(report).items()}
    ratio = ppl[16 * l] / ppl[l] if l in ppl and 16 * l in ppl else None
    # a run whose global layers choose their own keys takes no window of l: its far-context goal cannot be measured
    no_window = full_attention_only(run_arguments(name, l))
    longppl_ratio, common_note = ((None, None) if no_window else
                                  _longppl_ratio(run / LONGPPL_COMMON_REPORT if longppl is None else longppl, l, far_context=True))
    longppl_self, self_note = _longppl_ratio(run / LONGPPL_REPORT, l)
    without_value = {key: note for key, note in (("longppl_ratio", common_note), ("longppl_self", self_note)) if note}
    ranked_8l, greedy_8l, greedy_16l, spread = passkey_seeds(run, l)
    ruler_8l, ruler_spread = _ruler_seeds(run, l)
    spread = {**spread, **ruler_spread}
    cost = _costs_row(costs, name, l, context) or {}
    label = LABELS.get(name, name)
    if recalibrated:
        label += f", recalibrated (C = {json.loads((run / 'choice.json').read_text())['C']:g})"
    return Figures(name=f"{name}/{RECALIBRATED}" if recalibrated else name, label=label, updates=updates, ratio=ratio,
                   longppl_ratio=longppl_ratio, longppl_self=longppl_self, passkey_8l=ranked_8l, greedy_8l=greedy_8l, greedy_16l=greedy_16l,
                   ruler_8l=ruler_8l,
                   eval_time=cost.get("eval_time"), gen_time=cost.get("gen_time"), cache_64k=cost.get("cache_64k"),
                   source=str(run), measured_on=provenance_cell(report), spread=spread, without_value=without_value,
                   not_measurable={"longppl_ratio": "no window of l"} if no_window else {})

