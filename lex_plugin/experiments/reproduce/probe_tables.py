"""The reproduction's far-context tables: which method is flat and retrieves (with Wilson intervals), RULER-lite,
LongPPL, BABILong-lite and the far-context verdict, each from the probes' reports."""

from typing import Dict, List, Optional, Sequence

from ...evaluation.figures import attention_mode, babilong_greedy
from ...rounding import half_up, written
from ..definitions import (BABILONG_KEPT, BABILONG_RETRIEVES, FAR_CONTEXT, FAR_CONTEXT_BASELINE, FLAT,
                           RETRIEVES_RANKED)
from .catalogue import LABELS, METHODS, WINDOW_LABEL
from .tables import _fixed, _num

__all__ = ["answers_far", "far_context", "flat_and_retrieving",
           "flat_and_retrieving_row", "markdown_babilong", "markdown_far_context", "markdown_flat_and_retrieving",
           "markdown_longppl", "markdown_ruler", "wilson_interval"]


# the decimals these tables write a perplexity ratio and a score at; each is judged as written
# (``Definition.meets(value, written_at=...)``), so no cell reads otherwise than its verdict
RATIO_AT, SCORE_AT = 3, 2


def _probed_as(method: str) -> Optional[str]:
    """The passkey mode (:func:`attention_mode`) that probes the window or method ``method``: a window itself;
    a method its window or RoPE scaling, ``_logn`` added with log-n; None for a method the probe does not run
    (sinks)."""
    if method not in METHODS:
        return method
    window, flags = METHODS[method][0], [str(f) for f in METHODS[method][1]]
    logn = "_logn" if "--logn" in flags else ""
    if "--rope-scaling" in flags:
        return flags[flags.index("--rope-scaling") + 1] + logn
    return window + logn if set(flags) <= {"--logn"} else None


def wilson_interval(hits: int, trials: int, z: float = 1.959964) -> tuple:
    """The Wilson score interval (Wilson 1927) of a binomial proportion hits / trials at the normal quantile z
    (default: 95%): (low, high) in [0, 1], exact at the ends (0 / n has low 0, n / n high 1).

    Raises:
        ValueError: trials < 1 or hits outside 0 .. trials.
    """
    if trials < 1 or not 0 <= hits <= trials:
        raise ValueError(f"a proportion needs 0 <= hits <= trials and trials >= 1, got {hits} / {trials}.")
    p, z2 = hits / trials, z * z
    center = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z / (1 + z2 / trials) * (p * (1 - p) / trials + z2 / (4 * trials * trials)) ** 0.5
    return (0.0 if hits == 0 else center - half, 1.0 if hits == trials else center + half)


def flat_and_retrieving(ppl, passkey: Dict[str, dict], runs: Sequence[str], l: int, lengths: Sequence[int]) -> List[dict]:
    """One row per (run, window or method) with ppl at l and the longest length: {run, method, ratio (ppl(L_max)
    / ppl(l)), passkey (accuracy at 8l after fine-tuning, or None where not probed), flat, retrieves, retrieved
    and trials (the counts behind passkey), interval (its 95% Wilson interval)}.

    Args:
        ppl: :func:`ppl_table`'s shape, methods filed under their names; passkey: {run: ``lex passkey`` report}.
    """
    top, out = max(lengths), []
    for name in runs:
        accuracy: Dict[str, List[int]] = {}
        for r in (passkey.get(name) or {}).get("results", []):
            if r["length"] == 8 * l:
                hit = accuracy.setdefault(attention_mode(r), [0, 0])
                hit[0] += r["retrieved"]
                hit[1] += r["trials"]
        for method, series in ppl.get(name, {}).items():
            if l not in series or top not in series:
                continue
            probed = _probed_as(method)
            acc = accuracy.get(probed) if probed else None
            out.append(flat_and_retrieving_row(name, method, series[top] / series[l], *(acc or (None, None))))
    return out


def flat_and_retrieving_row(run: str, method: str, ratio: float, retrieved: Optional[int] = None,
                            trials: Optional[int] = None) -> dict:
    """One row of :func:`flat_and_retrieving`: {run, method, ratio, passkey (retrieved / trials, or None where not
    probed), flat (``definitions.FLAT``), retrieves (ranked passkey at 8l, ``definitions.RETRIEVES_RANKED``, or None),
    retrieved,
    trials, interval (95% Wilson, or None)}.

    Raises:
        ValueError: only one of ``retrieved`` and ``trials``, or trials < 1.
    """
    if (retrieved is None) != (trials is None) or (trials is not None and trials < 1):
        raise ValueError(f"{run}, {method}: give retrieved and trials (>= 1) together, or neither (not probed); got "
                         f"{retrieved} of {trials}.")
    score = None if trials is None else retrieved / trials
    return {"run": run, "method": method, "ratio": ratio, "passkey": score,
            "flat": FLAT.meets(ratio, written_at=RATIO_AT),
            "retrieves": None if score is None else RETRIEVES_RANKED.meets(score, written_at=SCORE_AT),
            "retrieved": retrieved, "trials": trials, "interval": None if trials is None else wilson_interval(retrieved, trials)}


def markdown_flat_and_retrieving(rows: List[dict], l: int, top: int) -> str:
    """The "Flat and retrieving" table: each window or method's ppl ratio and passkey accuracy at 8l, its
    verdicts, and a last line naming those that are both (or saying that none is)."""
    head = [f"| model | window / method | ppl({top // l}l) / ppl(l) | passkey at 8l (hits/trials; 95% Wilson) | flat (<= "
            f"{FLAT.bar:.{FLAT.decimals}f}) | retrieves (>= {RETRIEVES_RANKED.bar:.{RETRIEVES_RANKED.decimals}f}) |", "|---|---|---:|---:|---|---|"]

    def cell(value, text):
        return "-" if value is None else text

    def accuracy(r) -> str:
        low, high = r["interval"]
        return (f"{_fixed(r['passkey'], SCORE_AT)} ({r['retrieved']}/{r['trials']}; "
                f"{_fixed(low, SCORE_AT)}-{_fixed(high, SCORE_AT)})")

    # the ratio at RATIO_AT decimals; flat reads it as written, at FLAT's 2 decimals, rounded half up
    body = [f"| {LABELS.get(r['run'], r['run'])} | {WINDOW_LABEL.get(r['method'], r['method'])} | "
            f"{_fixed(r['ratio'], RATIO_AT)} | "
            f"{cell(r['passkey'], accuracy(r) if r['passkey'] is not None else '')} | "
            f"{cell(r['flat'], 'yes' if r['flat'] else 'no')} | "
            f"{cell(r['retrieves'], 'yes' if r['retrieves'] else 'no')} |" for r in rows]
    both = [f"{LABELS.get(r['run'], r['run'])} + {WINDOW_LABEL.get(r['method'], r['method'])}" for r in rows
            if r["flat"] and r["retrieves"]]
    probed = any(r["passkey"] is not None for r in rows)
    verdict = ("**Flat and retrieving:** " + ("; ".join(both) if both else "none")) if probed else \
        "**Flat and retrieving:** not decided: no passkey results after fine-tuning in this work directory."
    return "\n".join(head + body + ["", verdict])


def markdown_ruler(ruler: Dict[str, dict], runs: Sequence[str], l: int) -> str:
    """The RULER-lite summary of each run's ``lex ruler`` report: rows run x task x window, columns each length
    (mean over depths), as ``lex ruler`` prints it."""
    from ...evaluation.ruler import RulerResult, format_ruler

    parts = []
    for name in runs:
        if name in ruler:
            results = [RulerResult.from_dict(r) for r in ruler[name]["results"]]
            parts.append(f"{LABELS.get(name, name)}:\n\n" + format_ruler(results, l))
    return "\n\n".join(parts)


def _rows_by_mode(report: dict) -> Dict[str, Dict[int, dict]]:
    """{mode: {length: row}} of a report's rows (a length report, or a probe's), the mode as :func:`attention_mode`."""
    out: Dict[str, Dict[int, dict]] = {}
    for r in report["results"]:
        out.setdefault(attention_mode(r), {})[int(r["length"])] = r
    return out


def markdown_longppl(longppl: Dict[str, dict], runs: Sequence[str], l: int) -> str:
    """Rows run x window of the LongPPL reports ({run: eval-lm report with ``--longppl``}): ppl at each length and
    its ratio to l, then LongPPL at each length and its ratio; the key-token count of each run under its name."""
    parts = []
    for name in runs:
        if name not in longppl:
            continue
        rows = _rows_by_mode(longppl[name])
        lengths = sorted({L for by in rows.values() for L in by})
        top = lengths[-1]
        info = longppl[name].get("longppl", {})
        head = (f"{LABELS.get(name, name)}: {info.get('key_tokens', '?'):,} key tokens" if isinstance(info.get("key_tokens"), int)
                else f"{LABELS.get(name, name)}:")
        lines = [head, "", "| window / method | " + " | ".join(f"ppl {L // l}l" for L in lengths)
                 + f" | ppl {top // l}l / l | " + " | ".join(f"LongPPL {L // l}l" for L in lengths) + f" | LongPPL {top // l}l / l |",
                 "|---|" + "---:|" * (2 * len(lengths) + 2)]
        for mode, by in rows.items():
            ppl = [by[L]["ppl"] if L in by else None for L in lengths]
            lp = [by[L].get("longppl") if L in by else None for L in lengths]
            ratio = ppl[-1] / ppl[0] if ppl[0] and ppl[-1] else None
            lratio = lp[-1] / lp[0] if lp[0] and lp[-1] else None
            lines.append(f"| {WINDOW_LABEL.get(mode, mode)} | " + " | ".join(_num(v) for v in ppl)
                         + f" | {_fixed(ratio, RATIO_AT)} | " + " | ".join(_num(v) for v in lp)
                         + f" | {_fixed(lratio, SCORE_AT)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def markdown_babilong(babilong: Dict[str, dict], runs: Sequence[str], l: int) -> str:
    """Rows run x window of the ``lex babilong`` reports ({run: report}): greedy exact match at each length, the
    mean over the tasks that fitted it."""
    greedy = {n: babilong_greedy(babilong[n]) for n in runs if n in babilong}
    lengths = sorted({L for g in greedy.values() for by in g.values() for L in by})
    lines = ["| model | window / method | " + " | ".join(f"{L} ({L // l}l)" for L in lengths) + " |",
             "|---|---|" + "---:|" * len(lengths)]
    for name, g in greedy.items():
        for mode, by in g.items():
            lines.append(f"| {LABELS.get(name, name)} | {WINDOW_LABEL.get(mode, mode)} | "
                         + " | ".join(_fixed(by.get(L), SCORE_AT) for L in lengths) + " |")
    return "\n".join(lines)


def answers_far(greedy_l: float, greedy_8l: float) -> bool:
    """The far-context table's third test on BABILong-lite's greedy accuracies at l and 8l (fractions in [0, 1]), read
    as the table writes them (:data:`SCORE_AT` decimals): ``definitions.BABILONG_RETRIEVES`` on the accuracy at 8l and
    ``definitions.BABILONG_KEPT`` on its ratio to the one at l, read exactly (0.60 against 0.67 is 0.896: not kept;
    met where the one at l is written 0.00).

    Raises:
        ValueError: an accuracy is not finite.
    """
    at_l, at_8l = half_up(greedy_l, SCORE_AT), half_up(greedy_8l, SCORE_AT)
    return BABILONG_RETRIEVES.meets(at_8l) and (at_l == 0 or BABILONG_KEPT.meets(at_8l / at_l))


def far_context(longppl: Dict[str, dict], babilong: Dict[str, dict], l: int) -> List[dict]:
    """The far-context verdict of each run and window that has a LongPPL report: flat (ppl at the longest length over
    ppl at l, ``definitions.FLAT``), reads the far context (``definitions.FAR_CONTEXT``'s figure and bar: LongPPL at the
    longest length over the same model's there under the sliding window of l, on the report's key tokens, the
    checkpoint's own for the reproduction's ``longppl`` probe; None where the report has no such window), and, where the run
    has a BABILong-lite report, answers far (:func:`answers_far` on the greedy accuracies at l and 8l; None where
    either length is missing).

    Returns:
        One dict per row: run, method (the mode), top (the longest length), ratio, longppl_ratio, greedy_l,
        greedy_8l (None without BABILong), flat, far, answers_far (None when undecided).
    """
    out = []
    for name, report in longppl.items():
        greedy = babilong_greedy(babilong[name]) if name in babilong else {}
        modes = _rows_by_mode(report)
        for mode, by in modes.items():
            lengths = sorted(by)
            if l not in by or len(lengths) < 2:
                continue
            top = lengths[-1]
            ratio = by[top]["ppl"] / by[l]["ppl"]
            lp_top, lp_window = by[top].get("longppl"), modes.get(FAR_CONTEXT_BASELINE, {}).get(top, {}).get("longppl")
            lratio = lp_top / lp_window if lp_top and lp_window else None
            g = greedy.get(mode, {})
            g1, g8 = g.get(l), g.get(8 * l)
            far_answers = None if g1 is None or g8 is None else answers_far(g1, g8)
            out.append({"run": name, "method": mode, "top": top, "ratio": ratio, "longppl_ratio": lratio,
                        "greedy_l": g1, "greedy_8l": g8, "flat": FLAT.meets(ratio, written_at=RATIO_AT),
                        "far": None if lratio is None else FAR_CONTEXT.meets(lratio, written_at=SCORE_AT),
                        "answers_far": far_answers})
    return out


def markdown_far_context(rows: List[dict], l: int) -> str:
    """The far-context verdicts of :func:`far_context` as a table, the rows passing all three tests in bold and
    named below it."""
    def yes(value: Optional[bool], text: str) -> str:
        return text if value is None else f"{'yes' if value else 'no'} ({text})"

    top = max(r["top"] for r in rows)
    lines = [f"| model | window / method | flat: ppl {top // l}l / l <= {FLAT.bar:.{FLAT.decimals}f} | reads the far "
             f"context: LongPPL {top // l}l over the window of l's there, own key tokens < {FAR_CONTEXT.bar:.{FAR_CONTEXT.decimals}f} | answers far: BABILong greedy 8l (l), >= {BABILONG_RETRIEVES.bar:.{BABILONG_RETRIEVES.decimals}f} and 8l / l >= {BABILONG_KEPT.bar:.{BABILONG_KEPT.decimals}f} |",
             "|---|---|---|---|---|"]
    passing = []
    for r in rows:
        label = f"{LABELS.get(r['run'], r['run'])} | {WINDOW_LABEL.get(r['method'], r['method'])}"
        every = r["flat"] and r["far"] and r["answers_far"]
        if every:
            passing.append(label.replace(" | ", " + "))
        g = "-" if r["greedy_8l"] is None else f"{_fixed(r['greedy_8l'], SCORE_AT)} ({_fixed(r['greedy_l'], SCORE_AT)})"
        cells = [yes(r["flat"], _fixed(r["ratio"], RATIO_AT)), yes(r["far"], _fixed(r["longppl_ratio"], SCORE_AT)),
                 yes(r["answers_far"], g)]
        lines.append(f"| {'**' + label.replace(' | ', '** | **') + '**' if every else label} | " + " | ".join(cells) + " |")
    if all(r["answers_far"] is None for r in rows):
        return "\n".join(lines + ["", "**All three:** not decided: no BABILong-lite results at l and 8l in this work directory."])
    return "\n".join(lines + ["", "**All three:** " + ("; ".join(passing) if passing else "none")])
