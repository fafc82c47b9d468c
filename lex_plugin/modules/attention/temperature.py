"""Query temperatures: factors on the queries that sharpen attention as a query sees more keys than it did in
training: log-n scaling at evaluation (``--logn``, ``AttentionSpec.logn``; the executor applies it to every mode) and
Scalable-Softmax's learned s log n (``--ssmax``; the layer holds s), and Llama 4's temperature tuning
(``--temperature-tuning-beta``; a model option, at training and evaluation alike)."""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TemperatureTuning", "logn_scale", "ssmax_scale"]


def logn_scale(visible: Tensor, training_length: int) -> Tensor:
    """The entropy-invariant query scale max(1, log(n) / log(l)) for queries that see ``visible`` = n keys
    (Su's note, 002; Qwen's ``use_logn_attn``, where n = position + 1 under full attention): fp32 (Tq,)."""
    return (visible.double().clamp(min=1).log() / math.log(training_length)).clamp(min=1.0).float()


def ssmax_scale(s: Tensor, visible: Tensor) -> Tensor:
    """Scalable-Softmax's query factor s_h log(n) (Nakanishi 2025: softmax((s log n) z) in place of softmax(z)) for
    heads with learned scales ``s`` (H,) and queries that see ``visible`` = n keys (Tq,): fp32 (H, Tq), the log formed
    in float64; differentiable in ``s``."""
    return s.float()[:, None] * visible.double().clamp(min=1).log().float()


@dataclass(frozen=True)
class TemperatureTuning:
    """Llama 4's attention temperature tuning: the query at absolute position p is multiplied by
    1 + beta * log1p(floor((p + 1) / floor_scale)) (transformers ``modeling_llama4``, ``attn_temperature_tuning``:
    beta = ``attn_scale`` 0.1 and ``floor_scale`` 8192, Llama 4's training length, on its global NoPE layers). Here
    on every layer, with ``floor_scale`` the model's training length l unless given: 1 for p < F - 1, then growing as
    log(p / F), so the queries sharpen only where the context outgrows training.

    Args:
        beta: the slope (``--temperature-tuning-beta``), > 0.
        floor_scale: F, in positions (``--temperature-tuning-floor``; default l), >= 1.

    Raises:
        ValueError: beta <= 0 or F < 1.
    """

    beta: float
    floor_scale: int

    def __post_init__(self):
        if not self.beta > 0:
            raise ValueError(f"--temperature-tuning-beta must be positive (Llama 4 uses 0.1), got {self.beta}; leave it "
                             "out for no temperature tuning.")
        if int(self.floor_scale) < 1:
            raise ValueError(f"--temperature-tuning-floor must be at least 1 position, got {self.floor_scale}.")

    def scale(self, positions: Tensor) -> Tensor:
        """The factor for queries at absolute ``positions`` (any shape, int): fp32 of that shape, formed in float64
        (exact floor at any position)."""
        p = positions.to(torch.float64)
        return (1.0 + self.beta * torch.log1p(torch.floor((p + 1.0) / int(self.floor_scale)))).float()
