#!/usr/bin/env python
"""Per-token generation latency and resident memory against context length, with BCA (bounded cache)
and with full attention (the cache keeps every position).

    python scripts/bench_generation.py [--contexts 1024,4096,16384,65536] [--training-length 1024]
    python scripts/bench_generation.py --baseline ../lex-before   # old / new / new/old columns
    python scripts/bench_generation.py --modes bca,bca+bf16,full,full+bf16   # fp32 vs bf16 autocast
    python scripts/bench_generation.py --interleaved --modes full,self_extend,dca   # one process, steps alternated

For each (mode, N) in a fresh process: a context of N tokens is fed block by block through the key/value
cache (so the prefill itself stays within the same memory), then --steps single-token steps are timed
(median ms/token; the prefill's wall time is reported too), then as many again under the profiler
(the attention kernels' share of a step); then reading every layer's cached keys and values once (the
step's memory floor) and as many bytes of a contiguous array (the machine's read bandwidth) are timed.
Memory: the process's resident memory after the timed steps, and its peak until then, above the state
before the context was fed. With --baseline PATH, every (mode, N) is also measured by PATH's own copy of
this script (its lex_plugin), right after this one's. Results are recorded in examples/lex_lm/BENCHMARKS.md.
"""

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lex_plugin.experiments import benchmark  # noqa: E402
from lex_plugin.options import parse_int_list, parse_name_list  # noqa: E402

# profiler names of the attention's kernels: SDPA's, and the matrix products and softmax of a one-query step
# (kernels only: the elementwise scaling, bias and mask ops around them are left out, a few % at most)
ATTENTION_KERNELS = ("scaled_dot_product", "aten::bmm", "aten::_softmax")


def measure_one(mode: str, context: int, arch: str, training_length: int, steps: int) -> dict:
    import torch

    from lex_plugin.evaluation.length_eval import blockwise_forward

    torch.set_num_threads(benchmark.thread_count())
    label = mode
    # any mode of AttentionOptions (full, bca, sliding, lm_infinite, a position map), or bca_sinks (4 sink tokens)
    model, d, mode, _ = benchmark.bench_model(label, arch, training_length)
    tokens = torch.randint(d.nspecial, len(d), (1, context + 2 * steps))
    state: dict = {}
    # one autocast region around the prefill and the steps, as the generation loop opens (generation.continue_ids)
    with torch.no_grad(), model.decoder.autocast_context(tokens.device):
        base = benchmark.rss_mb()
        start = time.perf_counter()
        for _ in blockwise_forward(model, tokens[:, :context], training_length // 2, state, features_only=True):
            pass
        prefill_s = time.perf_counter() - start
        # logits of one token per step, as in generation
        ms = 1000 * benchmark.median_time(lambda n: model(tokens[:, :n], incremental_state=state),
                                          range(context + 1, context + steps + 1))
        memory = {"rss_mb_above_start": benchmark.rss_mb() - base, "peak_mb_above_start": benchmark.peak_rss_mb() - base,
                  "cached_positions_per_layer": max(int(layer.self_attn.cached_keys(state)) for layer in model.decoder.layers)}
        # (below: measurements that would change those three) the attention's share of a step: its kernels' time in a profile of --steps more steps
        with torch.profiler.profile() as prof:
            for n in range(context + steps + 1, context + 2 * steps + 1):
                model(tokens[:, :n], incremental_state=state)
        attention_ms = sum(e.self_cpu_time_total for e in prof.key_averages() if any(
            k in e.key for k in ATTENTION_KERNELS)) / 1000 / steps
        # the memory floor of a step: read every layer's cached keys and values once; and the machine's
        # read bandwidth: the same number of bytes of a contiguous array (fp32)
        caches = [(held.keys, held.values) for held in (layer.self_attn.cache(state).held() for layer in model.decoder.layers)]
        read_ms = 1000 * benchmark.median_time(lambda _: [t.sum() for kv in caches for t in kv], range(steps))
        cache_bytes = sum(t.numel() * t.element_size() for kv in caches for t in kv)
        flat = torch.ones(cache_bytes // 4)
        stream_ms = 1000 * benchmark.median_time(lambda _: flat.sum(), range(steps))
        del flat
    return {"mode": label, "context": context, "ms_per_token": ms, "prefill_s": prefill_s, "cache_read_ms": read_ms,
            "cache_mb": cache_bytes / 2**20, "attention_ms": attention_ms, "read_gb_per_s": cache_bytes / stream_ms / 1e6,
            **memory}


def measure_interleaved(modes, context: int, arch: str, training_length: int, steps: int) -> list:
    """Every mode in one process, their steps alternated (mode 1, mode 2, ..., mode 1, ...), so that the machine's
    drift and other jobs weigh on each mode alike: the median ms/token of each, and its ratio to the first mode's."""
    import torch

    from lex_plugin.evaluation.length_eval import blockwise_forward

    torch.set_num_threads(benchmark.thread_count())
    runs = [(label, benchmark.bench_model(label, arch, training_length)[0], {}) for label in modes]
    tokens = torch.randint(4, benchmark.BENCH_VOCAB_SYMBOLS, (1, context + steps + 4))
    times = {label: [] for label in modes}
    with torch.no_grad():
        for label, model, state in runs:
            for _ in blockwise_forward(model, tokens[:, :context], training_length // 2, state, features_only=True):
                pass
        for n in range(context + 1, context + steps + 1):
            for label, model, state in runs:
                start = time.perf_counter()
                model(tokens[:, :n], incremental_state=state)
                times[label].append(time.perf_counter() - start)
    medians = {label: 1000 * sorted(t)[len(t) // 2] for label, t in times.items()}
    return [{"mode": label, "context": context, "ms_per_token": medians[label],
             "vs_first": medians[label] / medians[modes[0]]} for label in modes]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="1024,4096,16384,65536")
    p.add_argument("--modes", default="bca,full", help="among full, bca, bca_sinks (4 sink tokens), lm_infinite (LM-Infinite), rerope, leaky_rerope, "
                                                  "self_extend, dca; +bf16: under bf16 autocast; @RUN: the model of a "
                                                  "scripts/reproduce.py run (full@rnope_swa: its layer pattern)")
    p.add_argument("--training-length", type=int, default=1024)
    p.add_argument("--arch", default="lex_lm_tiny")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--json-out", default=None)
    p.add_argument("--baseline", type=Path, default=None, metavar="PATH",
                   help="also measure every point with PATH/scripts/bench_generation.py (an older checkout)")
    p.add_argument("--interleaved", action="store_true",
                   help="all modes in one process, their steps alternated: ratios to the first mode that the machine's "
                        "drift does not move (ms/token only; no baseline)")
    p.add_argument("--one", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    started = time.perf_counter()
    if args.interleaved:
        if args.baseline is not None:
            p.error("--interleaved measures one checkout: drop --baseline.")
        modes = parse_name_list(args.modes, "--modes")
        if any("+" in m for m in modes):  # each step would open its own autocast region (weights cast at every step)
            p.error("--interleaved runs fp32 modes only: measure +bf16 modes without it (one region per generation).")
        rows = [r for n in parse_int_list(args.contexts, "--contexts")
                for r in measure_interleaved(modes, n, args.arch, args.training_length, args.steps)]
        print(f"{args.arch}, l = {args.training_length}, batch 1, {benchmark.thread_count()} threads, the modes' steps "
              f"alternated in one process, median of {args.steps} steps each\n")
        print(benchmark.markdown_table(["context", "mode", "ms/token", f"/ {modes[0]}"],
                                       [[f"{r['context']:,}", r["mode"], f"{r['ms_per_token']:.2f}", f"{r['vs_first']:.2f}"]
                                        for r in rows]))
        if args.json_out:
            benchmark.write_report(args.json_out, rows, started)
        return
    if args.one:
        benchmark.emit(measure_one(args.one[0], int(args.one[1]), args.arch, args.training_length, args.steps))
        return
    benchmark.check_baseline(p, args.baseline, Path(__file__))
    contexts = parse_int_list(args.contexts, "--contexts")
    modes = parse_name_list(args.modes, "--modes")
    rows = benchmark.sweep(Path(__file__), [(m, n) for n in contexts for m in modes],
                           ["--arch", args.arch, "--training-length", args.training_length, "--steps", args.steps],
                           args.baseline,
                           lambda r: (f"{r['ms_per_token']:7.2f} ms/token  rss +{r['rss_mb_above_start']:7.0f} MB  "
                                      f"peak +{r['peak_mb_above_start']:7.0f} MB  cache {r['cached_positions_per_layer']}"),
                           size_key="context")
    if any("skipped" in r or "skipped" in r.get("baseline", {}) for r in rows):
        raise SystemExit("a point was skipped: " + "; ".join(str(r) for r in rows if "skipped" in r))
    compare = args.baseline is not None
    print(f"\n{args.arch}, training length l = {args.training_length}, batch 1, fp32, "
          f"{benchmark.thread_count()} threads, median of {args.steps} steps"
          + (f"; old: {args.baseline}" if compare else "") + "\n")
    columns = {m: [(f"{m} ms/token", "ms_per_token", "{:.2f}"), (f"{m} RSS MB", "rss_mb_above_start", "{:,.0f}"),
                   (f"{m} cached keys/layer", "cached_positions_per_layer", "{:,}"),
                   (f"{m} prefill s", "prefill_s", "{:.1f}")] for m in modes}
    print(benchmark.sweep_table(rows, contexts, modes, columns, compare, "context", "context", "{:,}"))
    print("\nA step against the memory floor (same process: reading every layer's cached keys and values once; "
          "the attention kernels' time per step in a profile; the cache's bytes at the bandwidth of summing a "
          "contiguous array as large):\n")
    print(benchmark.markdown_table(
        ["mode", "context", "ms/token", "cache read ms", "cache MB", "step / read", "attention ms", "read GB/s",
         "attention GB/s"],
        [[r["mode"], f"{r['context']:,}", f"{r['ms_per_token']:.2f}", f"{r['cache_read_ms']:.2f}", f"{r['cache_mb']:,.0f}",
          f"{r['ms_per_token'] / r['cache_read_ms']:.2f}", f"{r['attention_ms']:.2f}", f"{r['read_gb_per_s']:.1f}",
          f"{r['cache_mb'] * 2**20 / r['attention_ms'] / 1e6:.1f}"] for r in rows]))
    if args.json_out:
        benchmark.write_report(args.json_out, rows, started)


if __name__ == "__main__":
    main()
