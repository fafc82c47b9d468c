#!/usr/bin/env python
"""Generation through Hugging Face ``generate()`` on the exported model against ``lex generate``'s loop on the
same weights, and against a transformers ``LlamaForCausalLM`` of the same size with random weights (SDPA).

    python scripts/bench_hf_generate.py [--contexts 1024,16384] [--steps 64] [--mode full]

For each (engine, context N), in a fresh process: a random lex_lm (``--arch``, l = ``--training-length``,
vocabulary 8192, tied embeddings) is built; ``lex`` runs ``generation.continue_ids`` (what
``lex generate`` and ``LexHubInterface.continue_tokens`` run: one parallel pass over the prompt, then one token
per step through the key/value cache), ``hf`` runs ``generate()`` of the same weights written as a self-contained
export and loaded with ``AutoModelForCausalLM.from_pretrained(trust_remote_code=True)`` (the export's own copy of
the code; greedy, ``LexCache``), ``llama`` runs ``LlamaForCausalLM.generate`` (hidden size, layers, heads and FFN width of the
lex model, SDPA attention, DynamicCache). Each engine generates 1 + ``--steps`` tokens after the same N-token
prompt, ``--repeats`` times after a warm-up call; the end of every step is time-stamped (lex: when the model
returns; transformers: a logits processor, called once per step), and ms/token is the median over the repeats
of the steps after the first (the prompt's pass), so the prompt's own time, which varies from run to run by
more than a step costs, never enters. Memory: the peak
resident memory of the process above its state before the model was built. Every point runs in ``--rounds``
processes, the engines taking turns, and the median is reported with the range: between processes the same
engine's step time varies by up to 20% on this machine, more than the engines differ. Results are recorded in
examples/lex_lm/BENCHMARKS.md.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lex_plugin.experiments import benchmark  # noqa: E402
from lex_plugin.options import parse_int_list, parse_name_list  # noqa: E402

ENGINES = ("lex", "hf", "llama")


def build(engine: str, arch: str, training_length: int, mode: str, stamps: list):
    """(generate(prompt (1, N), new tokens) -> None, the model) for one engine; every step appends
    ``time.perf_counter()`` to ``stamps`` when its logits are ready."""
    import argparse as ap

    import torch
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.generation import continue_ids
    from lex_plugin.models.builder import build_random_lm
    from lex_plugin.modules.attention import AttentionOptions

    options = AttentionOptions(mode)
    model, d = build_random_lm(arch, vocab_size=benchmark.BENCH_VOCAB_SYMBOLS, tokens_per_sample=training_length,
                               share_decoder_input_output_embed=True)
    if engine == "lex":
        model = model.under(options.spec(training_length))

        def timed(*args, **kwargs):
            out = model(*args, **kwargs)
            stamps.append(time.perf_counter())
            return out

        return (lambda prompt, n: continue_ids(timed, prompt[0], n, d.eos(), d.pad(), temperature=0)), model
    from transformers import LogitsProcessor, LogitsProcessorList

    args = ap.Namespace(arch=arch, tokens_per_sample=training_length, share_decoder_input_output_embed=True)
    ARCH_CONFIG_REGISTRY[arch](args)
    if engine == "hf":  # the self-contained export, loaded as its users load it (its own copy of the package's code)
        import tempfile

        from transformers import AutoModelForCausalLM

        from lex_plugin.export.hf import from_fairseq, hf_config, save_model

        with tempfile.TemporaryDirectory(prefix="bench_hf_") as directory:  # loaded into memory: removed after
            save_model(from_fairseq(model, hf_config(args, d, training_length, options)), Path(directory))
            hf = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True).eval()
        if type(hf).__module__.startswith("lex_plugin"):
            raise RuntimeError("the hf engine must run the export's code, not the package's")
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=len(d), hidden_size=args.decoder_embed_dim, num_hidden_layers=args.decoder_layers,
                             num_attention_heads=args.decoder_attention_heads, intermediate_size=args.decoder_ffn_embed_dim,
                             max_position_embeddings=1 << 20, tie_word_embeddings=True, pad_token_id=d.pad(),
                             bos_token_id=d.eos(), eos_token_id=d.eos(), attn_implementation="sdpa")
        torch.manual_seed(0)
        hf = LlamaForCausalLM(config).eval()

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    def generate(prompt, n):
        hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=d.pad(),
                    logits_processor=LogitsProcessorList([Stamp()]))

    return generate, hf


def measure_one(engine: str, context: int, arch: str, training_length: int, steps: int, mode: str, repeats: int) -> dict:
    import torch

    torch.set_num_threads(benchmark.thread_count())
    base = benchmark.rss_mb()
    stamps = []
    generate, model = build(engine, arch, training_length, mode, stamps)
    prompt = torch.randint(4, benchmark.BENCH_VOCAB_SYMBOLS + 4, (1, context))
    step_ms, prompt_s = [], []
    with torch.no_grad():
        for run in range(repeats + 1):  # the first is a warm-up (allocator, one-time set-up), left out
            stamps.clear()
            start = time.perf_counter()
            generate(prompt, steps + 1)
            if len(stamps) != steps + 1:
                raise RuntimeError(f"{engine}: {len(stamps)} time stamps for {steps + 1} steps")
            if run:
                step_ms += [1000 * (b - a) for a, b in zip(stamps, stamps[1:])]
                prompt_s.append(stamps[0] - start)
    params = sum(p.numel() for p in model.parameters())
    return {"engine": engine, "context": context, "ms_per_token": statistics.median(step_ms), "prefill_s": statistics.median(prompt_s),
            "peak_mb_above_start": benchmark.peak_rss_mb() - base, "parameters": params}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="1024,16384")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"among {', '.join(ENGINES)}")
    p.add_argument("--mode", default="full", help="the lex models' attention (AttentionOptions mode): full, bca, ...")
    p.add_argument("--training-length", type=int, default=1024)
    p.add_argument("--arch", default="lex_lm_tiny")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="generate calls after a warm-up call; the median is over all their steps")
    p.add_argument("--rounds", type=int, default=3,
                   help="every (engine, context) process this many times, the engines taking turns; the median is reported")
    p.add_argument("--json-out", default=None)
    p.add_argument("--one", nargs=2, metavar=("ENGINE", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    started = time.perf_counter()
    if args.one:
        benchmark.emit(measure_one(args.one[0], int(args.one[1]), args.arch, args.training_length, args.steps, args.mode,
                                   args.repeats))
        return
    contexts = parse_int_list(args.contexts, "--contexts")
    engines = parse_name_list(args.engines, "--engines")
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        p.error(f"unknown engines {unknown}; choose among {', '.join(ENGINES)}")
    rows = benchmark.sweep(Path(__file__), [(e, n) for _ in range(args.rounds) for n in contexts for e in engines],
                           ["--arch", args.arch, "--training-length", args.training_length, "--steps", args.steps,
                            "--mode", args.mode, "--repeats", args.repeats], None,
                           lambda r: f"{r['ms_per_token']:7.2f} ms/token  peak +{r['peak_mb_above_start']:7.0f} MB",
                           size_key="context")
    if any("skipped" in r for r in rows):
        raise SystemExit("a point was skipped: " + "; ".join(str(r) for r in rows if "skipped" in r))
    print(f"\n{args.arch} ({rows[0]['parameters']:,} parameters), {args.mode} attention, l = {args.training_length}, "
          f"batch 1, fp32, {benchmark.thread_count()} threads, greedy; per process the median of {args.repeats} x {args.steps} "
          f"steps after a warm-up call; the median (and range) over {args.rounds} processes per point, engines taking turns\n")
    by = {}
    for key in {(r["engine"], r["context"]) for r in rows}:
        runs = [r for r in rows if (r["engine"], r["context"]) == key]
        by[key] = {k: statistics.median(r[k] for r in runs) for k in ("ms_per_token", "peak_mb_above_start", "prefill_s")}
        by[key]["range"] = f"{min(r['ms_per_token'] for r in runs):.2f}-{max(r['ms_per_token'] for r in runs):.2f}"
    header = (["context"] + [f"{e} ms/token" for e in engines] + [f"{e} range" for e in engines]
              + [f"{e} peak MB" for e in engines] + [f"{e} prompt s" for e in engines])
    if "lex" in engines and "hf" in engines:
        header.append("hf speed / lex")
    table = []
    for n in contexts:
        row = ([f"{n:,}"] + [f"{by[e, n]['ms_per_token']:.2f}" for e in engines] + [by[e, n]["range"] for e in engines]
               + [f"{by[e, n]['peak_mb_above_start']:,.0f}" for e in engines] + [f"{by[e, n]['prefill_s']:.1f}" for e in engines])
        if "lex" in engines and "hf" in engines:
            row.append(f"{by['lex', n]['ms_per_token'] / by['hf', n]['ms_per_token']:.2f}x")
        table.append(row)
    print(benchmark.markdown_table(header, table))
    if args.json_out:
        benchmark.write_report(args.json_out, rows, started)


if __name__ == "__main__":
    main()
