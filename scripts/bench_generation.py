#!/usr/bin/env python
"""Per-token generation latency and resident memory against context length, with BCA (bounded cache)
and with full attention (the cache keeps every position).

    python scripts/bench_generation.py [--contexts 1024,4096,16384,65536] [--training-length 1024]

For each (mode, N) in a fresh process: a context of N tokens is fed block by block through the key/value
cache (so the prefill itself stays within the same memory), then --steps single-token steps are timed
(median ms/token). Memory: the process's resident memory after the steps, and its peak, above the state
before the context was fed. Results are recorded in examples/lex_lm/BENCHMARKS.md.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_attention import run_isolated  # noqa: E402


def measure_one(mode: str, context: int, arch: str, training_length: int, steps: int) -> dict:
    import torch

    from bench_attention import build, rss_mb
    from lex_plugin.evaluation.length_eval import blockwise_forward
    from lex_plugin.modules.windowed_attention import AttentionWindow

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    model, d = build(arch, training_length)
    if mode == "bca":
        model.decoder.set_attention_window(AttentionWindow.bca(training_length))
    tokens = torch.randint(d.nspecial, len(d), (1, context + steps))
    state: dict = {}
    with torch.no_grad():
        base = rss_mb()
        for _ in blockwise_forward(model, tokens[:, :context], training_length // 2, state, features_only=True):
            pass
        times = []
        for n in range(context + 1, context + steps + 1):
            start = time.perf_counter()
            model(tokens[:, :n], incremental_state=state)  # logits of one token, as in generation
            times.append(time.perf_counter() - start)
    cache = state_keys(model, state)
    return {"mode": mode, "context": context, "ms_per_token": 1000 * statistics.median(times),
            "rss_mb_above_start": rss_mb() - base,
            "peak_mb_above_start": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base,
            "cached_positions_per_layer": cache}


def state_keys(model, state) -> int:
    attn = model.decoder.layers[0].self_attn
    return int(attn.get_incremental_state(state, "attn_state")["prev_key"].size(2))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="1024,4096,16384,65536")
    p.add_argument("--modes", default="bca,full")
    p.add_argument("--training-length", type=int, default=1024)
    p.add_argument("--arch", default="lex_lm_tiny")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--json-out", default=None)
    p.add_argument("--one", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.arch, args.training_length, args.steps)))
        return
    contexts = [int(x) for x in args.contexts.split(",")]
    modes = args.modes.split(",")
    rows = []
    for n in contexts:
        for mode in modes:
            row = run_isolated(__file__, [mode, n, "--arch", args.arch, "--training-length", args.training_length,
                                          "--steps", args.steps])
            if "skipped" in row:
                raise SystemExit(f"{mode} N={n}: {row['skipped']}")
            rows.append(row)
            print(f"{mode:>5} N={n:>6}: {row['ms_per_token']:7.2f} ms/token  rss +{row['rss_mb_above_start']:7.0f} MB  "
                  f"peak +{row['peak_mb_above_start']:7.0f} MB  cache {row['cached_positions_per_layer']}", file=sys.stderr)
    print(f"\n{args.arch}, training length l = {args.training_length}, batch 1, fp32, "
          f"{os.environ.get('OMP_NUM_THREADS', os.cpu_count())} threads, median of {args.steps} steps\n")
    print("| context | " + " | ".join(f"{m} ms/token | {m} RSS MB | {m} cached keys/layer" for m in modes) + " |")
    print("|---|" + "---|---|---|" * len(modes))
    for n in contexts:
        cells = []
        for m in modes:
            r = next(r for r in rows if r["mode"] == m and r["context"] == n)
            cells += [f"{r['ms_per_token']:.2f}", f"{r['rss_mb_above_start']:,.0f}", f"{r['cached_positions_per_layer']:,}"]
        print(f"| {n:,} | " + " | ".join(cells) + " |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
