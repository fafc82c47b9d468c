#!/usr/bin/env python
"""How near its limits each CPU step runs, every figure a ratio measured in one process against a reference written
here: a generation step against a minimal eager loop of the same shape, bf16 against fp32, and the prefill's FLOP/s
against the same process's matrix-multiply FLOP/s.

    python scripts/bench_limits.py [--sections generation,prefill] [--contexts 1024,16384] [--lengths 4096,...,32768]
    python scripts/bench_limits.py --json-out limits.json      # the report: rows and provenance (command, commit ...)
    python scripts/bench_limits.py --markdown limits.json      # its tables, as BENCHMARKS.md gives them

**generation**: per context N, every model is fed N tokens, then their steps are timed in turns: each model takes a
block of ``--steps`` / 4 steps inside one autocast region, as ``lex generate``'s loop opens one (after one untimed
step that brings its weights back into the caches and lets autocast cast them), the models one after another, four
rounds; the median ms of each over its steps. Drift on a shared machine hits all alike:

- ``lex`` (``full``, ``bca``, ``dca``, each in fp32 and under ``+bf16`` autocast): the step ``lex generate`` takes
  (``generation.continue_ids``: the model called on the buffer so far with its cache, the last logits'
  argmax), ``lex_lm_tiny`` with xPos;
- ``eager`` (``full`` and ``bca``): :class:`EagerLM`, the minimal loop a reader would write for the same shape (4
  layers, C = 256, 4 heads, FFN 1,024, tied output, a preallocated key/value cache, RoPE on q and k from a precomputed
  table, one SDPA call per layer over the cache; ``bca`` reads the keys BCA lets the step see, from the start of the block before its own).

**prefill**: one forward of L tokens to the final hidden states (``features_only``, as ``bench_attention.py``) under
``full``, ``bca`` and ``sliding``; its FLOPs are counted as 24 C^2 per token and layer for the projections and FFN,
and 4 C per attended (query, key) pair and layer for QK^T and PV (the pairs the window allows, ``visible_keys``: useful
FLOPs, not what a blocked kernel computes and masks);
FLOP/s = FLOPs / the best of ``--repeats`` wall times, against the best FLOP/s of a 2,048^3 fp32 ``torch.mm`` timed
right after each point in the same process (``mm_gflops``) and against the best of those over the run
(``best_mm_gflops``, the machine's capability: a reference taken while the machine slows flatters its point). The first layer's self-attention module
is also timed alone (its four projections, 8 C^2 FLOPs a token, and the attended pairs): ``attention_fraction_of_mm``.
"""

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lex_plugin.experiments import benchmark  # noqa: E402
from lex_plugin.experiments.benchmark_tables import limits_markdown  # noqa: E402
from lex_plugin.options import parse_int_list, parse_name_list  # noqa: E402

LEX_MODES = ("full", "bca", "dca", "full+bf16", "bca+bf16", "dca+bf16")
ROUNDS = 4  # blocks of steps per model, the models taking turns
EAGER_MODES = ("full", "bca")


class EagerLM(torch.nn.Module):
    """The minimal eager decoder a generation step is compared with: pre-norm layers of fused q/k/v, RoPE (a
    precomputed (positions, D/2) table), SDPA over a preallocated (1, H, cap, D) cache, an output projection, a GELU
    FFN; a final norm and the tied embedding as output. Shapes of ``lex_lm_tiny`` by default. ``block``: a step reads
    the keys BCA lets it see, from the start of the block before its own (blocks of ``block`` positions; None: all)."""

    def __init__(self, vocab: int, layers: int = 4, dim: int = 256, heads: int = 4, ffn: int = 1024,
                 capacity: int = 20000, block=None):
        super().__init__()
        self.heads, self.head_dim, self.block = heads, dim // heads, block
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(torch.nn.ModuleDict({
            "ln1": torch.nn.LayerNorm(dim), "qkv": torch.nn.Linear(dim, 3 * dim), "out": torch.nn.Linear(dim, dim),
            "ln2": torch.nn.LayerNorm(dim), "fc1": torch.nn.Linear(dim, ffn), "fc2": torch.nn.Linear(ffn, dim)})
            for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        inv = 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        angles = torch.arange(capacity).float()[:, None] * inv[None]
        self.cos, self.sin = angles.cos(), angles.sin()
        self.k = torch.zeros(layers, 1, heads, capacity, self.head_dim)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def _rotate(self, x, start: int):
        t = x.size(2)
        cos, sin = self.cos[start:start + t], self.sin[start:start + t]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)

    @torch.no_grad()
    def forward(self, tokens):
        """(1, T) new tokens after the cached ones -> (1, V) logits of the last."""
        t, start = tokens.size(1), self.length
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            q, k, v = layer["qkv"](layer["ln1"](x)).view(1, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            self.k[i, :, :, start:start + t] = self._rotate(k, start)
            self.v[i, :, :, start:start + t] = v
            first = 0 if self.block is None or t > 1 else max(0, (start // self.block - 1) * self.block)
            a = F.scaled_dot_product_attention(self._rotate(q, start), self.k[i, :, :, first:start + t],
                                               self.v[i, :, :, first:start + t], is_causal=t > 1)
            x = x + layer["out"](a.transpose(1, 2).reshape(1, t, -1))
            x = x + layer["fc2"](F.gelu(layer["fc1"](layer["ln2"](x))))
        self.length += t
        return F.linear(self.norm(x[:, -1]), self.embed.weight)


def generation(contexts, l: int, steps: int) -> list:
    """ms per generated token of every lex mode and eager loop, interleaved, per context (module docstring)."""
    from lex_plugin.evaluation.length_eval import blockwise_forward

    rows = []
    for n in contexts:
        runners = {}
        for mode in LEX_MODES:
            model, d, _, spec = benchmark.bench_model(mode, "lex_lm_tiny", l)
            tokens = torch.randint(d.nspecial, len(d), (1, n + steps + ROUNDS + 2))
            state: dict = {}
            with torch.no_grad(), model.decoder.autocast_context(tokens.device):
                for _ in blockwise_forward(model, tokens[:, :n], l // 2, state, features_only=True):
                    pass

            def step(k, model=model, tokens=tokens, state=state):  # lex generate's step: the buffer so far, its cache
                logits, _ = model(tokens[:, :k], incremental_state=state)
                return int(logits[0, -1].float().argmax())

            # continue_ids opens one autocast region around every step (autocast casts the fp32 weights once in it)
            runners[f"lex {mode}"] = (step, lambda model=model, tokens=tokens: model.decoder.autocast_context(tokens.device))
        for mode in EAGER_MODES:
            eager = EagerLM(benchmark.BENCH_VOCAB_SYMBOLS + 4, capacity=n + steps + ROUNDS + 4,
                            block=l // 2 if mode == "bca" else None).eval()
            tokens = torch.randint(4, eager.embed.num_embeddings, (1, n + steps + ROUNDS + 2))
            eager(tokens[:, :n])
            runners[f"eager {mode}"] = (lambda k, eager=eager, tokens=tokens: int(eager(tokens[:, k - 1:k]).argmax()),
                                        contextlib.nullcontext)
        times = {name: [] for name in runners}
        done = {name: n for name in runners}
        for _ in range(ROUNDS):  # each model its block of steps in turn: warm caches within a block, drift shared
            for name, (step, region) in runners.items():
                with torch.no_grad(), region():
                    step(done[name] + 1)  # the block's first step brings the model's weights back: untimed
                    for k in range(done[name] + 2, done[name] + 2 + steps // ROUNDS):
                        t = time.perf_counter()
                        step(k)
                        times[name].append(time.perf_counter() - t)
                done[name] += 1 + steps // ROUNDS
        ms = {name: 1000 * statistics.median(ts) for name, ts in times.items()}
        row = {"section": "generation", "context": n, "ms": ms,
               "lex_full_vs_eager_full": ms["lex full"] / ms["eager full"],
               "lex_bca_vs_eager_bca": ms["lex bca"] / ms["eager bca"],
               **{f"bf16_vs_fp32_{m}": ms[f"lex {m}+bf16"] / ms[f"lex {m}"] for m in ("full", "bca", "dca")}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def attended_pairs(spec, length: int) -> int:
    """(query, key) pairs the window lets attend in a causal pass over ``length`` positions."""
    return int(spec.window.visible_keys(torch.arange(length)).sum())


def mm_gflops(repeats: int = 5, size: int = 2048) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size ** 3 / benchmark.best_time(lambda: torch.mm(a, b), repeats) / 1e9


def prefill(lengths, l: int, repeats: int) -> list:
    """FLOP/s of one forward under full, BCA and the sliding window against the process's matmul FLOP/s."""
    rows = []
    for mode in ("full", "bca", "sliding"):
        model, d, _, spec = benchmark.bench_model(mode, "lex_lm_tiny", l)
        layers, dim = len(model.decoder.layers), model.decoder.embed_dim
        for length in lengths:
            tokens = torch.randint(d.nspecial, len(d), (1, length))
            with torch.no_grad():
                model(tokens[:, :256], features_only=True)
                seconds = benchmark.best_time(lambda: model(tokens, features_only=True), repeats)
            # one layer's attention alone (its q, k, v and output projections, 8 C^2 a token, and the attended pairs)
            attention = model.decoder.layers[0].self_attn
            x = torch.randn(1, length, dim)
            layer_spec, scheme = model.decoder.layer_spec(0, spec), model.decoder.position(0)
            with torch.no_grad():
                attention_s = benchmark.best_time(lambda: attention(x, scheme, spec=layer_spec), repeats)
            peak = mm_gflops()  # beside each point: the machine's state then
            pairs = attended_pairs(spec, length)
            flops = layers * (24 * dim * dim * length + 4 * dim * pairs)
            attention_flops = 8 * dim * dim * length + 4 * dim * pairs
            row = {"section": "prefill", "mode": mode, "length": length, "seconds": seconds,
                   "gflops": flops / seconds / 1e9, "mm_gflops": peak, "fraction_of_mm": flops / seconds / 1e9 / peak,
                   "attention_seconds": attention_s, "attention_fraction_of_mm": attention_flops / attention_s / 1e9 / peak,
                   "attention_share_of_flops": 4 * dim * pairs / (24 * dim * dim * length + 4 * dim * pairs)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return against_best_mm(rows)


def against_best_mm(rows: list) -> list:
    """The prefill rows with their fractions also against the best matmul FLOP/s of the whole run (``best_mm_gflops``:
    the machine's capability; a point's own reference drops when the machine slows then, which flatters it)."""
    best = max(r["mm_gflops"] for r in rows)
    return [dict(r, best_mm_gflops=best, fraction_of_best_mm=r["gflops"] / best,
                 attention_fraction_of_best_mm=r["attention_fraction_of_mm"] * r["mm_gflops"] / best) for r in rows]


def main():
    from lex_plugin.provenance import provenance

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="generation,prefill")
    p.add_argument("--contexts", default="1024,16384")
    p.add_argument("--lengths", default="4096,8192,16384,32768")
    p.add_argument("--training-length", type=int, default=1024)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json-out", default=None, help="the report: its rows and provenance")
    p.add_argument("--markdown", default=None, metavar="REPORT", help="print the tables of a report and exit")
    args = p.parse_args()
    if args.markdown:
        print(limits_markdown(json.loads(Path(args.markdown).read_text())))
        return
    sections = parse_name_list(args.sections, "--sections")
    unknown = sorted(set(sections) - {"generation", "prefill"})
    if unknown:
        p.error(f"--sections: unknown {unknown}; choose among generation, prefill")
    start = time.perf_counter()
    torch.manual_seed(0)
    torch.set_num_threads(benchmark.thread_count())
    rows = []
    if "generation" in sections:
        rows += generation(parse_int_list(args.contexts, "--contexts"), args.training_length, args.steps)
    if "prefill" in sections:
        rows += prefill(parse_int_list(args.lengths, "--lengths"), args.training_length, args.repeats)
    report = {"provenance": provenance(seed=0, wall_s=time.perf_counter() - start, cuda=False), "rows": rows}
    print(f"\nlex_lm_tiny (xPos), l = {args.training_length}, batch 1, {benchmark.thread_count()} threads\n")
    print(limits_markdown(report))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
