"""Log-n scaling at evaluation (``--logn``, ``AttentionSpec.logn``; the executor applies it to every mode): a factor
on the queries that sharpens attention as a query sees more keys than it did in training. The trained query factors
(SSMax, Llama 4's temperature tuning) are designs (``modules.designs``)."""

import math

from torch import Tensor

__all__ = ["logn_scale"]


def logn_scale(visible: Tensor, training_length: int) -> Tensor:
    """The entropy-invariant query scale max(1, log(n) / log(l)) for queries that see ``visible`` = n keys
    (Su's note, 002; Qwen's ``use_logn_attn``, where n = position + 1 under full attention): fp32 (Tq,)."""
    return (visible.double().clamp(min=1).log() / math.log(training_length)).clamp(min=1.0).float()
