#!/usr/bin/env python
"""Training throughput: lex_lm_tiny against stock fairseq transformer_lm of the same size, or lex_lm_tiny
under each ``--pos-emb`` scheme.

All runs train with fairseq-train on the same data-bin, batch, optimizer and threads; runs alternate
(a, b, c, a, b, c, ...) so drift on a shared machine hits all. Reported: median words (tokens) per
second of fairseq's own ``train_inner`` log over the updates after warm-up, and ratios.

    python scripts/bench_train_speed.py --data work/demo/data-bin [--updates 60] [--rounds 2]
    python scripts/bench_train_speed.py --schemes xpos,rope,alibi,sandwich,kerple_log,t5,sinusoidal,learned,none
    python scripts/bench_train_speed.py --baseline ../lex-before   # old / new / new/old columns
    python scripts/bench_train_speed.py --autocast --arch lex_lm_tiny,lex_lm_small   # fp32 vs --bf16-autocast
    python scripts/bench_train_speed.py --designs rope,rope_learned_sinks,rnope_swa   # the reproduction's runs by name
    python scripts/bench_train_speed.py --finetune work/repro_long/ruler-bin --batch-size 32 --baseline ../lex-before
        # a probe's fine-tuning: --answer-only-loss on a lex ruler-data / babilong-data bin

With --baseline PATH every run is repeated right after itself with PATH's lex_plugin as --user-dir (under
PYTHONPATH=PATH); the stock transformer_lm runs the same code on both sides, so its new/old ratio shows
the noise of the machine. Results are recorded in examples/lex_lm/BENCHMARKS.md.
"""

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import click

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lex_plugin.experiments import benchmark  # noqa: E402
from lex_plugin.experiments.recipe import fairseq_train_command  # noqa: E402
from lex_plugin.options import given_flags  # noqa: E402
from lex_plugin.experiments.reproduce.catalogue import RUNS, run_arguments  # noqa: E402

SIZE = ["--decoder-layers", "4", "--decoder-embed-dim", "256", "--decoder-ffn-embed-dim", "1024", "--decoder-attention-heads", "4"]
# name -> (arch, model options, uses the plugin)
ARCHS = {
    "lex_lm_tiny": ("lex_lm_tiny", [], True),
    "transformer_lm (same size)": ("transformer_lm", [*SIZE, "--decoder-normalize-before", "--activation-fn", "gelu"], False),
}
WPS = [("train tokens/s (median)", "median_wps", "{:,.0f}")]


def train_wps(data: Path, arch: tuple, updates: int, warmup: int, tokens_per_sample: int, batch_size: int,
              checkout: Optional[Path] = None, break_mode: str = "none") -> List[float]:
    """wps of every ``train_inner`` log line past ``warmup`` updates of one fairseq-train run of the project's
    recipe (``lex_plugin.experiments.recipe``; ``arch``: an ``ARCHS`` entry; ``checkout``: with that checkout's lex_plugin;
    ``break_mode``: ``--sample-break-mode``). fairseq's wps counts the targets the loss is over (under
    ``--answer-only-loss``, the answers' tokens)."""
    name, model_args, plugin = arch
    user_dir = (Path(checkout).resolve() / "lex_plugin" if checkout is not None else REPO / "lex_plugin") if plugin else None
    cmd = fairseq_train_command(data, None, arch=name, model_args=model_args, tokens_per_sample=tokens_per_sample,
                                batch_size=batch_size, lr="1e-3", updates=updates, warmup=min(50, updates), break_mode=break_mode,
                                log_format="json", log_interval=5, user_dir=user_dir)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=benchmark.checkout_env(checkout), cwd=REPO)
    if proc.returncode != 0:
        raise click.ClickException(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    logs = [json.loads(m) for m in re.findall(r"train_inner \| (\{.*\})", proc.stdout + proc.stderr)]
    return [float(r["wps"]) for r in logs if int(r["num_updates"]) > warmup]


@click.command()
@click.option("--data", type=click.Path(path_type=Path), default=REPO / "work/demo/data-bin", show_default=True,
              help="the data-bin trained on (not read with --finetune)")
@click.option("--updates", type=click.IntRange(min=1), default=60, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=20, show_default=True, help="updates left out of the median")
@click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--tokens-per-sample", default=256, show_default=True)
@click.option("--batch-size", default=16, show_default=True)
@click.option("--schemes", default=None, help="compare lex_lm_tiny under these --pos-emb schemes (comma-separated) instead")
@click.option("--designs", default=None, metavar="NAMES",
              help="compare the reproduction's runs (scripts/reproduce.py --runs names: trained designs, layer patterns) "
                   "instead; each against the run of its --pos-emb alone, which is added when missing")
@click.option("--random-positions", type=int, default=None, metavar="L_MAX",
              help="compare lex_lm_tiny with and without --random-positions L_MAX instead")
@click.option("--autocast", is_flag=True,
              help="compare each --arch in fp32 and under --bf16-autocast (bf16 autocast, fp32 weights) instead")
@click.option("--finetune", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None, metavar="BIN",
              help="time a probe's fine-tuning instead: lex_lm_tiny on the rows of BIN (lex ruler-data / babilong-data), "
                   "one per sample, with --answer-only-loss (with --baseline: its old and new loss)")
@click.option("--arch", "arch_names", default="lex_lm_tiny", show_default=True, help="the lex_lm presets of --autocast")
@click.option("--json-out", type=click.Path(path_type=Path), default=None)
@click.option("--baseline", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None, metavar="PATH",
              help="an older checkout: also train every run with PATH/lex_plugin, right after this one's")
def main(data, updates, warmup, rounds, tokens_per_sample, batch_size, schemes, designs, random_positions, autocast,
         finetune, arch_names, json_out, baseline):
    """Median training tokens/s of fairseq-train runs, alternated (module docstring); one comparison a call."""
    modes = given_flags("schemes", "designs", "random_positions", "autocast", "finetune")
    if len(modes) > 1:
        raise click.UsageError(f"{' and '.join(modes)}: each picks the runs to compare; give one per call.")
    if given_flags("arch_names") and not autocast:
        raise click.BadParameter("only --autocast reads it (the other comparisons fix their models)", param_hint="--arch")
    if given_flags("data") and finetune:
        raise click.BadParameter("--finetune BIN is the data trained on; drop --data", param_hint="--data")
    if warmup >= updates:
        raise click.BadParameter(f"{warmup} leaves no update of --updates {updates} to measure; give fewer",
                                 param_hint="--warmup")
    if baseline is not None and not (baseline / "lex_plugin" / "__init__.py").is_file():
        raise click.BadParameter(f"{baseline} has no lex_plugin package", param_hint="--baseline")
    archs = ARCHS
    if schemes:
        archs = {s: ("lex_lm_tiny", ["--pos-emb", s], True) for s in schemes.split(",")}
    base = {}  # a design's base run: the run of its --pos-emb alone
    if designs:
        names = designs.split(",")
        unknown = [n for n in names if n not in RUNS]
        if unknown:
            raise click.BadParameter(f"{', '.join(unknown)}: not runs of scripts/reproduce.py ({', '.join(RUNS)})",
                                     param_hint="--designs")
        for n in names:
            args = run_arguments(n, tokens_per_sample)
            base[n] = str(args[args.index("--pos-emb") + 1])
        names = list(dict.fromkeys([b for n in names for b in (base[n], n)]))
        base.update({n: n for n in names if n not in base})  # a base run against itself
        archs = {n: ("lex_lm_tiny", run_arguments(n, tokens_per_sample), True) for n in names}
    if random_positions:
        archs = {"lex_lm_tiny": ARCHS["lex_lm_tiny"],
                 f"lex_lm_tiny --random-positions {random_positions}": ("lex_lm_tiny", ["--random-positions", random_positions], True)}
    if autocast:
        archs = {f"{a} {p}": (a, flags, True) for a in arch_names.split(",")
                 for p, flags in (("fp32", []), ("bf16 autocast", ["--bf16-autocast"]))}
    break_mode = "none"
    if finetune:
        data, break_mode = finetune, "eos"
        archs = {"lex_lm_tiny --answer-only-loss": ("lex_lm_tiny", ["--answer-only-loss"], True)}
    elif not data.is_dir():
        raise click.BadParameter(f"{data} is not a data-bin directory (make demo writes work/demo/data-bin).", param_hint="--data")
    sides = {"new": None} if baseline is None else {"new": None, "old": baseline}
    wps = {side: {name: [] for name in archs} for side in sides}
    for r in range(rounds):
        for name, args in archs.items():
            for side, checkout in sides.items():
                click.echo(f"round {r + 1}/{rounds}: {name}{' (baseline)' if side == 'old' else ''} ...", err=True)
                wps[side][name] += train_wps(data, args, updates, warmup, tokens_per_sample, batch_size, checkout, break_mode)
    med = {side: {name: statistics.median(v) for name, v in runs.items()} for side, runs in wps.items()}
    new = med["new"]
    ref = "xpos" if schemes and "xpos" in new else next(iter(new))
    compare = baseline is not None
    header = ["model", *benchmark.result_header(WPS, compare), "base / this" if designs else f"{ref} / this", "intervals"]
    rows = [[name if not designs else f"`{name}` ({' '.join(map(str, archs[name][1]))})",
             *benchmark.result_cells({"median_wps": new[name]}, {"median_wps": med["old"][name]} if compare else None, WPS, compare),
             f"{new[base.get(name, ref)] / new[name]:.3f}", str(len(wps["new"][name]))] for name in archs]
    click.echo("\n" + benchmark.markdown_table(header, rows))
    click.echo(f"\n(L={tokens_per_sample}, batch {batch_size}, {os.environ.get('OMP_NUM_THREADS', 'all')} threads, "
               f"{rounds} alternating runs of {updates} updates, median over updates > {warmup}"
               + (f"; old: {baseline}" if compare else "") + ")")
    if json_out:
        out = {"median_wps": new, "reference": ref, "samples": wps["new"]}
        if compare:
            out["baseline"] = {"path": str(baseline), "median_wps": med["old"], "samples": wps["old"]}
        json_out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
