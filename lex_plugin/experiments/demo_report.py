"""What ``make demo`` measured besides its length table: the wall time of each step, the validation perplexity during
training, the training throughput and fairseq-eval-lm's own perplexity on the whole test split, as one report with
its provenance (``scripts/demo.sh`` writes ``WORK/demo_report.json`` through ``scripts/demo_report.py``). The
walkthrough (``examples/lex_lm/README.md``) reads its "Measured" tables from the committed copy
(``experiments.published``), so none of its figures is typed.
"""

import json
import re
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Union

from ..provenance import UNKNOWN, provenance
from .benchmark import markdown_table
from .train_log import read_train_log, read_valid_log

__all__ = ["demo_report", "demo_steps_table", "demo_valid_table", "read_eval_lm_log"]

_EVALUATED = re.compile(r"Evaluated ([\d,]+) tokens in ([\d.]+)s")
_LOSS = re.compile(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)")


def read_eval_lm_log(text: Union[str, Path]) -> dict:
    """fairseq-eval-lm's own figures in its output (``Evaluated N tokens in S s``, ``Loss (base 2): B, Perplexity:
    P``) and the command that printed it: the first line ``+ fairseq-eval-lm ...`` (as ``scripts/demo.sh`` prints each
    command before it runs), else "unknown".

    Returns:
        {"command", "tokens" (int), "seconds" (fairseq's timer), "loss_bits", "ppl"} (the last figures in the log).

    Raises:
        ValueError: the log has no ``Evaluated`` or no ``Loss (base 2)`` line (a run that failed, or
            ``--length-report-only``, which skips fairseq's pass).
    """
    if isinstance(text, Path):
        text = text.read_text(errors="replace")
    evaluated, loss = _EVALUATED.findall(text), _LOSS.findall(text)
    if not evaluated or not loss:
        raise ValueError("no 'Evaluated ... tokens' and 'Loss (base 2)' lines: give the output of a fairseq-eval-lm run "
                         "that finished its own pass (not --length-report-only).")
    command = next((line[2:].strip() for line in text.splitlines() if line.startswith("+ fairseq-eval-lm")), UNKNOWN)
    (tokens, seconds), (bits, ppl) = evaluated[-1], loss[-1]
    return {"command": command, "tokens": int(tokens.replace(",", "")), "seconds": float(seconds),
            "loss_bits": float(bits), "ppl": float(ppl)}


def demo_report(train_log: Path, steps: Mapping[str, float], eval_logs: Mapping[str, Path],
                argv: Optional[Sequence[str]] = None) -> dict:
    """The demo's report.

    Args:
        train_log: fairseq-train's ``--log-file`` of the demo (``WORK/train.log``).
        steps: the wall time of each step in seconds, in order ({"prepare": 61.0, "train": 905.2, "evaluate": 290.1}).
        eval_logs: {label: the output of a fairseq-eval-lm run}, each read by :func:`read_eval_lm_log` ("test": the
            demo's run at l on the whole test split).
        argv: the command line recorded in the provenance (default ``sys.argv``).

    Returns:
        {"steps": {step: seconds}, "updates", "train_tokens_per_s" (mean of fairseq's ``wps`` over the logged
        intervals), "valid": {update: {"loss", "ppl"}}, "eval_lm": {label: :func:`read_eval_lm_log`}, "provenance"
        (its wall time the steps' sum)}.

    Raises:
        ValueError: a step's time not a number >= 0; a log without its lines (:func:`read_train_log`,
            :func:`read_valid_log`, :func:`read_eval_lm_log`).
    """
    for step, seconds in steps.items():
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"step {step!r}: wall time {seconds!r}; give seconds >= 0.")
    train = read_train_log(Path(train_log))
    valid = read_valid_log(Path(train_log))
    wps = [stats["wps"] for stats in train.values() if "wps" in stats]
    return {"steps": dict(steps), "updates": max(train),
            "train_tokens_per_s": sum(wps) / len(wps) if wps else None,
            "valid": {str(u): {"loss": v.get("loss"), "ppl": v.get("ppl")} for u, v in sorted(valid.items())},
            "eval_lm": {label: read_eval_lm_log(Path(path)) for label, path in eval_logs.items()},
            "provenance": provenance(argv, wall_s=round(sum(steps.values()), 1), cuda=False)}


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(round(seconds % 60))} s" if seconds >= 60 else f"{seconds:.0f} s"


def demo_steps_table(report: dict) -> str:
    """The wall time of each step and of the whole demo, and the training throughput, as a markdown table."""
    steps = report["steps"]
    table = markdown_table(["step", "wall time"], [[step, _minutes(seconds)] for step, seconds in steps.items()]
                           + [["**make demo**", f"**{_minutes(sum(steps.values()))}**"]])
    if not report.get("train_tokens_per_s"):
        return table
    return (f"{table}\n\nTraining: {report['updates']} updates at {report['train_tokens_per_s']:,.0f} tokens/s (fairseq's "
            "wps, mean over the logged intervals).")


def demo_valid_table(report: dict) -> str:
    """Validation perplexity by update, one column per validation, as a markdown table."""
    updates = list(report["valid"])
    return markdown_table(["updates", *updates], [["valid ppl", *(f"{report['valid'][u]['ppl']:.2f}" for u in updates)]])
