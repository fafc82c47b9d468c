"""QK-norm (OLMo 2, Gemma 3; ``--qk-norm``): each head's queries and keys go through an RMSNorm over the head
dimension d before the position scheme rotates them, q <- q / sqrt(mean(q^2) + eps) * w_q and the same for k, with
one learned (d,) weight for queries and one for keys shared by the heads (``self_attn.q_norm``, ``self_attn.k_norm``),
eps the layer's LayerNorm epsilon; the statistics in fp32 whatever the model's dtype."""

from dataclasses import dataclass
from typing import Tuple

import torch.nn.functional as F
from torch import Tensor, nn

from .registry import LayerDesign, switch_design

__all__ = ["QK_NORM", "QKNorm"]


def _rms_norm(norm: nn.RMSNorm, x: Tensor) -> Tensor:
    """``norm`` over the last dimension of x, in fp32 (input and weight) whatever their dtypes; x's dtype back."""
    return F.rms_norm(x.float(), norm.normalized_shape, norm.weight.float(), norm.eps).to(x.dtype)


@dataclass(frozen=True)
class QKNorm(LayerDesign):
    """QK-norm in one layer: an RMSNorm of the head dimension for the queries and one for the keys."""

    def attach(self, attention) -> None:
        attention.q_norm = nn.RMSNorm(attention.head_dim, eps=attention.layernorm_eps)
        attention.k_norm = nn.RMSNorm(attention.head_dim, eps=attention.layernorm_eps)

    def queries_and_keys(self, attention, q: Tensor, k: Tensor) -> Tuple[Tensor, Tensor]:
        return _rms_norm(attention.q_norm, q), _rms_norm(attention.k_norm, k)


QK_NORM = switch_design(
    "qk_norm",
    summary="an RMSNorm of each head's queries and keys before the position scheme",
    source="OLMo 2 (Team OLMo 2024), Gemma 3 (2025): QK-norm",
    help="QK-norm (OLMo 2, Gemma 3): an RMSNorm over each head's queries and keys before the position scheme, one "
         "learned weight of the head dimension for each",
    layer=lambda config: QKNorm(),
)
