"""The dense kernel: one chunk of queries against its keys at their true positions (:func:`attend_dense`)."""

from dataclasses import replace

from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from ..planner import Chunk
from .ops import additive_mask, four_d, one_query, scaled_logits, sdpa, step_as_products
from .run import ChunkRun

__all__ = ["attend_dense"]


def attend_dense(run: ChunkRun, chunk: Chunk) -> Tensor:
    """A dense chunk (full, causal, chunked or a window too short to batch) at true positions: one SDPA
    call with the cheapest exact mask (none, ``is_causal``, ``causal_lower_right``, or an explicit boolean / additive
    one); one query over a feature-major cache, or on CUDA, or in half precision on CPU, as two products
    (:func:`~.ops.one_query`). Under a forget gate's decay, the keys beyond its horizon (``run.decay_horizon``:
    weighed below any dtype's rounding) are left out, unless an observer wants every logit. Returns (B, H, Tq, D) in
    q's dtype."""
    qc, kc, vc, bias, query, key = run.dense_inputs(chunk)
    if bias is None and run.observer is None:
        skip = run.decay_horizon(chunk, qc, kc)
        if skip:
            chunk = replace(chunk, k0=chunk.k0 + skip)
            kc, vc, key = kc[:, :, skip:], vc[:, :, skip:], key[..., skip:]
    bias = run.with_decay(bias, chunk)
    allowed = None
    if chunk.mask == "explicit" or bias is not None or run.observer is not None:
        allowed = run.allowed(chunk, query, key)
        if run.observer is not None:
            run.observer(scaled_logits(qc, kc, bias), query - key, allowed)
    if qc.size(2) == 1 and not run.dropout_p and (run.feature_major or step_as_products(qc)):
        return one_query(qc, kc, vc, bias, allowed if chunk.mask == "explicit" else None, run.sink(1))
    is_causal, mask = False, None
    if bias is not None or chunk.mask == "explicit":
        mask = four_d(additive_mask(allowed, bias, qc.dtype))
    elif chunk.mask == "causal":
        if qc.size(2) == kc.size(2):
            is_causal = True
        else:
            mask = causal_lower_right(qc.size(2), kc.size(2))
    return sdpa(qc, kc, vc, attn_mask=mask, dropout_p=run.dropout_p, is_causal=is_causal, sink=run.sink(1))
