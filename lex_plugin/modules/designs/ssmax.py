"""Scalable-Softmax (SSMax, Nakanishi 2025; ``--ssmax``): softmax((s log n) z) in place of softmax(z). Each query of
head h is multiplied by s_h log(n), n the keys it sees under the window (its padding included), s_h a learned scalar
per head (``self_attn.ssmax``) started at 1 / log(l), so that the factor is 1 at n = l (the ordinary softmax at the
training length); the factor formed in fp32, its log in float64."""

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .registry import LayerDesign, QueryContext, switch_design

__all__ = ["SSMAX", "SSMax", "ssmax_scale"]


def ssmax_scale(s: Tensor, visible: Tensor) -> Tensor:
    """Scalable-Softmax's query factor s_h log(n) for heads with learned scales ``s`` (H,) and queries that see
    ``visible`` = n keys (Tq,): fp32 (H, Tq), the log formed in float64; differentiable in ``s``."""
    return s.float()[:, None] * visible.double().clamp(min=1).log().float()


@dataclass(frozen=True)
class SSMax(LayerDesign):
    """SSMax in one layer, trained at ``length`` = l (its scales start at 1 / log(l)).

    Raises:
        ValueError: l < 2 (log(l) would not be positive).
    """

    length: int

    def __post_init__(self):
        if int(self.length) < 2:
            raise ValueError(f"--ssmax starts at s = 1 / log(l) and needs the training length l >= 2; got {self.length}.")

    def attach(self, attention) -> None:
        attention.ssmax = nn.Parameter(torch.full((attention.num_heads,), 1.0 / math.log(int(self.length))))

    def queries(self, attention, q: Tensor, at: QueryContext) -> Tensor:
        if at.spec.retrieval is not None or attention._retrieval is not None:
            raise ValueError("--ssmax scales each query by log(n), n the keys of its window; a block retrieval (MoBA, "
                             "--retrieval-blocks) shows each query other keys: use one of them.")
        seen = at.spec.window.visible_keys(torch.arange(at.first, at.first + at.length, device=q.device))
        return (q.float() * ssmax_scale(attention.ssmax, seen)[:, :, None]).to(q.dtype)  # (H, T) factor


def _layer(config) -> SSMax:
    if not getattr(config, "tokens_per_sample", None):
        raise ValueError("--ssmax starts each head's s at 1 / log(l): it needs the training length (--tokens-per-sample).")
    return SSMax(int(config.tokens_per_sample))


SSMAX = switch_design(
    "ssmax",
    summary="queries of head h times a learned s_h log(n), n the keys a query sees",
    source="Nakanishi 2025, Scalable-Softmax Is Superior for Attention (arXiv 2501.19399)",
    help="Scalable-Softmax (Nakanishi 2025): queries of head h times s_h log(n), n the keys a query sees, s_h learned, "
         "starting at 1 / log(l)",
    layer=_layer,
    refuses_logn="--logn on an SSMax model (--ssmax): its queries already carry a learned s log(n); a second log-n "
                 "factor would scale them twice. Evaluate it without --logn.",
    left_padding="SSMax (--ssmax: each query's factor counts the keys from the first position)",
)
