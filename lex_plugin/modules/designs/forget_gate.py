"""The forgetting transformer's forget gate (Lin et al., ICLR 2025, Forgetting Transformer: Softmax Attention with a
Forget Gate, arXiv 2503.02130, "Forgetting Attention"; ``--forget-gate``): each head has a scalar gate per position,
f_t = sigmoid(w_f . x_t + b_f), and the logit of query n and key m gains the log of the gates between them,

    o_n = sum_{m <= n} exp(q_n . k_m / sqrt(d) + D_nm) v_m / sum_{m <= n} exp(q_n . k_m / sqrt(d) + D_nm),
    D_nm = sum_{m < t <= n} log f_t = c_n - c_m,  c_n = sum_{t <= n} log f_t,

a data-dependent decay (D_nm <= 0, 0 on the diagonal) that the paper trains with no position scheme ("FoX without
positions": ``--pos-emb none``) or with RoPE, and reports to extrapolate better than the Transformer.

Attention keeps c with the keys (``kv_cache.HeldKeys.decay``, float64: c falls by up to |log f| a token, and its
differences must keep fp32's precision at any length), and the executor adds c_n - c_m to each dense chunk's logits;
a generation cache continues c from its last key, so a step equals the parallel pass. The layers plan dense chunks at
true positions (full attention, BCA and a sliding window as explicit masks); sink tokens, position maps and
``--retrieval-blocks`` are refused. In a ``--layer-pattern``, the gate acts in the global layers (the local ones keep
their windows); without one, in every layer.

Parameters: ``self_attn.forget_proj`` (C -> H, with bias; PyTorch's default initialisation); the gate's projection
and log-sigmoid in fp32 whatever the model's dtype (float64 in a float64 model): the running sum adds every gate's
error. The bias c_n - c_m enters SDPA's mask in the attention's dtype (as ALiBi's does), so every dense chunk has an
explicit (B, H, Tq, Tk) mask: no ``is_causal`` fast path.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .registry import LayerDesign, switch_design

__all__ = ["FORGET_GATE", "ForgetGate"]


@dataclass(frozen=True)
class ForgetGate(LayerDesign):
    """The forget gate in one layer (module docstring)."""

    decays = True
    global_only = True

    def attach(self, attention) -> None:
        attention.forget_proj = nn.Linear(attention.embed_dim, attention.num_heads, bias=True)

    def log_forget(self, attention, x: Tensor) -> Optional[Tensor]:
        """(B, H, T) log f_t = log sigmoid(w_f . x_t + b_f) of the new positions, from x (B, T, C): fp32 (float64 in a
        float64 model)."""
        proj, dtype = attention.forget_proj, torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):  # C -> H: cheap in fp32, and each gate's error accumulates
            gate = F.linear(x.to(dtype), proj.weight.to(dtype), proj.bias.to(dtype))
        return F.logsigmoid(gate).transpose(1, 2)


FORGET_GATE = switch_design(
    "forget_gate",
    summary="each head's logit of query n and key m gains sum of log sigmoid(w_f . x_t + b_f) over m < t <= n, a "
            "data-dependent decay",
    source="Lin et al., ICLR 2025, Forgetting Transformer (arXiv 2503.02130), Forgetting Attention",
    help="the forgetting transformer's forget gate (Lin et al. 2025): each head's logit of query n and key m gains "
         "sum_{m < t <= n} log sigmoid(w_f . x_t + b_f); with --pos-emb none it is FoX without positions; in a "
         "--layer-pattern, in the global layers",
    layer=lambda config: ForgetGate(),
)
