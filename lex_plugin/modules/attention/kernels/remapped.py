"""The position-map kernel: full attention at remapped distances (ReRoPE, Leaky ReRoPE, Self-Extend, DCA;
:mod:`..position_map`), piece by piece, merged by the pieces' log-sum-exps into one softmax (:func:`attend_remapped`)."""

from functools import partial
from typing import Optional

import torch
from torch import Tensor

from ..planner import Chunk
from .ops import (additive_mask, attention_lse, four_d, scaled_logits, sdpa, see_self, step_as_products, step_logits,
                  weighted_values)
from .run import ChunkRun

__all__ = ["MAP_QUERY_BLOCK", "attend_remapped"]

# queries per SDPA call under a rotary position map: each call copies its keys into their pieces' slots, so
# larger blocks copy less often; each holds a (Tq, Tk) mask
MAP_QUERY_BLOCK = 2048


def attend_remapped(run: ChunkRun, chunk: Chunk) -> Tensor:
    """A dense chunk of full attention under a position map (:mod:`.position_map`).

    Rotary schemes: each piece rotates the queries at its positions and its keys at theirs (one centre per
    piece) and attends, on SDPA's fused CPU kernel, to the keys it selects, returning its output and the
    log-sum-exp of its logits (:func:`attention_lse`); the pieces' outputs are merged by their log-sum-exps,
    which is one softmax over every key. A generation step's one query (fp32, or bf16 / fp16 on CPU) instead
    scores every piece into one row of logits and takes one softmax (:func:`step_logits`; in half precision each
    piece's product in fp32 or per head by its own key count, so one row may hold both). Bias schemes: one SDPA
    call, biased at the remapped distance.

    Queries go in the map's blocks of at most ``MAP_QUERY_BLOCK`` (``PositionMap.query_blocks``: DCA's also end
    at chunk boundaries), so each block meets only the keys its pieces can select (the far piece of a block of
    ReRoPE ends w before its last query): about the pairs of causal attention."""
    position_map = run.position_map
    blocks = position_map.query_blocks(run.q_start + chunk.q0, run.q_start + chunk.q1, MAP_QUERY_BLOCK)
    if len(blocks) > 1:
        return torch.cat([attend_remapped(run, Chunk(a - run.q_start, b - run.q_start, chunk.k0,
                                              b - run.q_start + chunk.k1 - chunk.q1, chunk.mask))
                          for a, b in blocks], dim=2)
    if run.dropout_p:
        raise ValueError("position maps are an evaluation method: run them without attention dropout (model.eval()).")
    qc, kc, vc = run.q[:, :, chunk.q0 : chunk.q1], run.k[:, :, chunk.k0 : chunk.k1], run.v[:, :, chunk.k0 : chunk.k1]
    dev = qc.device
    n = torch.arange(run.q_start + chunk.q0, run.q_start + chunk.q1, device=dev)
    m = torch.arange(run.k_start + chunk.k0, run.k_start + chunk.k1, device=dev)
    allowed = None  # one query after every key, no padding: a position map's window (full) sees them all
    last_key, first_query = run.k_start + chunk.k1 - 1, run.q_start + chunk.q0  # (ints: no device sync)
    if run.kpm is not None or qc.size(2) > 1 or last_key > first_query or run.scheme.kind != "rotary":
        allowed = run.window.allowed(n[:, None], m[None, :])  # (Tq, Tk)
    if run.kpm is not None:
        allowed = see_self(allowed[None, None] & ~run.kpm[:, None, None, chunk.k0 : chunk.k1],
                           offset=chunk.q0 - chunk.k0 + run.q_start - run.k_start)  # (B, 1, Tq, Tk)
    if run.scheme.kind != "rotary":  # a bias at the remapped (integer) distance
        distance = position_map.distance(n[:, None], m[None, :]).clamp(min=0).long()
        bias = run.scheme.bias_at(distance, torch.zeros_like(distance))  # (H, Tq, Tk)
        if run.observer is not None:
            run.observer(scaled_logits(qc, kc, bias), n[:, None] - m[None, :], allowed)
        return sdpa(qc, kc, vc, attn_mask=four_d(additive_mask(allowed, bias, qc.dtype)), sink=run.sink(1))
    rotated = []
    # a generation cache keeps the rotated keys of each kind of piece, from the first key (RotatedPieces)
    memo = run.rotated_pieces if chunk.k0 == 0 and run.k_start == 0 else None
    limit = run.scheme.max_center_offset(qc.dtype, run.scaling)  # None: no scale, any centre is exact
    for piece in position_map.pieces(n, m):
        # the map's shared centre where the scheme's scale allows it about every position the map uses; else
        # centred among the piece's queries: a selected key is never after its query, so keys only shrink
        # (Self-Extend's far keys at m / G would otherwise put zeta^(n / 2GB) on the queries: fp16 overflows), and
        # the pieces of one kind no longer share their rotated keys (RotatedPieces keeps one centre's)
        center = None if piece.center is None else run.scheme.center_near(piece.center)
        if center is None or (limit is not None and max(center, position_map.max_position - center) > limit):
            center = run.scheme.center_near(int(piece.q_pos.min() + piece.q_pos.max()) // 2)
        rotate = partial(run.scheme.rotate_at, center=center, keys=True, scaling=run.scaling)
        keys = (rotate(kc[:, :, piece.lo : piece.hi], piece.k_pos) if memo is None
                else memo.keys(piece.kind, center, kc, piece.lo, piece.hi, piece.k_pos, rotate))
        rotated.append((piece, run.scheme.rotate_at(qc, piece.q_pos, center=center, keys=False, scaling=run.scaling),
                        keys))
    if run.observer is not None:
        logits = torch.full(qc.shape[:-1] + (kc.size(2),), float("-inf"), device=dev)
        for piece, qr, kr in rotated:
            part = logits[..., piece.lo : piece.hi]
            part.copy_(scaled_logits(qr, kr, None) if piece.select is None else torch.where(piece.select, scaled_logits(qr, kr, None), part))
        run.observer(logits, n[:, None] - m[None, :], run.window.allowed(n[:, None], m[None, :]) if allowed is None else allowed)
    if qc.size(2) == 1 and (qc.dtype == torch.float32 or step_as_products(qc)):
        # a generation step: one row of logits over every piece, one softmax (no SDPA call per piece)
        scores = torch.full(qc.shape[:-1] + (kc.size(2),), float("-inf"), device=dev)  # (B, H, 1, Tk) fp32
        for piece, qr, kr in rotated:
            part, seen = scores[..., piece.lo : piece.hi], _seen(allowed, piece)
            part.copy_(step_logits(qr, kr) if seen is None else torch.where(seen, step_logits(qr, kr), part))
        return weighted_values(scores, vc, run.sink(1)).to(qc.dtype)
    outs, lses = [], []
    for piece, qr, kr in rotated:
        seen, keys = _seen(allowed, piece), piece.hi - piece.lo
        head = tail = keys
        if seen is not None:
            # keys every query sees (a leading and a trailing run) need no mask: SDPA's plain kernel
            full = seen.reshape(-1, seen.size(-2), seen.size(-1)).all(dim=1).all(dim=0)  # (keys,)
            head = int(full.long().cumprod(0).sum())
            tail = 0 if head == keys else int(full.flip(0).long().cumprod(0).sum())
        for a, b, masked in ((0, head, False), (head, keys - tail, True), (max(head, keys - tail), keys, False)):
            if b > a:
                out, lse = attention_lse(qr, kr[:, :, a:b], vc[:, :, piece.lo + a : piece.lo + b],
                                          seen[..., a:b] if masked else None)
                outs.append(out)
                lses.append(lse)
    if run.sink_logits is not None:  # the sink: one more piece, its log-sum-exp s_h, its output 0
        lses.append(run.sink_logits.float()[:, None].expand_as(lses[0]))
        outs.append(torch.zeros_like(outs[0]))
    if len(outs) == 1:
        return outs[0]
    weights = torch.softmax(torch.stack(lses), dim=0)  # (P, B, H, Tq): each piece's share of the softmax
    return sum(w[..., None] * o.float() for w, o in zip(weights, outs)).to(qc.dtype)


def _seen(allowed: Optional[Tensor], piece) -> Optional[Tensor]:
    """The pairs of ``piece`` (``position_map.Piece``) a query scores: the window's ``allowed`` ((Tq, Tk), or
    (B, 1, Tq, Tk) with padding; None: every key) over the piece's range, and its ``select``; None where that is every
    pair of the range."""
    if allowed is None:
        return piece.select
    seen = allowed[..., piece.lo : piece.hi]
    return seen if piece.select is None else seen & piece.select
