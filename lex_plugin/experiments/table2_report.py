"""LeX Table 2 as a report: the paper's figures, and the table a call of :func:`~.table2.run_table2` writes from its
result (``table2.md`` beside ``table2.json``), each row under the paper row it corresponds to."""

import json
from pathlib import Path
from typing import Callable, Optional

from .reproduce.catalogue import LABELS

__all__ = ["PAPER_LENGTH", "PAPER_TABLE2", "PAPER_WINDOW", "markdown_table2", "write_table2"]

# LeX Table 2, PG22, every model trained at l = 1,024: perplexity at each evaluation length. "Transformer" is the
# absolute (sinusoidal) model, "Roformer" RoPE, "LEX" xPos with BCA beyond l; the others use full attention.
PAPER_TABLE2 = {
    "sinusoidal": {256: 38.1, 512: 33.5, 1024: 30.54, 2048: 132.46, 4096: 1446.95, 8192: 12747.41},
    "alibi": {256: 34.25, 512: 30.01, 1024: 27.34, 2048: 26.01, 4096: 28.46, 8192: 32.8},
    "rope": {256: 33.27, 512: 29.2, 1024: 26.68, 2048: 68.86, 4096: 235.71, 8192: 458.83},
    "xpos": {256: 33.18, 512: 29.11, 1024: 26.59, 2048: 25.53, 4096: 25.07, 8192: 24.89},
}
PAPER_WINDOW = {"sinusoidal": "full", "alibi": "full", "rope": "full", "xpos": "bca"}  # the window of each paper row
PAPER_LENGTH = 1024


def markdown_table2(result: dict) -> str:
    """The Table 2 shape: one row per (scheme, window) with its perplexity at every length and ppl(8l) / ppl(l), each
    paper row under the row it corresponds to (its scheme under full attention; LeX = xPos under BCA)."""
    l = result["options"]["training_length"]
    lengths = sorted({int(L) for rows in result["ppl"].values() for row in rows.values() for L in row} |
                     set(result["options"]["lengths"]))
    top = max(L for L in lengths if L <= 8 * l)
    head = "| model | window | " + " | ".join(f"{L} ({L / l:g}l)" for L in lengths) + f" | ppl({top // l}l) / ppl(l) |"
    rows = [head, "|---|---|" + "---:|" * (len(lengths) + 1)]

    def cells(row: dict, scale: Optional[Callable[[int], int]] = None) -> str:
        vals = [row.get(L if scale is None else scale(L)) for L in lengths]
        text = " | ".join("-" if v is None else (f"{v:,.0f}" if v >= 1000 else f"{v:.2f}") for v in vals)
        first, last = row.get(l if scale is None else PAPER_LENGTH), row.get(top if scale is None else scale(top))
        return text + f" | {last / first:.3f} |" if first and last else text + " | - |"

    for scheme in result["options"]["schemes"]:
        label = LABELS.get(scheme, scheme)
        got = result["ppl"].get(scheme, {})
        for window in result["options"]["windows"]:
            if window in got:
                rows.append(f"| {label} | {window} | " + cells({int(k): v for k, v in got[window].items()}))
        paper_row = PAPER_TABLE2[scheme]
        rows.append(f"| *paper: {label}* | {PAPER_WINDOW[scheme]} | "
                    + cells(paper_row, scale=lambda L: L * PAPER_LENGTH // l))
    return "\n".join(rows)


def _budget_line(result: dict) -> str:
    o, plan = result["options"], result["plan"]
    reached = ", ".join(f"{LABELS.get(s, s)} {t.get('updates', '-')}" for s, t in result["train"].items())
    return (f"{o['arch']}, l = {o['training_length']}, {o['precision']}, {plan['updates']} updates x "
            f"{o['batch_size']} x {o['training_length']} = {plan['updates'] * plan['tokens_per_update']:,} training "
            f"tokens planned per scheme (throughput: {plan['source']}); updates reached: {reached or 'none yet'}. "
            f"Test: the first {o['eval_tokens']:,} tokens of the test split, cut into each length. Paper rows: PG22, a "
            "24-layer model of width 1,024 trained on a Pile subset at l = 1,024 for 50k updates of 0.5M tokens (LeX, "
            "Table 2 and appendix); their columns are the same multiples of l.")


def write_table2(result: dict, out: Path) -> None:
    """Write ``table2.json`` (the result as it stands) and ``table2.md`` (the budget line, the table, the provenance
    and the events) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table2.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    prov = result["provenance"]
    text = ["# LeX Table 2 shape at l = {}".format(result["options"]["training_length"]), "", _budget_line(result), "",
            markdown_table2(result), "",
            f"Device: {prov['device']}; torch {prov['torch']}, Python {prov['python']}; commit {prov['commit']}"
            f"{' (uncommitted changes)' if prov['dirty'] is True else ''}; wall time {prov['wall_s']} s of a "
            f"{result['options']['deadline_s']:.0f} s deadline; command: `{prov['command']}`.",
            *([""] + [f"- {e}" for e in result["events"]] if result["events"] else [])]
    (out / "table2.md").write_text("\n".join(text) + "\n")
