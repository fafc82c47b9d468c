#!/usr/bin/env python
"""Evaluation throughput and peak memory against length: BCA, sliding window, full causal attention and a
TorchScale-style reference (bmm + softmax with an L x L mask, ``torchscale.component.multihead_attention``),
the same lex_lm weights throughout, one run.

    python scripts/bench_attention.py [--lengths 1024,...,32768] [--training-length 1024] [--arch lex_lm_tiny]

Every (mode, L) runs in a fresh process: tokens/s of a batch-1 forward to the final hidden states (the
output projection and its L x V logits cost the same in every mode and are left out) (best of the repeats after a warm-up)
and the process's peak resident memory above its state just before the forward. The reference is skipped
where its L x L attention weights alone would exceed --reference-limit-gb. Results are recorded in
examples/lex_lm/BENCHMARKS.md.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_isolated(script: str, args) -> dict:
    """Run ``script --one ...`` in a fresh Python process (clean peak memory); its last stdout line is JSON.
    Returns {"skipped": reason} if it failed."""
    proc = subprocess.run([sys.executable, script, "--one", *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"skipped": f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build(arch: str, training_length: int):
    import torch
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY

    import lex_plugin  # noqa: F401
    from lex_plugin.models.lex_lm import LexLanguageModel

    d = Dictionary()
    for i in range(8192 - d.nspecial):
        d.add_symbol(f"w{i}")
    args = argparse.Namespace(arch=arch, tokens_per_sample=training_length, share_decoder_input_output_embed=True)
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(0)
    task = argparse.Namespace(source_dictionary=d, target_dictionary=d)
    return LexLanguageModel.build_model(args, task).eval(), d


def use_reference_attention(model):
    """Swap every layer's attention for TorchScale's MultiheadAttention (same weights, its own XPOS),
    called as TorchScale's Decoder calls it: an L x L float mask, bmm + softmax."""
    import torch
    from torchscale.component.multihead_attention import MultiheadAttention

    for layer in model.decoder.layers:
        ours = layer.self_attn
        cfg = argparse.Namespace(multiway=False, layernorm_eps=1e-5, xpos_rel_pos=True,
                                 xpos_scale_base=model.decoder.xpos.scale_base)
        ref = MultiheadAttention(cfg, ours.embed_dim, ours.num_heads, self_attention=True,
                                 subln=ours.inner_attn_ln is not None)
        ref.load_state_dict(ours.state_dict(), strict=False)
        ref.eval()

        def forward(x, xpos=None, key_padding_mask=None, incremental_state=None, window=None, _ref=ref):
            L = x.size(1)
            mask = torch.triu(torch.full((L, L), float("-inf"), dtype=x.dtype), 1)
            return _ref(x, x, x, attn_mask=mask)[0]

        ours.forward = forward


def measure_one(mode: str, length: int, arch: str, training_length: int, repeats: int) -> dict:
    import torch

    from lex_plugin.modules.windowed_attention import AttentionWindow

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    model, d = build(arch, training_length)
    if mode in ("bca", "bca_blockwise"):
        model.decoder.set_attention_window(AttentionWindow.bca(training_length))
    elif mode == "sliding":
        model.decoder.set_attention_window(AttentionWindow("sliding", training_length))
    elif mode == "reference":
        use_reference_attention(model)
    tokens = torch.randint(d.nspecial, len(d), (1, length))
    run = lambda t: model(t, features_only=True)  # noqa: E731  (the L x V logits cost the same in every mode)
    if mode == "bca_blockwise":  # block by block through the bounded key/value cache (LeX Figure 3)
        from lex_plugin.evaluation.length_eval import blockwise_forward

        def run(t):
            for _ in blockwise_forward(model, t, training_length // 2, features_only=True):
                pass

    with torch.no_grad():
        run(tokens[:, : min(length, 256)])  # warm-up
        base = rss_mb()
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run(tokens)
            best = min(best, time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "length": length, "tokens_per_s": length / best, "seconds": best,
            "peak_mb_above_start": max(peak, peak_before) - base}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--modes", default="bca,bca_blockwise,sliding,full,reference")
    p.add_argument("--training-length", type=int, default=1024)
    p.add_argument("--arch", default="lex_lm_tiny")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--reference-limit-gb", type=float, default=12.0)
    p.add_argument("--json-out", default=None)
    p.add_argument("--one", nargs=2, metavar=("MODE", "L"), help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.arch, args.training_length, args.repeats)))
        return

    lengths = [int(x) for x in args.lengths.split(",")]
    modes = args.modes.split(",")
    rows = []
    for L in lengths:
        for mode in modes:
            if mode == "reference":
                heads = {"lex_lm_tiny": 4}.get(args.arch, 8)
                gb = 3 * heads * L * L * 4 / 2**30  # weights, mask-added copy, softmax output (fp32)
                if gb > args.reference_limit_gb:
                    rows.append({"mode": mode, "length": L, "skipped": f"needs ~{gb:.0f} GB for L x L weights"})
                    print(f"{mode:>9} L={L:>6}: skipped (~{gb:.0f} GB)", file=sys.stderr)
                    continue
            row = {"mode": mode, "length": L, **run_isolated(__file__, [mode, L, "--arch", args.arch,
                   "--training-length", args.training_length, "--repeats", args.repeats])}
            rows.append(row)
            if "skipped" in row:
                continue
            print(f"{mode:>9} L={L:>6}: {row['tokens_per_s']:>9,.0f} tok/s  peak +{row['peak_mb_above_start']:,.0f} MB",
                  file=sys.stderr)

    print(f"\n{args.arch}, training length l = {args.training_length}, batch 1, fp32, "
          f"{os.environ.get('OMP_NUM_THREADS', os.cpu_count())} threads\n")
    print("| L | " + " | ".join(f"{m} tok/s | {m} peak MB" for m in modes) + " |")
    print("|---|" + "---|---|" * len(modes))
    for L in lengths:
        cells = []
        for m in modes:
            r = next(r for r in rows if r["mode"] == m and r["length"] == L)
            cells += ["-", r["skipped"]] if "skipped" in r else [f"{r['tokens_per_s']:,.0f}", f"{r['peak_mb_above_start']:,.0f}"]
        print(f"| {L} | " + " | ".join(cells) + " |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
