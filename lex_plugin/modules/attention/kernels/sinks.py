"""The sinks kernel: sink tokens (StreamingLLM, LM-Infinite's global branch) as keys at virtual positions, scored with
the window's keys under one softmax (:func:`attend_with_sinks`); BCA's windows past the second take SDPA's fused kernel
with the sinks prepended (:func:`_bca_windows_with_sinks`)."""

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from ..planner import Chunk
from .ops import scaled_logits, sdpa, see_self
from .run import ChunkRun

__all__ = ["attend_with_sinks"]


def attend_with_sinks(run: ChunkRun, chunk: Chunk) -> Tensor:
    """One chunk with sink tokens, computed explicitly in fp32: the window's keys at their own positions,
    the sinks at virtual positions (``window.sink_distance`` before each query), one softmax over both;
    padded sinks are never seen (``run.sink_keys``: their raw keys, values and padding). Returns (B, H, Tq, D)
    in q's dtype."""
    sink_k, sink_v, sink_pad = run.sink_keys
    window, dev, held = run.window, run.q.device, sink_k.size(2)
    if sink_pad is not None and not bool(sink_pad.any()):
        sink_pad = None
    if (chunk.blocks and window.mode == "bca" and run.q_start + chunk.q0 >= 2 * chunk.stride and run.center is None
            and run.kpm is None and sink_pad is None and run.observer is None and held == window.sinks
            and run.scheme.kind != "bias"):
        return _bca_windows_with_sinks(run, chunk, sink_k, sink_v)
    if chunk.blocks:  # n windows of c queries against 2c keys, positions local to each window (shifted by k)
        n, c = chunk.blocks, chunk.stride
        qb, kb, vb = run.window_views(chunk)
        step = torch.arange(n, device=dev)[:, None] * c
        query = run.q_start + chunk.q0 + step + torch.arange(c, device=dev)  # (n, c) global positions
        key = run.k_start + chunk.k0 + step + torch.arange(2 * c, device=dev)  # (n, 2c)
        if run.center is None:  # local frame, shifted by k so that every sink's virtual position is >= 0
            frame = c + window.sinks  # local position of each window's first query
            qb, kb = run.rotate(qb, kb, frame, window.sinks)
            q_local, center = (frame + torch.arange(c, device=dev)).expand(n, c), run.scheme.center_near(window.sinks + c)
        else:  # rotated by the cache: global positions at its centre
            q_local, center = query, run.center
        bias = run.scheme.bias(c, c, 0, 2 * c, dev)
        bias = None if bias is None else bias[:, None]
        pad = run.window_padding(chunk)
    else:
        qb, kb, vb = (t[:, :, None, a:b] for t, (a, b) in ((run.q, (chunk.q0, chunk.q1)), (run.k, (chunk.k0, chunk.k1)),
                                                           (run.v, (chunk.k0, chunk.k1))))
        q_pos, k_pos = run.q_start + chunk.q0, run.k_start + chunk.k0
        center = run.center if run.center is not None else run.scheme.center_near(k_pos + kb.size(-2) // 2)
        if run.center is None:
            qb, kb = run.rotate(qb, kb, q_pos, k_pos, center)
        query = torch.arange(q_pos, q_pos + qb.size(-2), device=dev)[None]  # (1, Tq)
        key = torch.arange(k_pos, k_pos + kb.size(-2), device=dev)[None]
        q_local = query
        bias = run.scheme.bias(q_pos, qb.size(-2), k_pos, kb.size(-2), dev)
        bias = None if bias is None else bias[:, None]  # (H, 1, Tq, Tk) against (B, H, 1, Tq, Tk)
        pad = None if run.kpm is None else run.kpm[:, None, None, None, chunk.k0 : chunk.k1]
    logits = scaled_logits(qb, kb, bias)  # (B, H, G, Tq, Tk)
    visible = window.in_window(query[..., None], key[..., None, :])  # (G, Tq, Tk)
    if pad is not None:
        visible = see_self(visible[None, None] & ~pad, offset=int(query[0, 0] - key[0, 0]))
    j = torch.arange(held, device=dev)
    sink_visible = window.sink_visible(query[..., None], j)  # (G, Tq, s)
    if sink_pad is not None:
        sink_visible = sink_visible[None, None] & ~sink_pad[:, None, None, None, :]  # (B, 1, G, Tq, s)
    distance = window.sink_distance(query[..., None], j).clamp(min=0)  # (G, Tq, s)
    sink_logits = _sink_logits(run, qb, sink_k, q_local[..., None] - distance, query[..., None] - distance, query, center)
    all_logits = torch.cat([logits, sink_logits], dim=-1)
    all_visible = torch.cat([visible.expand_as(logits), sink_visible.expand_as(sink_logits)], dim=-1)
    if run.observer is not None:
        run.observer(all_logits, torch.cat([query[..., None] - key[..., None, :], distance], dim=-1), all_visible)
    all_logits = all_logits.masked_fill(~all_visible, float("-inf"))
    if run.sink_logits is not None:  # the learned sink: one more column, seen by every query, no value
        learned = run.sink_logits.float()[:, None, None, None].expand(*all_logits.shape[:-1], 1)
        all_logits = torch.cat([all_logits, learned], dim=-1)
    probs = torch.softmax(all_logits, dim=-1)
    if run.dropout_p:
        probs = F.dropout(probs, run.dropout_p)
    keys = kb.size(-2)  # (a learned sink's column, last, has no value)
    out = probs[..., :keys] @ vb.float() + probs[..., keys : keys + held] @ sink_v.float()[:, :, None]
    return out.flatten(2, 3).to(run.q.dtype)


def _sink_logits(run: ChunkRun, qb: Tensor, sink_k: Tensor, local: Tensor, virtual: Tensor, query: Tensor, center: int) -> Tensor:
    """fp32 logits (B, H, G, Tq, s) of rotated queries qb (B, H, G, Tq, D) against the raw sink keys
    (B, H, s, D) placed at virtual positions: ``local`` (G, Tq, s) in the queries' rotation frame (the
    scheme rotates each sink key there, with the queries' centre), ``virtual`` (G, Tq, s) global ones for
    the bias at true positions ``query`` (G, Tq)."""
    columns = []
    for j in range(sink_k.size(2)):  # one sink at a time: (B, H, G, Tq, D) rotated copies, not s of them
        key = sink_k[:, :, None, None, j]  # (B, H, 1, 1, D)
        if run.scheme.kind == "rotary":
            key = run.scheme.rotate_at(key, local[..., j], center=center, keys=True, scaling=run.scaling)  # (B, H, G, Tq, D)
        columns.append((qb.float() * key.float()).sum(-1))
    logits = torch.stack(columns, dim=-1) / math.sqrt(qb.size(-1))
    bias = run.scheme.bias_at(query[..., None], virtual)  # (H, G, Tq, s)
    return logits if bias is None else logits + bias


def _bca_windows_with_sinks(run: ChunkRun, chunk: Chunk, sink_k: Tensor, sink_v: Tensor) -> Tensor:
    """BCA windows with k sinks on SDPA's fused kernel. Every query of block b >= 2 (the caller checks) has
    the same first key f = (b - 1) c >= c >= k, so StreamingLLM places the sinks at f - k .. f - 1 for the
    whole window: prepended to the window's 2c keys at local positions 0 .. k - 1 (queries then at
    k + c .., keys at k ..), the (c, k + 2c) mask is causal aligned to the lower right."""
    n, c = chunk.blocks, chunk.stride
    bsz, heads, _, dim = run.q.shape
    sinks = sink_k.size(2)
    qw, kw, vw = run.window_views(chunk)
    kw = torch.cat([sink_k[:, :, None].expand(-1, -1, n, -1, -1), kw], dim=3)  # (B, H, n, k + 2c, D)
    vw = torch.cat([sink_v[:, :, None].expand(-1, -1, n, -1, -1), vw], dim=3)
    qw, kw = run.rotate(qw, kw, c + sinks, 0)
    shape = (bsz, heads * n)
    span = 2 * c + sinks
    out = sdpa(qw.reshape(*shape, c, dim), kw.reshape(*shape, span, dim), vw.reshape(*shape, span, dim),
                attn_mask=causal_lower_right(c, span), dropout_p=run.dropout_p, sink=run.sink(n),
                ).view(bsz, heads, n, c, dim)
    return out.flatten(2, 3)
