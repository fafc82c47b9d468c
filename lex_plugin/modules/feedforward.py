"""The position-wise feed-forward block of TorchScale's decoder layer, without TorchScale at run time.

Same parameters, names, initialisation order and arithmetic as ``torchscale.component.feedforward_network.
FeedForwardNetwork`` 0.3.0 (tested against it): ``fc1`` (C -> F), the activation computed in fp32 and cast back,
``ffn_layernorm`` (F, Magneto's sub-LayerNorm, only with ``subln``), ``fc2`` (F -> C). TorchScale stays the
configuration the fairseq model is built from (``DecoderConfig``); the modules it runs are the package's own,
so an exported model needs torch alone.
"""

from typing import Callable, Dict

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ACTIVATIONS", "FeedForwardNetwork"]

# TorchScale's activation_fn names
ACTIVATIONS: Dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForwardNetwork(nn.Module):
    """x -> fc2(LN?(dropout(act(fc1 x)))) followed by dropout; (..., C) -> (..., C) in x's dtype.

    Args:
        embed_dim: C. ffn_dim: F. activation_fn: ``relu``, ``gelu`` or ``swish`` (SiLU).
        dropout: after fc2. activation_dropout: after the activation. layernorm_eps: of ``ffn_layernorm``.
        subln: Magneto's sub-LayerNorm before fc2 (Wang et al. 2022, "Foundation Transformers").

    Raises:
        ValueError: an activation not in :data:`ACTIVATIONS`.
    """

    def __init__(self, embed_dim: int, ffn_dim: int, activation_fn: str, dropout: float, activation_dropout: float,
                 layernorm_eps: float, subln: bool = False):
        super().__init__()
        if str(activation_fn) not in ACTIVATIONS:
            raise ValueError(f"--activation-fn {activation_fn!r} is not one of {', '.join(ACTIVATIONS)}.")
        self.embed_dim = embed_dim
        self.activation_fn = ACTIVATIONS[str(activation_fn)]
        self.activation_dropout_module = nn.Dropout(activation_dropout)
        self.dropout_module = nn.Dropout(dropout)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.ffn_layernorm = nn.LayerNorm(ffn_dim, eps=layernorm_eps) if subln else None

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = self.fc1(x.reshape(-1, x.size(-1)))
        x = self.activation_fn(x.float()).type_as(x)
        x = self.activation_dropout_module(x)
        if self.ffn_layernorm is not None:
            x = self.ffn_layernorm(x)
        x = self.fc2(x).view(shape)
        return self.dropout_module(x)
