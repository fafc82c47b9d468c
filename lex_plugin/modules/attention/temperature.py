"""Query temperatures: factors on the queries that sharpen attention as a query sees more keys than it did in
training: log-n scaling at evaluation (``--logn``, ``AttentionSpec.logn``; the executor applies it to every mode) and
Scalable-Softmax's learned s log n (``--ssmax``; the layer holds s)."""

import math

from torch import Tensor

__all__ = ["logn_scale", "ssmax_scale"]


def logn_scale(visible: Tensor, training_length: int) -> Tensor:
    """The entropy-invariant query scale max(1, log(n) / log(l)) for queries that see ``visible`` = n keys
    (Su's note, 002; Qwen's ``use_logn_attn``, where n = position + 1 under full attention): fp32 (Tq,)."""
    return (visible.double().clamp(min=1).log() / math.log(training_length)).clamp(min=1.0).float()


def ssmax_scale(s: Tensor, visible: Tensor) -> Tensor:
    """Scalable-Softmax's query factor s_h log(n) (Nakanishi 2025: softmax((s log n) z) in place of softmax(z)) for
    heads with learned scales ``s`` (H,) and queries that see ``visible`` = n keys (Tq,): fp32 (H, Tq), the log formed
    in float64; differentiable in ``s``."""
    return s.float()[:, None] * visible.double().clamp(min=1).log().float()
