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
from lex_plugin.experiments.reproduce.probe_tables import flat_and_retrieving_row
from lex_plugin.options import parse_name_list


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("rows_json", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--runs", default=None, help="comma-separated runs to draw (default: every run in the file)")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="the PNG to write")
def main(rows_json, runs, out):
    """Draw the chart of ROWS_JSON's rows (those of --runs) into --out (module docstring)."""
    data = json.loads(rows_json.read_text())
    chosen = parse_name_list(runs, "--runs")
    missing = [name for name in chosen if name not in {r["run"] for r in data["rows"]}]
    if missing:
        raise click.BadParameter(f"{rows_json} has no row of {', '.join(missing)}", param_hint="--runs")
    try:
        rows = [flat_and_retrieving_row(r["run"], r["method"], r["ratio"], r.get("retrieved"), r.get("trials"))
                for r in data["rows"] if not chosen or r["run"] in chosen]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="ROWS_JSON") from None
    plot_flat_and_retrieving(rows, data["training_length"], data["longest"], out)
    click.echo(f"wrote {out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
