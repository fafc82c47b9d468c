#!/usr/bin/env python
"""LongPPL's common evaluator: a model trained at 16l, and the key tokens it finds, for scoring every model on them.

Fang et al. (ICLR 2025) find LongPPL's key tokens with one strong long-context model and score every model on those
tokens. A checkpoint's own key tokens favour its own full attention (the self-evaluator bias), and a model trained at
l reads little past l, so its key tokens at 16l are few and its own. The evaluator here is the rows' architecture
with RoPE, trained at 16l (samples of 16l tokens, as many tokens per update as the rows: batch size x l / 16l
sequences), so that 16l is inside its training length. Two steps, each resumable:

1. ``lex train`` of the evaluator into WORK/checkpoints (fairseq-train resumes from checkpoint_last.pt);
2. ``fairseq-eval-lm --longppl`` of the evaluator on the reproduction's tokens (the first ``--eval-tokens`` of the
   test split) at l, 4l and 16l, with the reproduction's LongPPL rule (``catalogue.LONGPPL_PROBE``: alpha, beta;
   K = 3l/4 and S = l/4 of the rows' l, not of the evaluator's), writing the report OUT; its ``longppl`` entry lists the
   key tokens' positions, the report every row's ``fairseq-eval-lm --longppl --key-tokens OUT`` reads
   (``scripts/reproduce.py --methods longppl_common``).

    python scripts/longppl_evaluator.py --data-bin data-bin/pg --work work/longppl_evaluator \\
        --out examples/lex_lm/designs_1000/longppl_evaluator.json   # ~33 min on 2 cores (2,050-2,110 tokens/s)
"""

import json
import subprocess
import sys
from pathlib import Path

import click

from lex_plugin.experiments.reproduce import ReproduceOptions
from lex_plugin.experiments.reproduce.catalogue import LONGPPL_PROBE
from lex_plugin.experiments.reproduce.commands import eval_command
from lex_plugin.experiments.reproduce.runner import tool_env


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-bin", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--work", type=click.Path(path_type=Path), default=Path("work/longppl_evaluator"), show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="the key-token report (JSON)")
@click.option("--training-length", type=click.IntRange(min=2), default=256, show_default=True,
              help="l of the rows the key tokens are for; the evaluator trains at 16l")
@click.option("--max-update", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="the rows' sequences of l per update; the evaluator takes as many tokens per update")
@click.option("--eval-tokens", type=click.IntRange(min=1), default=49152, show_default=True)
def main(data_bin, work, out, training_length, max_update, batch_size, eval_tokens):
    l, longest = training_length, 16 * training_length
    if (batch_size * l) % longest:
        raise click.BadParameter(f"{batch_size} x {l} tokens per update is not a whole number of {longest}-token "
                                 "samples; give a batch size that is a multiple of 16.", param_hint="--batch-size")
    save = work / "checkpoints"
    train = [sys.executable, "-m", "lex_plugin.cli", "train", str(data_bin), str(save), "--tokens-per-sample", str(longest),
             "--batch-size", str(batch_size * l // longest), "--max-update", str(max_update), "--pos-emb", "rope"]
    print(" ".join(train), flush=True)
    subprocess.run(train, check=True)
    ckpt = save / "checkpoint_last.pt"
    o = ReproduceOptions(training_length=l, max_update=max_update, batch_size=batch_size, eval_tokens=eval_tokens)
    p = LONGPPL_PROBE
    cmd = [str(c) for c in eval_command(
        data_bin, ckpt, [l * k for k in p["multiples"]], ["full"], out, o,
        ["--longppl", "--longppl-alpha", p["alpha"], "--longppl-beta", p["beta"], "--longppl-trunc-len", 3 * l // 4,
         "--longppl-sliding-window", l // 4, "--length-report-only"])]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=tool_env())  # fairseq-eval-lm of this interpreter's environment
    report = json.loads(out.read_text())
    report["longppl"]["evaluator"] = f"RoPE trained at {longest} tokens ({max_update} updates): {ckpt}"
    report["evaluator_training"] = {"command": train, "training_length": longest, "updates": max_update}
    out.write_text(json.dumps(report, indent=2))
    print(f"{report['longppl']['key_tokens']} key tokens of {report['split_tokens']:,} written to {out}")


if __name__ == "__main__":
    main()
