"""The attention executor: runs the chunks of :func:`~.planner.plan` on SDPA, with the position scheme.

For each chunk it (1) rotates queries and keys with the scheme unless they already are (a generation
cache stores rotated keys), (2) asks the scheme for its additive bias, (3) builds SDPA's mask, the
cheapest that is exact: none, ``is_causal``, ``causal_lower_right`` (fused kernels), or an explicit
boolean / float mask, and (4) calls ``F.scaled_dot_product_attention``, except for one query over a
feature-major generation cache (``KeyValueCache``), which runs as two matrix-vector products. With an
``observer`` it also hands the pre-softmax logits it would feed SDPA to the observer (the analysis tools
read them from here, so they follow any change to attention).

Rotation of un-rotated inputs uses positions local to the chunk: a dense chunk rotates queries and keys
at their own positions with one centre (the middle of its keys, ``XPos.forward``); a windows chunk
rotates every window at local positions (queries c .. 2c - 1, keys 0 .. 2c - 1), so one (2c, d/2) table
serves all windows and xPos's zeta^(+-n/B) stays within zeta^(+-c/B) at any length: finite in fp32, bf16
and fp16. In exact arithmetic this equals global positions (the logit depends only on n - m).
"""

import math
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from ..positions.scheme import PositionScheme
from ..positions.xpos import CENTER_STEP
from .planner import Chunk
from .window import AttentionWindow

__all__ = ["Observer", "attend", "see_self"]

# observer(logits (B, H, ..., Tq, Tk) fp32, distance (..., Tq, Tk) int64, visible (B or 1, 1, ..., Tq, Tk) bool)
Observer = Callable[[Tensor, Tensor, Tensor], None]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    chunks: List[Chunk],
    window: AttentionWindow,
    scheme: PositionScheme,
    q_start: int,
    k_start: int,
    rotated: bool = False,
    key_padding_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    observer: Optional[Observer] = None,
    q_raw: Optional[Tensor] = None,
    sinks: Optional[Tuple[Tensor, Tensor]] = None,
) -> Tensor:
    """softmax(q k^T / sqrt(d) + bias + mask) v over the planned chunks.

    Args:
        q: (B, H, T, D) queries at positions q_start .. q_start + T - 1.
        k, v: (B, H, S, D) keys and values at positions k_start .. q_start + T - 1.
        chunks: ``plan(window, q_start, T, k_start, ...)``.
        window: the window the plan was made for (explicit masks are built from it).
        scheme: the position scheme (rotation and / or bias; a no-op for NoPE and absolute schemes).
        rotated: q and k already carry the scheme's rotation (cached generation); else each chunk rotates.
        key_padding_mask: (B, S) bool, True at padding, or None. A padded query still sees itself
            (``see_self``), so no softmax row is empty; those rows are ignored by the loss.
        dropout_p: attention dropout.
        observer: called once per chunk (per window for windows chunks) with the fp32 pre-softmax
            logits, the distances n - m and the visibility mask.
        q_raw: with ``rotated`` and sink tokens, the queries before rotation (sinks are scored at virtual
            distances, ``PositionScheme.logits_at``).
        sinks: (keys, values), each (B, H, s, D), of positions 0 .. s - 1 before rotation, s <= window.sinks;
            default the first keys of ``k`` (a pass that starts at position 0).

    Returns:
        (B, H, T, D) in q's dtype.

    Raises:
        ValueError: a window with sinks over rotated or offset keys without ``sinks``.
    """
    if window.sinks:
        if sinks is None:
            if rotated or k_start:
                raise ValueError("attention with sink tokens over a cache needs the cache's un-rotated sink keys.")
            sinks = (k[:, :, : window.sinks], v[:, :, : window.sinks])
        q_raw = q if q_raw is None else q_raw
        outs = [_with_sinks(q, k, v, chunk, window, scheme, q_start, k_start, rotated, key_padding_mask, dropout_p,
                            observer, q_raw, sinks) for chunk in chunks]
    else:
        outs = [
            (_windows if chunk.windows else _dense)(q, k, v, chunk, window, scheme, q_start, k_start, rotated,
                                                    key_padding_mask, dropout_p, observer)
            for chunk in chunks
        ]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def _rotate_pair(scheme: PositionScheme, q: Tensor, k: Tensor, q_pos: int, k_pos: int):
    if scheme.kind != "rotary":
        return q, k
    center = (k_pos + k.size(-2) // 2) // CENTER_STEP * CENTER_STEP
    return scheme.rotate(q, q_pos, center, keys=False), scheme.rotate(k, k_pos, center, keys=True)


def _observe(observer: Optional[Observer], q: Tensor, k: Tensor, bias: Optional[Tensor], distance: Tensor, visible: Tensor):
    """Hand the fp32 pre-softmax logits of one chunk to ``observer`` (nothing without one)."""
    if observer is None:
        return
    logits = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.size(-1))
    if bias is not None:
        logits = logits + bias
    observer(logits, distance, visible)


def _dense(q, k, v, chunk: Chunk, window, scheme, q_start, k_start, rotated, kpm, dropout_p, observer) -> Tensor:
    qc, kc, vc = q[:, :, chunk.q0 : chunk.q1], k[:, :, chunk.k0 : chunk.k1], v[:, :, chunk.k0 : chunk.k1]
    q_pos, k_pos = q_start + chunk.q0, k_start + chunk.k0
    tq, tk = qc.size(2), kc.size(2)
    if not rotated:
        qc, kc = _rotate_pair(scheme, qc, kc, q_pos, k_pos)
    bias = scheme.bias(q_pos, tq, k_pos, tk, q.device)
    allowed = None
    if chunk.mask == "explicit" or bias is not None or observer is not None:
        query = torch.arange(q_pos, q_pos + tq, device=q.device)[:, None]
        key = torch.arange(k_pos, k_pos + tk, device=q.device)[None, :]
        allowed = window.allowed(query, key)  # (Tq, Tk)
        if kpm is not None and chunk.mask == "explicit":
            allowed = see_self(allowed[None, None] & ~kpm[:, None, None, chunk.k0 : chunk.k1], offset=q_pos - k_pos)
        _observe(observer, qc, kc, bias, query - key, allowed)
    if tq == 1 and not dropout_p and kc.stride(-1) != 1:  # one query over a feature-major cache
        return _one_query(qc, kc, vc, bias, allowed if chunk.mask == "explicit" else None)
    is_causal, mask = False, None
    if bias is not None:
        mask = bias.masked_fill(~allowed, float("-inf")).to(q.dtype)
    elif chunk.mask == "explicit":
        mask = allowed
    elif chunk.mask == "causal":
        if tq == tk:
            is_causal = True
        else:
            mask = causal_lower_right(tq, tk)
    return F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)


def _one_query(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], allowed: Optional[Tensor]) -> Tensor:
    """One query per (batch, head) over the keys of a feature-major cache (keys and values stored
    (D, S), ``KeyValueCache``): two matrix-vector products with a softmax between, both reading long
    contiguous rows, so a generation step reads each cached key and value once near the memory bandwidth
    (``lex_lm_tiny`` at a 64k context: 0.58-0.62 of the time of a step on PyTorch's CPU SDPA kernel;
    examples/lex_lm/BENCHMARKS.md, "Fourth run: generation at the memory bandwidth").

    Args:
        q: (B, H, 1, D); k, v: (B, H, S, D) views of (B, H, D, S) memory; bias: (H, 1, S) or None;
        allowed: boolean visibility broadcastable to (B, H, 1, S) (padded keys), or None: every key.

    Returns:
        (B, H, 1, D).
    """
    scores = (q * (1.0 / math.sqrt(q.size(-1)))) @ k.transpose(-1, -2)  # (B, H, 1, S)
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _window_views(q, k, v, chunk: Chunk) -> Tuple[Tensor, Tensor, Tensor]:
    """The n windows of a windows chunk: queries (B, H, n, c, D), keys and values (B, H, n, 2c, D), all views."""
    n, c = chunk.windows, chunk.stride
    qw = q[:, :, chunk.q0 : chunk.q1].unflatten(2, (n, c))
    kw = k[:, :, chunk.k0 : chunk.k1].unfold(2, 2 * c, c).transpose(-1, -2)
    vw = v[:, :, chunk.k0 : chunk.k1].unfold(2, 2 * c, c).transpose(-1, -2)
    return qw, kw, vw


def _windows(q, k, v, chunk: Chunk, window, scheme, q_start, k_start, rotated, kpm, dropout_p, observer) -> Tensor:
    n, c = chunk.windows, chunk.stride
    bsz, heads, _, dim = q.shape
    qw, kw, vw = _window_views(q, k, v, chunk)
    if not rotated:
        qw, kw = _rotate_pair(scheme, qw, kw, c, 0)  # window-local positions
    bias = scheme.bias(c, c, 0, 2 * c, q.device)  # (H, c, 2c): only distances matter
    if chunk.mask == "explicit" or observer is not None:
        query = torch.arange(c, 2 * c, device=q.device)[:, None]
        key = torch.arange(0, 2 * c, device=q.device)[None, :]
        allowed = window.allowed(query, key)  # (c, 2c) in local positions
        if kpm is not None and chunk.mask == "explicit":
            kpm_w = kpm[:, chunk.k0 : chunk.k1].unfold(1, 2 * c, c)  # (B, n, 2c)
            allowed = see_self(allowed[None, None] & ~kpm_w[:, None, :, None, :], offset=c)  # (B, 1, n, c, 2c)
        _observe(observer, qw, kw, None if bias is None else bias[:, None], query - key, allowed)
    if chunk.mask == "causal":
        # BCA's (c, 2c) mask is causal aligned to the lower right: SDPA's fused kernels take it as is
        shape = (bsz, heads * n)
        out = F.scaled_dot_product_attention(
            qw.reshape(*shape, c, dim), kw.reshape(*shape, 2 * c, dim), vw.reshape(*shape, 2 * c, dim),
            attn_mask=causal_lower_right(c, 2 * c), dropout_p=dropout_p,
        ).view(bsz, heads, n, c, dim)
    else:
        mask = allowed if bias is None else bias[:, None].masked_fill(~allowed, float("-inf")).to(q.dtype)
        out = F.scaled_dot_product_attention(qw, kw, vw, attn_mask=mask, dropout_p=dropout_p)
    return out.flatten(2, 3)


def _with_sinks(q, k, v, chunk: Chunk, window, scheme, q_start, k_start, rotated, kpm, dropout_p, observer, q_raw,
                sinks) -> Tensor:
    """One chunk with sink tokens, computed explicitly in fp32: the window's keys at their own positions,
    the sinks at virtual distances (``window.sink_distance``), one softmax over both."""
    sink_k, sink_v = sinks
    held = sink_k.size(2)
    dev = q.device
    if (chunk.windows and window.mode == "bca" and q_start + chunk.q0 >= 2 * chunk.stride and not rotated
            and kpm is None and observer is None and held == window.sinks and scheme.kind != "bias"):
        return _bca_windows_with_sinks(q, k, v, chunk, scheme, sink_k, sink_v, dropout_p)
    if chunk.windows:  # n windows of c queries against 2c keys, positions local to each window
        n, c = chunk.windows, chunk.stride
        qb, kb, vb = _window_views(q, k, v, chunk)
        if not rotated:
            qb, kb = _rotate_pair(scheme, qb, kb, c, 0)
        bias = scheme.bias(c, c, 0, 2 * c, dev)
        step = torch.arange(n, device=dev)[:, None] * c
        query = q_start + chunk.q0 + step + torch.arange(c, device=dev)  # (n, c) global positions
        key = k_start + chunk.k0 + step + torch.arange(2 * c, device=dev)  # (n, 2c)
        pad = None if kpm is None else kpm[:, chunk.k0 : chunk.k1].unfold(1, 2 * c, c)[:, None, :, None, :]
    else:
        qb, kb, vb = (t[:, :, None, a:b] for t, (a, b) in ((q, (chunk.q0, chunk.q1)), (k, (chunk.k0, chunk.k1)),
                                                           (v, (chunk.k0, chunk.k1))))
        q_pos, k_pos = q_start + chunk.q0, k_start + chunk.k0
        if not rotated:
            qb, kb = _rotate_pair(scheme, qb, kb, q_pos, k_pos)
        bias = scheme.bias(q_pos, qb.size(-2), k_pos, kb.size(-2), dev)
        query = torch.arange(q_pos, q_pos + qb.size(-2), device=dev)[None]  # (1, Tq)
        key = torch.arange(k_pos, k_pos + kb.size(-2), device=dev)[None]
        pad = None if kpm is None else kpm[:, None, None, None, chunk.k0 : chunk.k1]
    groups, tq = query.shape
    logits = (qb.float() @ kb.float().transpose(-1, -2)) / math.sqrt(q.size(-1))  # (B, H, G, Tq, Tk)
    if bias is not None:
        logits = logits + bias[:, None].float()
    visible = window.in_window(query[..., None], key[..., None, :])  # (G, Tq, Tk)
    if pad is not None:
        visible = see_self(visible[None, None] & ~pad, offset=int(query[0, 0] - key[0, 0]))
    j = torch.arange(held, device=dev)
    sink_visible = window.sink_visible(query[..., None], j)  # (G, Tq, s)
    distance = window.sink_distance(query[..., None], j).clamp(min=0)
    qr = q_raw[:, :, chunk.q0 : chunk.q1]
    sink_logits = scheme.logits_at(qr, sink_k, distance.flatten(0, 1)).unflatten(2, (groups, tq))
    all_logits = torch.cat([logits, sink_logits], dim=-1)
    all_visible = torch.cat([visible.expand_as(logits), sink_visible.expand_as(sink_logits)], dim=-1)
    if observer is not None:
        observer(all_logits, torch.cat([query[..., None] - key[..., None, :], distance], dim=-1), all_visible)
    probs = torch.softmax(all_logits.masked_fill(~all_visible, float("-inf")), dim=-1)
    if dropout_p:
        probs = F.dropout(probs, dropout_p)
    out = probs[..., : kb.size(-2)] @ vb.float() + probs[..., kb.size(-2) :] @ sink_v.float()[:, :, None]
    return out.flatten(2, 3).to(q.dtype)


def _bca_windows_with_sinks(q, k, v, chunk: Chunk, scheme, sink_k, sink_v, dropout_p) -> Tensor:
    """BCA windows with k sinks on SDPA's fused kernel. Every query of block b >= 2 (the caller checks) has
    the same first key f = (b - 1) c >= c >= k, so StreamingLLM places the sinks at f - k .. f - 1 for the
    whole window: prepended to the window's 2c keys at local positions 0 .. k - 1 (queries then at
    k + c .., keys at k ..), the (c, k + 2c) mask is causal aligned to the lower right."""
    n, c = chunk.windows, chunk.stride
    bsz, heads, _, dim = q.shape
    sinks = sink_k.size(2)
    qw, kw, vw = _window_views(q, k, v, chunk)
    kw = torch.cat([sink_k[:, :, None].expand(-1, -1, n, -1, -1), kw], dim=3)  # (B, H, n, k + 2c, D)
    vw = torch.cat([sink_v[:, :, None].expand(-1, -1, n, -1, -1), vw], dim=3)
    qw, kw = _rotate_pair(scheme, qw, kw, c + sinks, 0)
    shape = (bsz, heads * n)
    out = F.scaled_dot_product_attention(
        qw.reshape(*shape, c, dim), kw.reshape(*shape, 2 * c + sinks, dim), vw.reshape(*shape, 2 * c + sinks, dim),
        attn_mask=causal_lower_right(c, 2 * c + sinks), dropout_p=dropout_p,
    ).view(bsz, heads, n, c, dim)
    return out.flatten(2, 3)


def see_self(allowed: Tensor, offset: int = 0) -> Tensor:
    """Let query t of a (..., T, S) boolean mask see key t + offset (its own position), in place, so that
    masking padded keys never leaves a softmax row empty (pad rows then give finite values the loss
    ignores). Returns ``allowed``."""
    rows = torch.arange(allowed.size(-2), device=allowed.device)
    allowed[..., rows, rows + offset] = True
    return allowed
