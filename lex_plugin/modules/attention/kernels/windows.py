"""The windows kernel: BCA's blocks or a sliding window's strides, n windows of c queries each against its 2c keys, at
window-local positions, batched into one SDPA call (:func:`attend_windows`). Only translation-invariant schemes get windows
chunks (the planner's ``local_positions``): their logits depend on n - m alone."""

import torch
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from ..planner import Chunk
from .ops import additive_mask, four_d, scaled_logits, sdpa, see_self, windows_in_batch
from .run import ChunkRun

__all__ = ["attend_windows"]


def attend_windows(run: ChunkRun, chunk: Chunk) -> Tensor:
    """n windows of c queries against their 2c keys, at window-local positions, in one SDPA call on 4-D
    inputs ((B, H n, c, D): the shape of SDPA's fast CPU kernels); a mask or bias is 4-D too, one
    (H or 1, c, 2c) for every window unless padding makes it per window. Returns (B, H, n c, D) in q's dtype."""
    n, c = chunk.blocks, chunk.stride
    bsz, heads, _, dim = run.q.shape
    qw, kw, vw = run.window_views(chunk)
    if run.center is None:
        qw, kw = run.rotate(qw, kw, c, 0)  # window-local positions
    bias = run.scheme.bias(c, c, 0, 2 * c, run.q.device)  # (H, c, 2c): only distances matter
    allowed = None
    if chunk.mask == "explicit" or run.observer is not None:
        query = torch.arange(c, 2 * c, device=run.q.device)[:, None]
        key = torch.arange(0, 2 * c, device=run.q.device)[None, :]
        allowed = run.window.allowed(query, key)  # (c, 2c) in local positions
        pad = run.window_padding(chunk) if chunk.mask == "explicit" else None
        if pad is not None:
            allowed = see_self(allowed[None, None] & ~pad, offset=c)  # (B, 1, n, c, 2c)
        if run.observer is not None:
            run.observer(scaled_logits(qw, kw, None if bias is None else bias[:, None]), query - key, allowed)
        if pad is not None and bias is not None:
            bias = bias[:, None]  # (H, 1, c, 2c) against (B, 1, n, c, 2c)
    if chunk.mask == "causal":  # BCA's (c, 2c) mask is causal aligned to the lower right: fused kernels
        shape = (bsz, heads * n)
        out = sdpa(qw.reshape(*shape, c, dim), kw.reshape(*shape, 2 * c, dim), vw.reshape(*shape, 2 * c, dim),
                    attn_mask=causal_lower_right(c, 2 * c), dropout_p=run.dropout_p, sink=run.sink(n))
        return out.view(bsz, heads, n, c, dim).flatten(2, 3)
    # windows in the batch: (B n, H, c or 2c, D), so one (H, c, 2c) bias (or (c, 2c) mask) serves every
    # window and sample, or padding gives a (B n, 1 or H, c, 2c) mask: 4-D, SDPA's fast kernels
    mask = additive_mask(allowed, bias, run.q.dtype)  # (c, 2c) | (H, c, 2c) | (B, H or 1, n, c, 2c)
    mask = mask.transpose(1, 2).flatten(0, 1) if mask.dim() == 5 else four_d(mask)
    out = sdpa(windows_in_batch(qw), windows_in_batch(kw), windows_in_batch(vw), attn_mask=mask,
                dropout_p=run.dropout_p, sink=run.sink(1))
    return out.unflatten(0, (bsz, n)).transpose(1, 2).flatten(2, 3)
