#!/usr/bin/env python
"""The verdict of the trained designs: one row per reproduction run (and per transcribed reference), one column per
goal of the issue "Trained to extrapolate", as a markdown table and a PNG grid (lex_plugin.experiments.reproduce.verdict).

    python scripts/verdict.py --work work/repro --runs xpos_bca_nope,rnope_swa --updates 300 \\
        --longppl-dir work/repro/longppl --costs costs16k.json \\
        --reference examples/lex_lm/verdict_reference.json -o examples/lex_lm/verdict.png
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lex_plugin.experiments.reproduce.verdict import (  # noqa: E402
    design_figures, markdown_verdict, plot_verdict, reference_figures)
from lex_plugin.experiments.reproduce.catalogue import RECALIBRATED, RUNS  # noqa: E402
from lex_plugin.options import parse_name_list  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="the reproduction's work directory (WORK/runs/NAME)")
    p.add_argument("--runs", required=True, help="comma-separated runs of the reproduction, in the table's order; "
                   "NAME/recalibrated: a DroPE run under its recalibration (WORK/runs/NAME/recalibrated)")
    p.add_argument("--updates", type=int, required=True, help="the runs' training budget (--max-update)")
    p.add_argument("--training-length", type=int, default=256)
    p.add_argument("--longppl-dir", type=Path, help="NAME.json (NAME.recalibrated.json for NAME/recalibrated): each run's eval-lm report with --longppl --key-tokens "
                   "(the common evaluator's key tokens, judged by 'reads the far context'), under full attention and "
                   "the sliding window of l it is divided by (--eval-windows full,sliding); default: each run's "
                   "WORK/runs/NAME/longppl_common.json (the reproduction's longppl_common probe)")
    p.add_argument("--costs", type=Path, action="append", default=[],
                   help="scripts/bench_design_costs.py --json-out: each run's evaluation time, generation time and cache "
                   "against its base model, measured in one process per run; repeat for several reports (a run in one)")
    p.add_argument("--reference", type=Path, action="append", default=[], help="a JSON list of transcribed rows, first")
    p.add_argument("-o", "--plot", type=Path, help="the PNG")
    args = p.parse_args()
    for option, path in [*(("--costs", c) for c in args.costs), *(("--reference", r) for r in args.reference)]:
        if not path.is_file():
            p.error(f"{option}: no file {path}.")
    if args.longppl_dir is not None and not args.longppl_dir.is_dir():
        p.error(f"--longppl-dir: no directory {args.longppl_dir}.")
    options = args.work / "options.json"  # what the reproduction recorded: the figures are read at its l and budget
    recorded = json.loads(options.read_text()) if options.is_file() else {}
    for option, key, given in (("--training-length", "training_length", args.training_length), ("--updates", "max_update", args.updates)):
        if key in recorded and recorded[key] != given:
            p.error(f"{option} {given}, but {options} records {recorded[key]}: give {recorded[key]} (the runs' own).")
    try:
        rows = [row for path in args.reference for row in reference_figures(path)]
    except (FileNotFoundError, ValueError) as e:  # a report or run folder the list names is missing, or not one
        p.error(f"--reference: {e}")
    for given in parse_name_list(args.runs, "--runs"):
        name, _, variant = given.partition("/")
        longppl = args.longppl_dir / f"{given.replace('/', '.')}.json" if args.longppl_dir else None
        if name not in RUNS:
            p.error(f"--runs: {name} is not a run of the reproduction ({', '.join(RUNS)}).")
        if variant and (variant != RECALIBRATED or RUNS[name][1] != "drope"):
            p.error(f"--runs: {given}: the one variant is {RECALIBRATED}, of a DroPE run "
                    f"({', '.join(n for n, (_, role) in RUNS.items() if role == 'drope')}).")
        try:
            rows.append(design_figures(args.work, name, args.training_length, args.updates, longppl=longppl,
                                       costs=args.costs, recalibrated=bool(variant)))
        except (FileNotFoundError, ValueError) as e:  # no length report, costs of another setting: say what to do
            p.error(str(e))
    print(markdown_verdict(rows))
    if args.plot:
        model = f"{recorded['arch']}, " if "arch" in recorded else ""
        plot_verdict(rows, args.plot, f"Trained to extrapolate: each design against the goals ({model}l = {args.training_length})")
        print(f"wrote {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
