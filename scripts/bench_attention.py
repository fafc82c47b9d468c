#!/usr/bin/env python
"""Evaluation throughput and peak memory against length: BCA, sliding window, full causal attention and a
TorchScale-style reference (bmm + softmax with an L x L mask, ``torchscale.component.multihead_attention``),
the same lex_lm weights throughout, one run.

    python scripts/bench_attention.py [--lengths 1024,...,32768] [--training-length 1024] [--arch lex_lm_tiny]
    python scripts/bench_attention.py --baseline ../lex-before   # old / new / new/old columns
    python scripts/bench_attention.py --modes bca_blockwise,bca_blockwise+bf16 --lengths 1024,32768   # fp32 vs bf16 autocast

Every (mode, L) runs in a fresh process: tokens/s of a batch-1 forward to the final hidden states (the
output projection and its L x V logits cost the same in every mode and are left out) (best of the repeats after a warm-up)
and the process's peak resident memory above its state just before the forward. The reference is skipped
where its L x L attention weights alone would exceed --reference-limit-gb. With --baseline PATH, every
(mode, L) is also measured by PATH's own copy of this script (its lex_plugin), right after this one's.
Results are recorded in examples/lex_lm/BENCHMARKS.md.
"""

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lex_plugin.experiments import benchmark  # noqa: E402
from lex_plugin.options import parse_int_list, parse_name_list  # noqa: E402


def measure_one(mode: str, length: int, arch: str, training_length: int, repeats: int, pos_emb: str = "xpos") -> dict:
    import torch

    from lex_plugin.evaluation.length_eval import blockwise_forward

    torch.set_num_threads(benchmark.thread_count())
    label = mode
    model, d, mode, spec = benchmark.bench_model(label, arch, training_length, pos_emb=pos_emb)
    if mode == "reference":
        from lex_plugin.experiments.torchscale_reference import use_reference_attention

        use_reference_attention(model)
    tokens = torch.randint(d.nspecial, len(d), (1, length))
    run = lambda t: model(t, features_only=True)  # noqa: E731  (the L x V logits cost the same in every mode)
    if mode.endswith("_blockwise"):  # block by block through the bounded key/value cache (LeX Figure 3), as evaluation runs
        def run(t):  # noqa: F811
            for _ in blockwise_forward(model, t, spec.window.feed_block, features_only=True):
                pass

    with torch.no_grad():
        run(tokens[:, : min(length, 256)])  # warm-up
        base = benchmark.rss_mb()
        peak_before = benchmark.peak_rss_mb()
        best = benchmark.best_time(lambda: run(tokens), repeats)
    peak = benchmark.peak_rss_mb()
    return {"mode": label, "length": length, "tokens_per_s": length / best, "seconds": best,
            "peak_mb_above_start": max(peak, peak_before) - base}


def main():
    from lex_plugin.models.lex_lm import PRESETS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--modes", default="bca,bca_blockwise,sliding,sliding_blockwise,full,reference",
                   help="*_blockwise: block by block through the key/value cache, as the length evaluation runs; "
                        "@RUN: the model of a scripts/reproduce.py run (full@rnope_swa: its layer pattern)")
    p.add_argument("--training-length", type=int, default=1024)
    p.add_argument("--arch", default="lex_lm_tiny", choices=sorted(PRESETS))
    p.add_argument("--pos-emb", default="xpos", help="the position scheme of the random model (alibi: a bias under every mode)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--reference-limit-gb", type=float, default=12.0)
    p.add_argument("--json-out", default=None)
    p.add_argument("--baseline", type=Path, default=None, metavar="PATH",
                   help="also measure every point with PATH/scripts/bench_attention.py (an older checkout)")
    p.add_argument("--one", nargs=2, metavar=("MODE", "L"), help=argparse.SUPPRESS)
    args = p.parse_args()
    started = time.perf_counter()

    if args.one:
        benchmark.emit(measure_one(args.one[0], int(args.one[1]), args.arch, args.training_length, args.repeats, args.pos_emb))
        return
    benchmark.check_baseline(p, args.baseline, Path(__file__))

    lengths = parse_int_list(args.lengths, "--lengths")
    modes = parse_name_list(args.modes, "--modes")

    def skip(mode: str, length: int):
        heads = PRESETS[args.arch]["decoder_attention_heads"]
        gb = 3 * heads * length * length * 4 / 2**30  # weights, mask-added copy, softmax output (fp32)
        return f"needs ~{gb:.0f} GB for L x L weights" if mode == "reference" and gb > args.reference_limit_gb else None

    rows = benchmark.sweep(Path(__file__), [(m, L) for L in lengths for m in modes],
                           ["--arch", args.arch, "--training-length", args.training_length, "--repeats", args.repeats,
                            "--pos-emb", args.pos_emb], args.baseline,
                           lambda r: f"{r['tokens_per_s']:>9,.0f} tok/s  peak +{r['peak_mb_above_start']:,.0f} MB", skip)
    compare = args.baseline is not None
    scheme = ("each @RUN its run's options; the others " if any("@" in m for m in modes) else "") + f"--pos-emb {args.pos_emb}"
    print(f"\n{args.arch}, {scheme}, training length l = {args.training_length}, batch 1, fp32, "
          f"{benchmark.thread_count()} threads" + (f"; old: {args.baseline}" if compare else "") + "\n")
    columns = {m: [(f"{m} tok/s", "tokens_per_s", "{:,.0f}"), (f"{m} peak MB", "peak_mb_above_start", "{:,.0f}")] for m in modes}
    print(benchmark.sweep_table(rows, lengths, modes, columns, compare))
    if args.json_out:
        benchmark.write_report(args.json_out, rows, started)


if __name__ == "__main__":
    main()
