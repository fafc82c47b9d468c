"""The figures a report gives, read one way by every reader: the reproduction's tables, the verdict, the published
documents and the model card of an export.

A report (``fairseq-eval-lm --report-json``, ``lex passkey | ruler | babilong --json``) holds one row per
attention setting and length; :func:`attention_mode` names a row's setting as every table files it (a RoPE scaling
under its method, log-n marked), :func:`mode_rows` groups a report's rows by length under one setting, and the probe
figures are:

- passkey (:func:`passkey_rates`): the fraction of prompts whose key ranks first among the distractors, and the
  fraction whose key greedy decoding writes whole, summed over depths;
- RULER-lite (:func:`ruler_mean`): the mean over its tasks (each the mean over its depths, ranking), as ``lex ruler``
  averages it;
- BABILong-lite (:func:`babilong_greedy`): the greedy accuracy, averaged over the tasks that fitted the length.

:func:`report_kind` says which of these a report is.
"""

from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["LEGACY_MODES", "attention_mode", "babilong_greedy", "mode_rows", "passkey_rates", "report_kind",
           "ruler_mean"]

# the label a report written before the structured ``attention`` field gave a mode, and the mode's name now
LEGACY_MODES = {"lambda": "lm_infinite"}


def attention_mode(row: dict) -> str:
    """The attention setting of a report's row: its structured ``attention`` field (a RoPE scaling filed under its
    method, log-n marked ``_logn``), or for a row written before that field, its ``window`` label's."""
    a = row.get("attention")
    if a:
        mode = a["rope_scaling"] if a.get("rope_scaling") else a["mode"]
        return mode + "_logn" if a.get("logn") else mode
    label = row["window"].split("(")[0]
    return LEGACY_MODES.get(label, label)


def mode_rows(report: Optional[dict], mode: str = "full") -> Dict[int, List[dict]]:
    """{length: rows} of a report's rows under attention ``mode`` (default full attention; :func:`attention_mode`),
    with or without an attention temperature (its beta, ``logit_scale``), but one setting per length; {} without a
    report.

    Raises:
        ValueError: rows of one length under different temperatures (a figure would add them up).
    """
    out: Dict[int, List[dict]] = {}
    for r in (report or {}).get("results", []):
        if attention_mode(r) == mode:
            out.setdefault(int(r["length"]), []).append(r)
    for length, rows in out.items():
        scales = {(r.get("attention") or {}).get("logit_scale") for r in rows}
        if len(scales) > 1:
            raise ValueError(f"the {mode} rows at length {length} hold {len(scales)} attention temperatures "
                             f"(beta {', '.join(str(b) for b in sorted(scales, key=lambda b: b or 0))}): a figure "
                             "reads one setting; write each into its own report.")
    return out


def passkey_rates(reports: Sequence[Optional[dict]], length: int, mode: str = "full") -> Tuple[Optional[float], Optional[float]]:
    """(ranked, greedy) of ``lex passkey`` reports at ``length`` tokens under attention ``mode``: the fraction of
    prompts (summed over depths and reports) whose key ranks first among its distractors, and the fraction whose key
    greedy decoding writes whole; (None, None) where no report probed that length and mode."""
    rows = [r for report in reports for r in mode_rows(report, mode).get(length, [])]
    trials = sum(r["trials"] for r in rows)
    if not trials:
        return None, None
    return sum(r["retrieved"] for r in rows) / trials, sum(r["greedy"] for r in rows) / trials


def ruler_mean(report: Optional[dict], length: int, mode: str = "full") -> Optional[float]:
    """RULER-lite's mean over its tasks (each the mean over its depths, ranking) at ``length`` tokens under attention
    ``mode`` of a ``lex ruler`` report, as ``lex ruler`` and the RESULTS tables average it
    (``ruler.effective_length``: the tasks scored at every length from l); None without a report, that mode or that
    length."""
    if report is None:
        return None
    from .ruler import RulerResult
    from .ruler.probe import effective_length

    # the mode's rows, one setting per length (mode_rows); a probe under an attention temperature labels them
    # "full+beta(...)", so they are read under one label
    rows = [RulerResult.from_dict(dict(r, window=mode)) for by in mode_rows(report, mode).values() for r in by]
    if not rows:
        return None
    return effective_length(rows, mode, "ranking")["averages"].get(length)


def babilong_greedy(report: dict) -> Dict[str, Dict[int, float]]:
    """{mode: {length: greedy accuracy}} of a ``lex babilong`` report: each cell's accuracy averaged over the tasks
    that fitted the length (a cell with no trial is left out)."""
    cells: Dict[str, Dict[int, List[float]]] = {}
    for r in report["results"]:
        if r["trials"]:
            cells.setdefault(attention_mode(r), {}).setdefault(int(r["length"]), []).append(r["greedy"] / r["trials"])
    return {m: {L: sum(v) / len(v) for L, v in by.items()} for m, by in cells.items()}


# each kind by the fields its rows carry (a RULER-lite row holds a task and a score; BABILong-lite's a task and no
# score; a passkey row a depth and a ranked count; a length report's a perplexity)
_KINDS = (("ruler", {"task", "score", "trials"}), ("babilong", {"task", "greedy", "trials"}),
          ("passkey", {"depth", "retrieved", "greedy", "trials"}), ("length", {"window", "length", "ppl"}))


def report_kind(report: dict) -> str:
    """Which report ``report`` is: ``"length"`` (``fairseq-eval-lm --eval-lengths ... --report-json``), ``"passkey"``,
    ``"ruler"`` or ``"babilong"`` (``lex passkey | ruler | babilong --json``), by the fields of its rows.

    Raises:
        ValueError: a report without ``results`` rows, or whose rows are none of these.
    """
    rows = report.get("results") if isinstance(report, dict) else None
    if not rows or not isinstance(rows, list):
        raise ValueError("the report has no 'results' rows: give the JSON of fairseq-eval-lm --report-json or of lex "
                         "passkey, ruler or babilong --json.")
    for kind, keys in _KINDS:
        if all(keys <= set(r) for r in rows):
            return kind
    raise ValueError(f"the report's rows (fields {', '.join(sorted(rows[0]))}) are none of a length report's, passkey's, "
                     "RULER-lite's or BABILong-lite's: give the JSON of fairseq-eval-lm --report-json or of lex "
                     "passkey, ruler or babilong --json.")
