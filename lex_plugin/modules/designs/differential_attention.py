"""Differential attention (Ye et al., ICLR 2025, Differential Transformer, arXiv 2410.05258, Eq. 1-3;
``--differential-attention``): each head takes the difference of two softmax maps over the same keys and values,

    DiffAttn(X) = (softmax(Q1 K1^T / sqrt(d')) - lambda softmax(Q2 K2^T / sqrt(d'))) V,
    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,  lambda_init = 0.8 - 0.6 exp(-0.3 (depth - 1)),

then normalises each head's output (RMSNorm, the paper's headwise GroupNorm) and scales it by 1 - lambda_init.

Here each head of dimension d splits its queries and keys by pairs of dimensions (the pairs the position scheme
rotates: dims 2i, 2i + 1): the first map's Q1, K1 are the even pairs (dims 4j, 4j + 1), the second's Q2, K2 the odd
pairs (4j + 2, 4j + 3), so d' = d / 2, and V is the head's whole value (2 d' = d, as in the paper). Rotated with the
model's d-dimensional scheme, the even pairs turn at theta_2j = base^(-4j/d) = base^(-2j/d'): exactly the
d'-dimensional RoPE of the paper's maps (xPos: zeta_2j = (2j/d' + gamma)/(1 + gamma), the d'-dimensional zeta); the
odd pairs at base^(-(4j + 2)/d), the same spectrum 1/base^(2/d) lower. Each map is one executor call with the other
map's pairs zeroed and the queries times sqrt(2) (q . k / sqrt(d) of the kept pairs is then Q K^T / sqrt(d')): the
keys, the cache and every window are shared, unchanged.

Parameters (``self_attn.*``): ``lambda_q1``, ``lambda_k1``, ``lambda_q2``, ``lambda_k2`` (d' each, N(0, 0.1) as the
paper's code) and ``diff_norm`` (RMSNorm over d, learned weight). lambda, the difference and the norm in fp32.
"""

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from .registry import LayerDesign, switch_design

__all__ = ["DIFFERENTIAL_ATTENTION", "DifferentialAttention", "diff_lambda", "lambda_init"]


def lambda_init(depth: int) -> float:
    """lambda_init of the layer at ``depth`` (0 first): 0.8 - 0.6 exp(-0.3 (l - 1)) with l = depth + 1 (Ye et al.,
    section 2.1)."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def diff_lambda(attention) -> Tensor:
    """lambda of a differential-attention layer (Ye et al., Eq. 2): exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
    a 0-d fp32 tensor (differentiable in the four vectors)."""
    return (torch.exp(torch.dot(attention.lambda_q1.float(), attention.lambda_k1.float()))
            - torch.exp(torch.dot(attention.lambda_q2.float(), attention.lambda_k2.float())) + lambda_init(attention.depth))


@dataclass(frozen=True)
class DifferentialAttention(LayerDesign):
    """Differential attention in one layer (module docstring)."""

    takes_attention = True

    def attach(self, attention) -> None:
        if attention.dropout:
            raise ValueError(f"--differential-attention with --attention-dropout {attention.dropout}: each map would drop "
                             "its own probabilities, and the dropped mass would not cancel in the difference. Train it "
                             "with --attention-dropout 0.")
        if attention.head_dim % 4:
            raise ValueError(f"--differential-attention splits each head's pairs of dimensions between two maps: the head "
                             f"dimension ({attention.head_dim}) must be a multiple of 4; change --decoder-embed-dim or "
                             "--decoder-attention-heads.")
        half = attention.head_dim // 2
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(attention, name, nn.Parameter(torch.zeros(half).normal_(mean=0.0, std=0.1)))
        attention.diff_norm = nn.RMSNorm(attention.head_dim, eps=attention.layernorm_eps)

    def attend(self, attention, q: Tensor, run: Callable[[Tensor], Tensor]) -> Tensor:
        first = _first_map(q.size(-1), q.device)  # (d,) 1.0 at the first map's dimensions
        scale = math.sqrt(2.0)
        one = run((q.float() * (first * scale)).to(q.dtype)).float()
        two = run((q.float() * ((1.0 - first) * scale)).to(q.dtype)).float()
        init = lambda_init(attention.depth)
        diff = one - diff_lambda(attention) * two  # (B, H, T, d) fp32
        norm = attention.diff_norm
        out = diff * torch.rsqrt(diff.pow(2).mean(dim=-1, keepdim=True) + norm.eps) * norm.weight.float()
        return (out * (1.0 - init)).to(q.dtype)


def _first_map(dim: int, device) -> Tensor:
    """(dim,) fp32: 1 at the even pairs of dimensions (4j, 4j + 1), the first map's; 0 at the odd pairs."""
    return ((torch.arange(dim, device=device) // 2) % 2 == 0).float()


DIFFERENTIAL_ATTENTION = switch_design(
    "differential_attention",
    summary="each head takes the difference of two softmax maps over the same keys, lambda learned, then a head norm",
    source="Ye et al., ICLR 2025, Differential Transformer (arXiv 2410.05258), Eq. 1-3",
    help="differential attention (Ye et al. 2025): each head is softmax(Q1 K1^T) V - lambda softmax(Q2 K2^T) V over two "
         "halves of its pairs of dimensions, lambda learned, then an RMSNorm per head times 1 - lambda_init",
    layer=lambda config: DifferentialAttention(),
)
