#!/usr/bin/env python
"""The verdict's cost columns: each trained design against its base model, one process per design
(lex_plugin.experiments.design_costs: evaluation time, generation time and the cache kept at 64k, the two models'
measurements alternated in that process).

    python scripts/bench_design_costs.py --runs xpos_bca_nope,rnope_swa,gemma_5to1 --training-length 256 \\
        --context 16384 --json-out examples/lex_lm/designs_1000/costs16k.json

A reference method of the verdict (``xpos+bca``, ``xpos+rerope``, ``rope+rerope``, ``alibi+rerope``: an evaluation
mode of a model trained without a design) is measured the same way, against the same model under full attention:

    python scripts/bench_design_costs.py --runs xpos+bca,xpos+rerope,rope+rerope --training-length 256 \\
        --context 16384 --json-out examples/lex_lm/designs_1000/costs16k_references.json

The report holds one row per run and its provenance (command, commit, device, versions, wall time);
``scripts/verdict.py --costs`` reads it.
"""

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lex_plugin.experiments import benchmark  # noqa: E402
from lex_plugin.experiments.benchmark_tables import design_costs_markdown  # noqa: E402
from lex_plugin.options import parse_name_list  # noqa: E402


def main():
    from lex_plugin.experiments.design_costs import REFERENCE_MODES
    from lex_plugin.experiments.reproduce.catalogue import RUNS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", help="comma-separated runs of scripts/reproduce.py with a design (catalogue.RUNS), or the "
                   "verdict's reference methods (design_costs.REFERENCE_MODES)")
    p.add_argument("--training-length", type=int, default=256)
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--arch", default="lex_lm_tiny")
    p.add_argument("--repeats", type=int, default=3, help="evaluation forwards per model (the best is kept)")
    p.add_argument("--json-out", type=Path)
    p.add_argument("--one", metavar="RUN", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        from lex_plugin.experiments.design_costs import measure_design_costs

        start = time.perf_counter()
        row = measure_design_costs(args.one, args.training_length, args.context, args.arch, args.repeats)
        benchmark.emit({**row, "wall_s": round(time.perf_counter() - start, 1)})
        return
    if not args.runs:
        p.error("--runs: give the runs to measure.")
    runs = parse_name_list(args.runs, "--runs")
    unknown = [r for r in runs if r not in RUNS and r not in REFERENCE_MODES]
    if unknown:
        p.error(f"--runs: {', '.join(unknown)} not runs of scripts/reproduce.py ({', '.join(RUNS)}) nor reference "
                f"methods ({', '.join(REFERENCE_MODES)}).")
    start, rows = time.perf_counter(), []
    for run in runs:
        row = benchmark.run_isolated(Path(__file__), [run, "--training-length", args.training_length, "--context",
                                                      args.context, "--arch", args.arch, "--repeats", args.repeats])
        if "skipped" in row:
            raise SystemExit(f"{run}: {row['skipped']}")
        print(f"{run}: eval {row['eval_time']:.2f}x, gen {row['gen_time']:.2f}x, cache {row['cache_64k']:.3f}x "
              f"({row['wall_s']:.0f} s)", file=sys.stderr, flush=True)
        rows.append(row)
    print(f"{args.arch}, l = {args.training_length}, {args.context:,} tokens, batch 1, fp32, "
          f"{benchmark.thread_count()} threads; each design and its base in one process, measurements alternated\n")
    print(design_costs_markdown(rows))
    if args.json_out:
        benchmark.write_report(args.json_out, rows, start, cuda=False)  # CPU runs


if __name__ == "__main__":
    main()
