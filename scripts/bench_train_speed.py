#!/usr/bin/env python
"""Training throughput: lex_lm_tiny against stock fairseq transformer_lm of the same size, or lex_lm_tiny
under each ``--pos-emb`` scheme.

All runs train with fairseq-train on the same data-bin, batch, optimizer and threads; runs alternate
(a, b, c, a, b, c, ...) so drift on a shared machine hits all. Reported: median words (tokens) per
second of fairseq's own ``train_inner`` log over the updates after warm-up, and ratios.

    python scripts/bench_train_speed.py --data work/demo/data-bin [--updates 60] [--rounds 2]
    python scripts/bench_train_speed.py --schemes xpos,rope,alibi,sandwich,kerple_log,t5,sinusoidal,learned,none

Results are recorded in examples/lex_lm/BENCHMARKS.md.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
SIZE = ["--decoder-layers", "4", "--decoder-embed-dim", "256", "--decoder-ffn-embed-dim", "1024", "--decoder-attention-heads", "4"]
ARCHS = {
    "lex_lm_tiny": ["--user-dir", str(REPO / "lex_plugin"), "--arch", "lex_lm_tiny"],
    "transformer_lm (same size)": ["--arch", "transformer_lm", *SIZE, "--decoder-normalize-before", "--activation-fn", "gelu"],
}


def train_wps(data: Path, arch_args, updates: int, warmup: int, tokens_per_sample: int, batch_size: int):
    save = tempfile.mkdtemp(prefix="bench-")
    cmd = [
        "fairseq-train", str(data), "--task", "language_modeling", *arch_args, "--share-decoder-input-output-embed",
        "--tokens-per-sample", str(tokens_per_sample), "--sample-break-mode", "none", "--batch-size", str(batch_size),
        "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50",
        "--max-update", str(updates), "--save-dir", save, "--no-save", "--disable-validation",
        "--log-format", "json", "--log-interval", "5", "--num-workers", "0", "--seed", "1",
    ]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    shutil.rmtree(save, ignore_errors=True)
    if proc.returncode != 0:
        raise click.ClickException(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    logs = [json.loads(m) for m in re.findall(r"train_inner \| (\{.*\})", proc.stdout + proc.stderr)]
    return [float(r["wps"]) for r in logs if int(r["num_updates"]) > warmup]


@click.command()
@click.option("--data", type=click.Path(exists=True, path_type=Path), default=REPO / "work/demo/data-bin", show_default=True)
@click.option("--updates", default=60, show_default=True)
@click.option("--warmup", default=20, show_default=True, help="updates left out of the median")
@click.option("--rounds", default=2, show_default=True)
@click.option("--tokens-per-sample", default=256, show_default=True)
@click.option("--batch-size", default=16, show_default=True)
@click.option("--schemes", default=None, help="compare lex_lm_tiny under these --pos-emb schemes (comma-separated) instead")
@click.option("--json-out", type=click.Path(path_type=Path), default=None)
def main(data, updates, warmup, rounds, tokens_per_sample, batch_size, schemes, json_out):
    archs = ARCHS
    if schemes:
        archs = {s: [*ARCHS["lex_lm_tiny"], "--pos-emb", s] for s in schemes.split(",")}
    wps = {name: [] for name in archs}
    for r in range(rounds):
        for name, args in archs.items():
            click.echo(f"round {r + 1}/{rounds}: {name} ...", err=True)
            wps[name] += train_wps(data, args, updates, warmup, tokens_per_sample, batch_size)
    med = {name: statistics.median(v) for name, v in wps.items()}
    ref = "xpos" if schemes and "xpos" in med else next(iter(med))
    click.echo(f"\n| model | train tokens/s (median) | {ref} / this | intervals |\n|---|---|---|---|")
    for name in archs:
        click.echo(f"| {name} | {med[name]:,.0f} | {med[ref] / med[name]:.3f} | {len(wps[name])} |")
    click.echo(f"\n(L={tokens_per_sample}, batch {batch_size}, {os.environ.get('OMP_NUM_THREADS', 'all')} threads, "
               f"{rounds} alternating runs of {updates} updates, median over updates > {warmup})")
    if json_out:
        json_out.write_text(json.dumps({"median_wps": med, "reference": ref, "samples": wps}, indent=2))


if __name__ == "__main__":
    main()
