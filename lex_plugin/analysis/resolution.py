"""Attention resolution (LeX paper, section 2 and Table 3) and the xPos / RoPE expectation curve (Figure 2).

* ``attention_resolution(s)``: R(s) of Eq. 4 for an expected score s[n] by distance n = 0 .. N,

      R(s) = sum_{i=0}^{N-1} e^{s[i]} (e^{s[i]} - e^{s[i+1]}) / (sum_{i=0}^{N} e^{s[i]})^2,

  which is 1 for a score that puts all weight on distance 0, 0 for a flat one, and negative where s rises
  with distance. Invariant to adding a constant to s (computed after subtracting max s, in float64).
* ``expectation_curve``: g_zeta[n] = sum_i cos(n theta_i) zeta_i^(n/B) of Eq. 10, the logit at distance n
  of q = k = (1, 0, 1, 0, ...): xPos with zeta_i of Eq. 12, RoPE with zeta = 1.
* ``score_by_distance``: the estimate of s[n] from a model's pre-softmax logits a_ij = q_i . k_j / sqrt(d)
  (+ the position bias) of Eq. 5: the mean of a_{i, i-n} over every visible (query, key) pair at distance n,
  over texts and heads, one curve per layer. The logits are the ones the attention executor feeds SDPA
  (the ``observer`` argument of the model's forward), taken while the model runs block by block through
  its cache, so they follow any
  window and any position scheme, and memory stays bounded at any length.
"""

import torch
from torch import Tensor

from ..evaluation.length_eval import blockwise_forward
from ..modules.attention.spec import AttentionSpec
from ..modules.positions.xpos import GAMMA, SCALE_BASE, rope_theta, xpos_zeta

__all__ = ["attention_resolution", "expectation_curve", "score_by_distance"]

CHUNK_ELEMENTS = 2**24  # logits per chunk of queries


def attention_resolution(s) -> float:
    """R(s) (LeX Eq. 4) of a 1-D score by distance (sequence or tensor of N + 1 >= 2 floats).

    Raises:
        ValueError: fewer than 2 distances, or a non-finite score.
    """
    s = torch.as_tensor(s, dtype=torch.float64).flatten()
    if s.numel() < 2:
        raise ValueError(f"attention resolution needs scores at >= 2 distances, got {s.numel()}.")
    if not torch.isfinite(s).all():
        raise ValueError("attention resolution needs finite scores; drop distances nothing was measured at.")
    e = torch.exp(s - s.max())
    return float((e[:-1] * (e[:-1] - e[1:])).sum() / e.sum() ** 2)


def expectation_curve(head_dim: int, max_distance: int, gamma: float = GAMMA, scale_base: float = SCALE_BASE,
                      rope: bool = False) -> Tensor:
    """g[n] for n = 0 .. max_distance (Eq. 10), float64, shape (max_distance + 1,).

    Raises:
        ValueError: odd head_dim or a negative distance.
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"--head-dim must be positive and even, got {head_dim}.")
    if max_distance < 0:
        raise ValueError(f"--max-distance must be >= 0, got {max_distance}.")
    n = torch.arange(max_distance + 1, dtype=torch.float64)[:, None]
    curve = torch.cos(n * rope_theta(head_dim)[None, :])
    if not rope:
        curve = curve * xpos_zeta(head_dim, gamma)[None, :] ** (n / scale_base)
    return curve.sum(-1)


@torch.no_grad()
def score_by_distance(model, tokens: Tensor, spec: AttentionSpec):
    """Sum and count of pre-softmax logits by distance, per layer and head, for one batch of texts.

    Args:
        model: a lex_lm model (eval mode).
        tokens: (B, L) int64 token ids (no padding).
        spec: the attention window and scaling; the forward that feeds each layer and the pairs counted
            both follow it.

    Returns:
        (sums, counts): sums (layers, H, L) float64 of a_{i, i-n} over texts and queries; counts (L,) int64,
        the number of visible pairs at each distance over the batch.

    Raises:
        ValueError: a model trained with ``--sink-token``: its sink key sits at position 0 ahead of the text, and the
            logits are not yet counted apart from it (the text's pairs would be shifted by one); differential
            attention (two maps per head, each observed); MoBA (the keys each head and query sees are its own).
    """
    decoder = model.decoder
    if any(design.takes_attention for design in decoder.layers[0].self_attn.designs):
        raise ValueError("this checkpoint takes attention as several maps over the same keys (--differential-attention): "
                         "the logits of both maps would be averaged into one curve the layer never uses. Analyse models "
                         "with one softmax.")
    if spec.retrieval is not None or any(layer.self_attn._retrieval is not None for layer in decoder.layers):
        raise ValueError("each head and query chooses its keys here (--moba-topk, --retrieval-blocks): a mean logit by "
                         "distance over the pairs a window shows has no one set of pairs. Analyse without block retrieval.")
    if getattr(decoder, "sink_positions", 0):
        raise ValueError("this checkpoint was trained with --sink-token: the analysis tools count logits by distance and "
                         "do not yet separate the sink key at position 0 from the text's keys. Analyse a model trained "
                         "without --sink-token (its perplexity and probes are unaffected).")
    window = spec.window
    bsz, length = tokens.shape
    heads = decoder.layers[0].self_attn.num_heads
    sums = torch.zeros(len(decoder.layers), heads, length, dtype=torch.float64)
    counts = torch.zeros(length, dtype=torch.float64)

    def observe(layer: int, logits: Tensor, distance: Tensor, visible: Tensor) -> None:
        shape = logits.shape[2:]
        seen = visible.expand(shape)  # (..., Tq, Tk): no padding here, so no batch dimension
        d = distance.expand(shape)[seen].cpu()
        sums[layer].index_add_(1, d, logits[:, :, seen].double().sum(0).cpu())
        if layer == 0:
            counts.index_add_(0, d, torch.full(d.shape, float(bsz), dtype=torch.float64))

    chunk = window.stride if window.bounded else max(1, CHUNK_ELEMENTS // max(1, bsz * heads * length))
    for _ in blockwise_forward(model, tokens, min(chunk, length), spec=spec, observer=observe, features_only=True):
        pass
    return sums, counts.long()
