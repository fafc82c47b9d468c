"""Attention on the first token, per layer: the share of each query's attention that goes to position 0, the
"attention sink" (Xiao et al. 2024; Qiu et al. 2025, Gated Attention for Large Language Models, section 4.3: 46.7% of
the attention without the output gate, 4.8% with it, averaged over the layers of their 1.7B model).

:func:`first_token_mass` averages softmax(q k^T / sqrt(d) + bias)[n, 0] over the queries n = 1 .. L - 1 of each text
(query 0 sees only itself) and over texts, per layer and head, from the logits the attention executor computes
(the model's ``observer``), under full attention: every chunk's keys then start at position 0, and a query's
distance to its first key is its own position. In a ``--layer-pattern`` the global layers are measured so; the local
layers, whose windows (and chunks) start past position 0 for most queries, are not (NaN).

In a landmark layer (Mohtashami & Jaggi 2023, section 3.1) the weight on token 0 is the paper's AttWeight, not one
softmax over the observed logits: a query of block 0 weighs it within its own block's softmax; a later query gives it
block 0's landmark's share of its softmax (zero where a top-k leaves that landmark out) times token 0's softmax within
block 0. The landmarks' own queries are left out (their outputs are dropped), and the first token keeps position 0.

Under differential attention (Ye et al., ICLR 2025, Eq. 1) a head's weights are p1 - lambda p2, which sum to
1 - lambda over the keys; the share on token 0 is (p1 - lambda p2)[0] / (1 - lambda), each map's probabilities
observed from its own executor call (the first map's calls come first, then the second's, chunk for chunk).
"""

import torch
from torch import Tensor

from ..evaluation.length_eval import blockwise_forward
from ..modules.attention.retrieval import LandmarkRetrieval
from ..modules.attention.spec import FULL_SPEC
from ..modules.designs.differential_attention import DifferentialAttention, diff_lambda

__all__ = ["first_token_mass"]

CHUNK_ELEMENTS = 2**24  # logits per chunk of queries


@torch.no_grad()
def first_token_mass(model, tokens: Tensor) -> Tensor:
    """Mean attention probability on position 0 under full attention, per layer and head.

    Args:
        model: a lex_lm model (eval mode).
        tokens: (B, L) int64 token ids, L >= 2, no padding.

    Returns:
        (layers, H) float64: the mean over texts and queries 1 .. L - 1 of each query's probability on key 0; NaN in
        the rows of a pattern's local layers (a bounded window: not measured).

    Raises:
        ValueError: L < 2; a model with learned sink logits (their share of the softmax is not observed, so the
            text's would be overstated), a sink token (position 0 is the sink, ahead of the text), a design that
            takes attention otherwise than one softmax or differential attention's two, or a pattern without a global
            layer (nothing to measure).
        RuntimeError: a differential layer whose lambda is >= 1 (its weights would sum to 1 - lambda <= 0).
    """
    decoder = model.decoder
    bsz, length = tokens.shape
    if length < 2:
        raise ValueError(f"the first token's attention needs texts of >= 2 tokens, got {length}.")
    if getattr(decoder, "sink_positions", 0):
        raise ValueError("this checkpoint was trained with --sink-token: position 0 is its sink, ahead of the text; "
                         "measure the first token's share on models without it.")
    attention = decoder.layers[0].self_attn
    if getattr(attention, "sink_logits", None) is not None:
        raise ValueError("this checkpoint has learned sink logits (--learned-sinks): the sink's share of each softmax is "
                         "not observed, so the first token's would be overstated. Measure models without them.")
    taker = next((d for d in attention.designs if d.takes_attention), None)
    if taker is not None and not isinstance(taker, DifferentialAttention):
        raise ValueError(f"this checkpoint takes attention by {type(taker).__name__}, whose weights this measure does "
                         "not know; measure models with one softmax or differential attention.")
    local = [i for i in range(len(decoder.layers)) if decoder.layer_spec(i, FULL_SPEC).window.bounded]
    if len(local) == len(decoder.layers):
        raise ValueError("this checkpoint's --layer-pattern has no global layer: every layer's window starts past "
                         "position 0 for most queries; measure models with a */full entry.")
    heads = attention.num_heads
    sums = torch.zeros(len(decoder.layers), heads, dtype=torch.float64)
    retrievals = {i: d.retrieval(layer.self_attn) for i, layer in enumerate(decoder.layers)
                  for d in layer.self_attn.designs if d.retrieves}
    grouped = {i: r for i, r in retrievals.items() if isinstance(r, LandmarkRetrieval)}
    period = next(iter(grouped.values())).period if grouped else None  # the decoder's landmarks, in every layer
    two_maps = {i: float(diff_lambda(layer.self_attn)) for i, layer in enumerate(decoder.layers)
                if taker is not None and i not in local}  # differential attention: lambda of each measured layer
    pending = {i: [] for i in two_maps}  # each map's (B, H, Tq) weight on key 0 and its queries' mask, in call order

    def observe(layer: int, logits: Tensor, distance: Tensor, visible: Tensor) -> None:
        if layer in local:
            return
        n = distance[..., :, 0]  # (Tq,): the query's position = its distance to key 0
        later = n > 0
        if period is not None:  # a landmark's query: its output is dropped
            later = later & (n % period != period - 1)
        z = logits.masked_fill(~visible, float("-inf")).double()  # (B, H, Tq, Tk), key 0 first
        on_first = landmark_weight(z, n, grouped[layer]) if layer in grouped else torch.softmax(z, dim=-1)[..., 0]
        if layer in two_maps:
            pending[layer].append((on_first, later))
            return
        sums[layer] += (on_first * later).sum(dim=(0, 2)).cpu()

    def difference() -> None:  # after a forward: each two-map layer's first-map calls, then as many second-map ones
        for layer, seen in pending.items():
            half, lam = len(seen) // 2, two_maps[layer]
            if len(seen) != 2 * half or lam >= 1.0:
                raise RuntimeError(f"layer {layer}: {len(seen)} observed maps (two per call expected) and lambda {lam:.3f} "
                                   "(the weights sum to 1 - lambda, which must be positive).")
            for (one, later), (two, _) in zip(seen[:half], seen[half:]):
                sums[layer] += ((one - lam * two) / (1.0 - lam) * later).sum(dim=(0, 2)).cpu()
            seen.clear()

    chunk = max(1, CHUNK_ELEMENTS // max(1, bsz * heads * length))
    for _ in blockwise_forward(model, tokens, min(chunk, length), spec=FULL_SPEC, observer=observe, features_only=True):
        difference()
    mass = sums / (bsz * (length - 1))
    mass[local] = float("nan")  # a local layer: not measured
    return mass


def landmark_weight(logits: Tensor, query: Tensor, retrieval: LandmarkRetrieval) -> Tensor:
    """AttWeight on key 0 under landmark attention's grouped softmax (Mohtashami & Jaggi 2023, section 3.1), from the
    logits a landmark layer's queries see.

    Args:
        logits: (B, H, Tq, Tk) float, keys from position 0 (position = index), -inf where a query does not see a key
            (later keys; with a top-k, the unchosen landmarks and their blocks).
        query: (Tq,) int64, each query's position (landmarks counted).
        retrieval: the layer's landmarks (block b, period b + 1).

    Returns:
        (B, H, Tq) float: a query of block 0, key 0's share of the softmax over its own block; a later query, block 0's
        landmark's share of the softmax over its own block and the earlier landmarks it sees, times key 0's softmax
        within block 0 (zero where it does not see that landmark).
    """
    b, period = retrieval.block, retrieval.period
    tk = logits.size(-1)
    key = torch.arange(tk, device=logits.device)
    landmark = key % period == b  # (Tk,)
    q_block, k_block = (query // period)[:, None], (key // period)[None]  # (Tq, 1), (1, Tk)
    outer = ((k_block == q_block) & ~landmark) | (landmark & (k_block < q_block))  # (Tq, Tk): the query's softmax
    lse_outer = torch.logsumexp(logits.masked_fill(~outer, float("-inf")), dim=-1)  # (B, H, Tq)
    direct = torch.exp(logits[..., 0] - lse_outer)
    if tk <= b:  # no landmark among the keys: every query is in block 0
        return direct
    chosen = torch.isfinite(logits[..., b])  # (B, H, Tq): block 0's landmark seen
    lse_inner = torch.logsumexp(logits[..., :b], dim=-1).masked_fill(~chosen, 0.0)
    via = torch.exp(logits[..., b].masked_fill(~chosen, float("-inf")) - lse_outer) * torch.exp(logits[..., 0] - lse_inner)
    return torch.where(q_block[:, 0] == 0, direct, torch.where(chosen, via, torch.zeros_like(via)))
