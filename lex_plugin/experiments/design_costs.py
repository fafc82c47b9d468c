"""The verdict's cost figures of one trained design, measured in one process against its base model.

A design (a run of ``scripts/reproduce.py``: its layer pattern, sinks, temperatures) and its base (the run's --pos-emb
and depth under full attention, ``benchmark.design_of``'s ``full@base:RUN``) are built with random weights in the
same process, and every measurement alternates the two, so the machine's drift and other jobs weigh on both alike:

- **evaluation time**: a batch-1 forward of ``context`` tokens to the final hidden states (the L x V logits cost the
  same in both), the best of ``repeats`` after a warm-up; the figure is design / base;
- **generation time**: after a prefill of ``context`` tokens block by block through the key/value cache, 2l
  single-token steps, the two models' steps alternated; the figure is the median ms/token, design / base;
- **cache**: the key/value positions each layer holds, read from the cache after the prefill and after every step.
  Over the 2l steps a layer either grows by one position a step (it keeps every position) or returns to what it held
  (a window, a chunk or BCA's blocks: its count repeats with a period dividing 2l); the figure is the positions all
  layers keep at :data:`CACHE_CONTEXT`: a growing layer extended to it, a bounded layer at the most it held, design /
  base. A layer that does neither is refused rather than guessed.

The verdict's reference methods (:data:`REFERENCE_MODES`: an evaluation mode of a model trained without a design,
LeX's BCA or ReRoPE) are measured the same way: the model under that mode against the same model under full attention.

The random weights leave every figure as trained weights would: the time does not depend on the training.
"""

import statistics
import time
from typing import Dict, List, Tuple

import torch

from . import benchmark

__all__ = ["CACHE_CONTEXT", "REFERENCE_MODES", "base_mode", "measure_design_costs"]

CACHE_CONTEXT = 65536  # the verdict's cache goal is read at 64k
# the verdict's reference rows (verdict_reference.json's names): (attention mode at evaluation, --pos-emb); each is
# compared with the same model under full attention
REFERENCE_MODES: Dict[str, Tuple[str, str]] = {"xpos+bca": ("bca", "xpos"), "xpos+rerope": ("rerope", "xpos"),
                                               "rope+rerope": ("rerope", "rope"), "alibi+rerope": ("rerope", "alibi")}


def base_mode(run: str) -> str:
    """The benchmark mode of run ``run``'s base model: its --pos-emb and depth under full attention (``full@base:RUN``);
    for a reference method (:data:`REFERENCE_MODES`), its model under full attention (``full`` with its --pos-emb)."""
    if run in REFERENCE_MODES:
        return f"full (--pos-emb {REFERENCE_MODES[run][1]})"
    return f"full@base:{run}"


def _cost_models(run: str, arch: str, training_length: int) -> dict:
    """{"design": the model run ``run`` is timed as, "base": what it is compared with}, random weights."""
    if run in REFERENCE_MODES:
        mode, pos_emb = REFERENCE_MODES[run]
        return {"design": benchmark.bench_model(mode, arch, training_length, pos_emb=pos_emb)[0],
                "base": benchmark.bench_model("full", arch, training_length, pos_emb=pos_emb)[0]}
    return {"design": benchmark.bench_model(f"full@{run}", arch, training_length)[0],
            "base": benchmark.bench_model(base_mode(run), arch, training_length)[0]}


def _kept(model, state: dict) -> List[int]:
    """The key positions each layer's cache holds now (its sink tokens included)."""
    return [int(layer.self_attn.cached_keys(state)) for layer in model.decoder.layers]


def _positions_at(start: List[int], end: List[int], peak: List[int], steps: int, at: int, context: int) -> List[int]:
    """Each layer's positions kept at ``at`` from what it held after the prefill (``start``, at ``context``), after
    ``steps`` more tokens (``end``) and at most over them (``peak``): a layer that grew by at least one position a token
    grows at that rate to ``at`` (landmark tokens: one more position every b tokens).

    Raises:
        RuntimeError: a layer that neither grew by at least one position a step nor stayed within ``steps`` positions of
            what it held (it lost more than it could have held in a window).
    """
    out = []
    for i, (s, e, p) in enumerate(zip(start, end, peak)):
        if e - s >= steps:  # keeps every position (and what a design places between the tokens: a landmark per block)
            out.append(e + (at - (context + steps)) * (e - s) // steps)
        elif abs(e - s) < steps:
            # bounded: its count repeats with the window's period (at another phase where a design places positions
            # between the tokens: landmarks shift a window's blocks), its peak over the steps kept
            out.append(p)
        else:
            raise RuntimeError(f"layer {i} held {s} positions at {context} and {e} after {steps} more tokens: neither "
                               f"every position nor a bounded window; its cache at {at} cannot be read from these.")
    return out


@torch.no_grad()
def measure_design_costs(run: str, training_length: int, context: int = 16384, arch: str = "lex_lm_tiny",
                         repeats: int = 3) -> Dict[str, object]:
    """The cost figures of reproduction run ``run`` against its base model, both measured in this process.

    Args:
        run: a run of ``scripts/reproduce.py`` (``catalogue.RUNS``), or a reference method of the verdict
            (:data:`REFERENCE_MODES`); training_length: l (its windows' spans).
        context: the tokens evaluated and read before the generation steps (the verdict's 16k).
        arch: the model preset (``lex_lm_tiny``, the reproduction's); repeats: evaluation forwards per model after the
            warm-up (the best is kept).

    Returns:
        {"run", "base" (its mode), "context", "training_length", "arch", "threads", "eval_s" (best seconds per forward),
        "prefill_s", "ms_per_token" (median), "kept" (positions per layer at CACHE_CONTEXT), each a {"design": ...,
        "base": ...} pair, and the verdict's figures "eval_time", "gen_time", "cache_64k" (design / base)}.

    Raises:
        ValueError: ``run`` is neither a run of the reproduction nor a reference method, or a context not above l.
        RuntimeError: a layer whose cache neither keeps every position nor stays bounded (:func:`_positions_at`).
    """
    from ..evaluation.length_eval import blockwise_forward

    if context <= training_length:
        raise ValueError(f"context {context} must be above the training length {training_length}.")
    torch.set_num_threads(benchmark.thread_count())
    models = _cost_models(run, arch, training_length)
    steps = 2 * training_length
    tokens = torch.randint(4, benchmark.BENCH_VOCAB_SYMBOLS, (1, context + steps))
    forward = {k: (lambda m: lambda: m(tokens[:, :context], features_only=True))(m) for k, m in models.items()}
    for model in models.values():
        model(tokens[:, :256], features_only=True)  # warm-up
    eval_s = {k: [] for k in models}
    for _ in range(repeats):
        for k, fn in forward.items():
            eval_s[k].append(benchmark.best_time(fn, 1))
    states = {k: {} for k in models}
    prefill_s = {}
    for k, model in models.items():
        start = time.perf_counter()
        for _ in blockwise_forward(model, tokens[:, :context], training_length // 2, states[k], features_only=True):
            pass
        prefill_s[k] = time.perf_counter() - start
    start_kept = {k: _kept(m, states[k]) for k, m in models.items()}
    peak = {k: list(v) for k, v in start_kept.items()}
    step_s = {k: [] for k in models}
    for n in range(context + 1, context + steps + 1):
        for k, model in models.items():
            t0 = time.perf_counter()
            model(tokens[:, :n], incremental_state=states[k])  # logits of one token, as in generation
            step_s[k].append(time.perf_counter() - t0)
            peak[k] = [max(p, q) for p, q in zip(peak[k], _kept(model, states[k]))]
    kept = {k: _positions_at(start_kept[k], _kept(m, states[k]), peak[k], steps, CACHE_CONTEXT, context)
            for k, m in models.items()}
    best = {k: min(v) for k, v in eval_s.items()}
    ms = {k: 1000 * statistics.median(v) for k, v in step_s.items()}
    return {"run": run, "base": base_mode(run), "context": context, "training_length": training_length, "arch": arch,
            "threads": benchmark.thread_count(), "eval_s": best, "prefill_s": prefill_s, "ms_per_token": ms,
            "kept": kept, "eval_time": best["design"] / best["base"], "gen_time": ms["design"] / ms["base"],
            "cache_64k": sum(kept["design"]) / sum(kept["base"])}
