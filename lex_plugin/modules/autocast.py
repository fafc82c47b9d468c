"""bf16 mixed precision: ``torch.autocast`` around a forward, with fp32 weights.

fairseq 0.12 has no bf16 training on GPUs (``--bf16`` implies ``--tpu``; ``--amp`` is fp16 with a loss scaler,
CUDA only). Autocast runs the matrix products of a forward in bf16 (CPUs with AVX-512 BF16 / AMX, NVIDIA
Ampere and later) while the weights, their gradients and the optimizer state stay fp32 and no loss scaling
is needed (bf16 has fp32's exponent range). What stays fp32 here:

* position math: rotary angles, xPos's zeta^(n/B), biases and distances are element-wise fp32 / float64
  computations, which autocast leaves alone; the executor casts queries, keys and values to bf16 only after
  it has rotated them (``attention.executor.attend``);
* softmax statistics: SDPA's fused kernels accumulate in fp32; the executor's explicit paths (log-sum-exp
  merges, sinks, observers) run with autocast disabled on fp32 copies;
* the loss: fairseq's criteria take ``log_softmax(logits.float())`` outside the model's forward (the logits
  themselves leave the output projection in bf16).

A model runs under autocast when it is a view made by ``LexDecoder.with_autocast`` (``LexLanguageModel.
with_autocast``; the task's ``--bf16-autocast``, the hub's ``bf16_autocast=True``, ``lex ... --bf16-autocast``).
"""

import contextlib
import os
from typing import ContextManager, Dict, Optional

import torch

__all__ = ["AUTOCAST_DTYPES", "EMULATED_BF16_ENV", "autocast", "autocast_dtype", "bf16_supported", "check_autocast"]

EMULATED_BF16_ENV = "LEX_EMULATED_BF16"  # =1: allow bf16 autocast where bf16 is emulated (numerics checks; slow)

# the dtypes a model may be viewed under (name -> dtype); fp16 autocast needs a loss scaler: fairseq's --amp
AUTOCAST_DTYPES: Dict[str, torch.dtype] = {"bf16": torch.bfloat16}


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 matrix products natively: CUDA with compute capability >= 8.0
    (``torch.cuda.is_bf16_supported``), a CPU with AVX-512 BF16 or AMX (oneDNN's check). Elsewhere bf16 is
    emulated, far slower than fp32 (an AVX2 CPU: 0.7 GFLOP/s against 50 in fp32), and refused unless the
    environment sets ``LEX_EMULATED_BF16=1`` (the same numbers, slowly: to check numerics on such a machine)."""
    if os.environ.get(EMULATED_BF16_ENV) == "1":
        return True
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def check_autocast(device: torch.device, dtype: torch.dtype, weights: torch.dtype) -> None:
    """Refuse autocast where it cannot do what it says.

    Args:
        device: where the forward runs.
        dtype: the autocast dtype (a value of :data:`AUTOCAST_DTYPES`).
        weights: the model's parameter dtype.

    Raises:
        ValueError: weights that are not fp32 (``--fp16`` / ``--memory-efficient-fp16`` / ``--bf16`` cast the
            model itself: autocast then has nothing to do and the optimizer would step in half precision), or a
            device without native ``dtype`` support.
    """
    if weights != torch.float32:
        raise ValueError(f"--bf16-autocast keeps the weights fp32 and runs the forward under autocast, but the model is "
                         f"{weights}: drop --fp16 / --memory-efficient-fp16 / --bf16 (they cast the model itself).")
    if dtype == torch.bfloat16 and not bf16_supported(device):
        raise ValueError(f"--bf16-autocast: this {torch.device(device).type} device has no native bf16 (CUDA needs "
                         "compute capability 8.0+, a CPU AVX-512 BF16 or AMX): run in fp32, or --fp16 on CUDA "
                         f"({EMULATED_BF16_ENV}=1 runs it emulated, slowly, to check numerics).")


def autocast(device: torch.device, dtype: Optional[torch.dtype]) -> ContextManager:
    """``torch.autocast(device.type, dtype)``, or a context that does nothing when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def autocast_dtype(device: torch.device) -> Optional[torch.dtype]:
    """The dtype autocast casts matrix products to on ``device``'s type right now, or None when it is off."""
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda") or not torch.is_autocast_enabled(kind):
        return None
    return torch.get_autocast_dtype(kind)
