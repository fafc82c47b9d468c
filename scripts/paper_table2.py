#!/usr/bin/env python
"""LeX Table 2 at the paper's training length (l = 1,024) in one bounded GPU call.

Trains ``lex_lm_small`` with xPos, RoPE, ALiBi and the absolute (sinusoidal) scheme on the same budget in fp16, the
most updates that fit the deadline at the measured throughput, evaluates each at l/4 .. 16l under full attention,
BCA and the sliding window, and writes OUTDIR/table2.md and OUTDIR/table2.json beside the paper's numbers after every
step (``lex_plugin.experiments.table2``; budget plan and expected output: examples/lex_lm/GPU.md).

    python scripts/paper_table2.py --data-bin data-bin/pg --work /tmp/table2 --out OUTDIR       # one H100 or H200
    python scripts/paper_table2.py --data-bin DATA --arch lex_lm_tiny --training-length 32 --batch-size 4 \\
        --precision fp32 --tokens-per-s 3000 --eval-tokens 2048 --deadline-s 120 --work W --out W  # CPU rehearsal

Without --data-bin's directory, --corpus is prepared into it first (``lex prepare``; its time counts against the
deadline). Re-running with the same --work skips the steps already done.
"""

import time

START = time.monotonic()  # the deadline counts from here, before the imports (torch, fairseq: seconds on a GPU machine)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import click  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lex_plugin.experiments.table2 import SCHEMES, Table2Error, Table2Options, run_table2  # noqa: E402
from lex_plugin.options import parse_name_list  # noqa: E402


def _throughputs(text: str, schemes) -> dict:
    """``--tokens-per-s``: one number for every scheme, or SCHEME=N,..."""
    if not text:
        return None
    try:
        if "=" not in text:
            return {s: float(text) for s in schemes}
        return {k.strip(): float(v) for k, v in (item.split("=", 1) for item in text.split(","))}
    except ValueError:
        raise click.BadParameter(f"{text!r}: give one number, or SCHEME=N,... (tokens per second)",
                                 param_hint="--tokens-per-s") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
@click.option("--data-bin", type=click.Path(path_type=Path), required=True, help="a prepared data-bin (or where to prepare --corpus)")
@click.option("--corpus", type=click.Path(path_type=Path), default=None, help="CORPUS/{train,valid,test}/*.txt, prepared when --data-bin is absent")
@click.option("--work", type=click.Path(path_type=Path), default=Path("work/table2"), show_default=True,
              help="checkpoints and logs, one directory per scheme")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="where table2.md / table2.json go (default: --work)")
@click.option("--deadline-s", type=click.FloatRange(min=1), default=390.0, show_default=True,
              help="seconds from the start by which every step has ended (390: a 9-minute call less start-up and install)")
@click.option("--schemes", default=",".join(SCHEMES), show_default=True, help="--pos-emb names, in training order")
@click.option("--windows", default="full,bca,sliding", show_default=True, help="--eval-windows modes")
@click.option("--arch", default="lex_lm_small", show_default=True)
@click.option("--training-length", type=click.IntRange(min=4), default=1024, show_default=True, help="l")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--lr", default="1e-3", show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--precision", type=click.Choice(["fp16", "fp32"]), default=None, help="default: fp16 on CUDA, fp32 on the CPU")
@click.option("--eval-tokens", type=click.IntRange(min=1), default=131072, show_default=True)
@click.option("--max-update", type=click.IntRange(min=1), default=None, help="at most this many updates (the plan may give fewer)")
@click.option("--tokens-per-s", default="", help="training throughput for the plan: N, or SCHEME=N,... (default: measured on an H200)")
@click.option("--safety", type=click.FloatRange(min=0, max=1, min_open=True), default=0.7, show_default=True,
              help="the share of the time left after reservations that training fills")
def main(data_bin, corpus, work, out, deadline_s, schemes, windows, arch, training_length, batch_size, lr, seed, precision,
         eval_tokens, max_update, tokens_per_s, safety):
    import torch

    schemes = parse_name_list(schemes, "--schemes")
    if not data_bin.is_dir():
        if corpus is None:
            raise click.BadParameter(f"{data_bin} does not exist; give a prepared data-bin, or --corpus to prepare it",
                                     param_hint="--data-bin")
        import subprocess

        from lex_plugin.experiments.reproduce.commands import prepare_command

        subprocess.run([str(c) for c in prepare_command(corpus, data_bin)], check=True, cwd=REPO)
    cuda = torch.cuda.is_available()
    try:
        o = Table2Options(data=data_bin, work=work, out=out or work, deadline_s=deadline_s - (time.monotonic() - START),
                          schemes=tuple(schemes), windows=tuple(parse_name_list(windows, "--windows")), arch=arch,
                          training_length=training_length, batch_size=batch_size, lr=lr, seed=seed,
                          precision=precision or ("fp16" if cuda else "fp32"), eval_tokens=eval_tokens,
                          max_update=max_update, tokens_per_s=_throughputs(tokens_per_s, schemes), safety=safety,
                          cuda=cuda)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    try:
        run_table2(o, argv=sys.argv, log=lambda line: click.echo(line, err=True))
    except Table2Error as e:
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":
    main()
