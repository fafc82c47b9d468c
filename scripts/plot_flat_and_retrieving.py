#!/usr/bin/env python
"""Draw the "flat and retrieving" chart (one row per window or method: ppl(16l) / ppl(l) and passkey accuracy at 8l
with its 95% Wilson interval) from a JSON of rows, as the reproduction draws it from its own results.

    python scripts/plot_flat_and_retrieving.py examples/lex_lm/flat_and_retrieving.json -o flat_and_retrieving_all.png
    python scripts/plot_flat_and_retrieving.py examples/lex_lm/flat_and_retrieving.json --runs xpos -o flat_xpos.png

The JSON: {"training_length": l, "longest": L_max, "rows": [{"run", "method", "ratio", "retrieved", "trials"}]}
(``run`` a reproduction run such as xpos, ``method`` a window or method name of its tables).
"""

import json
from pathlib import Path

import click

from lex_plugin.experiments.reproduce.plots import plot_flat_and_retrieving
from lex_plugin.experiments.reproduce.tables import FLAT_RATIO, RETRIEVAL, wilson_interval
from lex_plugin.options import parse_name_list


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("rows_json", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--runs", default=None, help="comma-separated runs to draw (default: every run in the file)")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="the PNG to write")
def main(rows_json, runs, out):
    data = json.loads(rows_json.read_text())
    chosen = parse_name_list(runs, "--runs")
    rows = []
    for r in data["rows"]:
        if chosen and r["run"] not in chosen:
            continue
        score = r["retrieved"] / r["trials"]
        rows.append({**r, "passkey": score, "interval": wilson_interval(r["retrieved"], r["trials"]),
                     "flat": r["ratio"] <= FLAT_RATIO, "retrieves": score >= RETRIEVAL})
    if not rows:
        raise click.BadParameter(f"no row of {rows_json} is of the runs {runs}", param_hint="--runs")
    plot_flat_and_retrieving(rows, data["training_length"], data["longest"], out)
    click.echo(f"wrote {out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
