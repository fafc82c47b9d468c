#!/usr/bin/env python
"""What `make demo` measured besides its length table, as one report with its provenance
(lex_plugin.experiments.demo_report): the wall time of each step, validation perplexity during training, the training
throughput, and fairseq-eval-lm's own perplexity on the whole test split. scripts/demo.sh runs it last:

    python scripts/demo_report.py work/demo/train.log --step prepare=61 --step train=905 --step evaluate=290 \\
        --eval-log test=work/demo/eval_test.log -o work/demo/demo_report.json
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lex_plugin.experiments.demo_report import demo_report, demo_steps_table, demo_valid_table  # noqa: E402


def _pair(text: str, what: str) -> tuple:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{what} {text!r}: give NAME=VALUE.")
    return name, value


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("train_log", type=Path, help="fairseq-train's --log-file of the demo (WORK/train.log)")
    p.add_argument("--step", action="append", default=[], type=lambda t: _pair(t, "--step"),
                   help="STEP=SECONDS: the wall time of one step, in order; repeat for each")
    p.add_argument("--eval-log", action="append", default=[], type=lambda t: _pair(t, "--eval-log"),
                   help="LABEL=PATH: the output of a fairseq-eval-lm run (its first line '+ fairseq-eval-lm ...' the "
                   "command); repeat for each")
    p.add_argument("-o", "--out", type=Path, required=True, help="the report (JSON)")
    args = p.parse_args()
    try:
        steps = {name: float(value) for name, value in args.step}
    except ValueError as err:
        p.error(f"--step: {err}; give STEP=SECONDS.")
    for _, path in args.eval_log:
        if not Path(path).is_file():
            p.error(f"--eval-log: no file {path}.")
    if not args.train_log.is_file():
        p.error(f"no training log {args.train_log}.")
    try:
        report = demo_report(args.train_log, steps, {label: Path(path) for label, path in args.eval_log})
    except ValueError as err:
        p.error(str(err))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(demo_steps_table(report), demo_valid_table(report), sep="\n\n")
    for label, figures in report["eval_lm"].items():
        print(f"fairseq-eval-lm ({label}): {figures['tokens']:,} tokens, loss {figures['loss_bits']:.4f} bits, "
              f"perplexity {figures['ppl']:.2f}")
    print(f"report -> {args.out}")


if __name__ == "__main__":
    main()
