"""Attention on the first token, per layer: the share of each query's attention that goes to position 0, the
"attention sink" (Xiao et al. 2024; Qiu et al. 2025, Gated Attention for Large Language Models, section 4.3: 46.7% of
the attention without the output gate, 4.8% with it, averaged over the layers of their 1.7B model).

:func:`first_token_mass` averages softmax(q k^T / sqrt(d) + bias)[n, 0] over the queries n = 1 .. L - 1 of each text
(query 0 sees only itself) and over texts, per layer and head, from the logits the attention executor computes
(the model's ``observer``), under full attention: every chunk's keys then start at position 0, and a query's
distance to its first key is its own position. In a ``--layer-pattern`` the global layers are measured so; the local
layers, whose windows (and chunks) start past position 0 for most queries, are not (NaN).
"""

import torch
from torch import Tensor

from ..evaluation.length_eval import blockwise_forward
from ..modules.attention.spec import FULL_SPEC

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
            text's would be overstated), a sink token (position 0 is the sink, ahead of the text), differential
            attention (two maps per head), landmark tokens (a grouped softmax), or a pattern without a global layer
            (nothing to measure).
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
    if any(design.takes_attention for design in attention.designs):
        raise ValueError("this checkpoint takes attention as several maps over the same keys (--differential-attention): "
                         "each map's probabilities would be counted as one head's. Measure models with one softmax.")
    if any(design.interleave(decoder) is not None for _, design in getattr(decoder, "designs", ())):
        raise ValueError("this checkpoint has landmark tokens (--landmark-block-size): its landmark layers weigh an "
                         "earlier block's tokens by their landmark's share, not by one softmax over the observed logits, "
                         "and its positions count the landmarks. Measure models without them.")
    local = [i for i in range(len(decoder.layers)) if decoder.layer_spec(i, FULL_SPEC).window.bounded]
    if len(local) == len(decoder.layers):
        raise ValueError("this checkpoint's --layer-pattern has no global layer: every layer's window starts past "
                         "position 0 for most queries; measure models with a */full entry.")
    heads = attention.num_heads
    sums = torch.zeros(len(decoder.layers), heads, dtype=torch.float64)

    def observe(layer: int, logits: Tensor, distance: Tensor, visible: Tensor) -> None:
        if layer in local:
            return
        probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)  # (B, H, Tq, Tk), key 0 first
        later = (distance[..., :, 0] > 0).to(probs.dtype)  # (Tq,): the query's position n = its distance to key 0
        sums[layer] += (probs[..., 0] * later).double().sum(dim=(0, 2)).cpu()

    chunk = max(1, CHUNK_ELEMENTS // max(1, bsz * heads * length))
    for _ in blockwise_forward(model, tokens, min(chunk, length), spec=FULL_SPEC, observer=observe, features_only=True):
        pass
    mass = sums / (bsz * (length - 1))
    mass[local] = float("nan")  # a local layer: not measured
    return mass
