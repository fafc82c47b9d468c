"""The landmarks kernel: landmark attention's grouped softmax (Mohtashami & Jaggi 2023, arXiv 2305.16300, section 3.1,
the grouping G and AttWeight), with the retrieval of section 3.2 (each query keeps its k highest-scoring earlier
landmarks) when :class:`~..retrieval.LandmarkRetrieval` has a top-k.

Layout: position p is the landmark of block p // P when p % P == b (P = b + 1, the period), a token otherwise; the
decoder places the landmarks (``modules.designs.landmark``). For a query at n in block c, with logits z (q k^T / sqrt(D),
the keys rotated as the chunk's attention rotates them):

* the outer softmax runs over the tokens m <= n of block c and the landmarks of the blocks i < c (a landmark query
  leaves itself out: the paper's G_{i,j} = -1 at p_i = j);
* a token m of an earlier block i gets w(landmark_i) * exp(z_m) / sum_{m' in block i} exp(z_m');
* landmarks get no weight of their own (their share is their block's).

The weights of a row sum to one. With a top-k, the landmarks outside a query's k best (per head; among equal scores the
later blocks first) leave the outer softmax and their blocks with them; top-k at least the earlier blocks is the
grouped softmax itself.

Two exact ways, chosen by cost, both fp32 (float64 for a float64 model) and in slices of queries bounded by
:data:`SLICE_BYTES`: explicit (Tq, Tk) logits over every key (training, and chunks of few keys); with a top-k over
many keys (beyond :data:`DENSE_FACTOR` (k + 1) P), each query scores the landmarks' keys and gathers its own block and
its k chosen blocks: O(Tk / P + k P) work and memory a query instead of O(Tk). Keys must start at position 0
(full attention's cache: the layout counts from the first position). Notation: :mod:`..executor`'s legend; nb the
blocks the keys span, b the tokens of a block, P = b + 1.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..planner import Chunk
from ..retrieval import LandmarkRetrieval
from .run import ChunkRun

__all__ = ["DENSE_FACTOR", "SLICE_BYTES", "attend_landmarks"]

# one slice of queries holds about six (B, H, t, Tk) fp32 tensors (gathered: each query's blocks) under this many bytes
SLICE_BYTES = 256 * 2**20

# with a top-k, a chunk of Tk keys runs the explicit (Tq, Tk) grouped softmax up to DENSE_FACTOR (k + 1) P keys, and
# gathers each query's blocks beyond (at training, under an observer or with dropout: explicit whatever Tk)
DENSE_FACTOR = 4


def attend_landmarks(run: ChunkRun, chunk: Chunk) -> Tensor:
    """A dense chunk under ``run.retrieval`` (a :class:`LandmarkRetrieval`): queries rotated with their keys
    (``run.dense_inputs``), the grouped softmax of the module docstring, dropout on the weights at training. Returns
    (B, H, Tq, D) in q's dtype.

    Padded keys (``run.kpm``) leave every group; a row left with no key (a padded query whose whole context is padding)
    sees itself, so no row is empty (the loss ignores it).

    Raises:
        ValueError: keys that do not start at position 0; learned sink logits (the grouped softmax has no slot for
            them); a bias scheme (the position scheme must be rotary or none).
    """
    retrieval: LandmarkRetrieval = run.retrieval
    if run.sink_logits is not None:
        raise ValueError(f"{retrieval}: learned sink logits would join a softmax the grouped softmax splits in two; "
                         "train landmark tokens without --learned-sinks.")
    qc, kc, vc, bias, query, key = run.dense_inputs(chunk)
    if bias is not None:
        raise ValueError(f"{retrieval} takes a rotary position scheme or none, not an additive bias.")
    if run.k_start + chunk.k0 != 0:
        raise ValueError(f"{retrieval}: the keys held start at position {run.k_start + chunk.k0}; landmark attention "
                         "needs every key from position 0 on (a full-attention cache).")
    bsz, heads, tq, dim = qc.shape
    tk = kc.size(2)
    padding = None if run.kpm is None else run.kpm[:, chunk.k0 : chunk.k1]
    gathered = (retrieval.topk is not None and run.observer is None and not run.dropout_p
                and tk > DENSE_FACTOR * (retrieval.topk + 1) * retrieval.period)
    if gathered:  # each query's own block, its landmarks' scores and its k chosen blocks: O(Tk / P + k P) a query
        per_query = 4 * bsz * heads * ((retrieval.topk + 1) * retrieval.period * (dim + 2) + tk // retrieval.period) * 4
    else:
        per_query = 6 * bsz * heads * tk * 4
    step = max(1, SLICE_BYTES // per_query)
    outs = []
    for s in range(0, tq, step):
        rows = slice(s, min(s + step, tq))
        if gathered:
            outs.append(_gathered(qc[:, :, rows], kc, vc, query[rows, 0], padding, retrieval))
            continue
        logits, out = _grouped(qc[:, :, rows], kc, vc, query[rows, 0], padding, retrieval, run.dropout_p,
                               observe=run.observer is not None)
        if run.observer is not None:
            run.observer(logits, query[rows] - key, torch.isfinite(logits))
        outs.append(out)
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def _layout(tk: int, period: int, padding, device):
    """The blocks of Tk keys from position 0: nb blocks of P positions (the last padded out to ``width`` = nb P), the
    (nb, P) int64 position of each slot, and (B or 1, nb, P) bool: a key there, not padded (``padding`` (B, Tk))."""
    nb = -(-tk // period)
    width = nb * period
    position = torch.arange(width, device=device).view(nb, period)
    present = (position < tk)[None]
    if padding is not None:
        present = present & ~F.pad(padding, (0, width - tk), value=True).view(-1, nb, period)
    return nb, width, position, present


def _gathered(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, padding, retrieval: LandmarkRetrieval) -> Tensor:
    """The grouped softmax with a top-k (:func:`_grouped`'s, equal to it up to rounding) from the keys each query
    reads: the landmarks' keys (scored), the blocks its slice of queries lies in (its own among them) and its k chosen
    blocks (gathered). Queries q (B, H, t, D) at consecutive positions q_pos (t,), keys and values (B, H, Tk, D) from
    position 0, ``padding`` (B, Tk) or None; no dropout, no observer. Returns (B, H, t, D) in q's dtype."""
    b, period, topk = retrieval.block, retrieval.period, retrieval.topk
    bsz, heads, t, dim = q.shape
    tk = k.size(2)
    dtype, device = torch.promote_types(q.dtype, torch.float32), q.device
    nb, width, position, present = _layout(tk, period, padding, device)
    present = present.expand(bsz, nb, period)
    scale = 1.0 / math.sqrt(dim)
    qf = q.to(dtype)
    kb = F.pad(k.to(dtype), (0, 0, 0, width - tk)).unflatten(2, (nb, period))  # (B, H, nb, P, D)
    vb = F.pad(v.to(dtype), (0, 0, 0, width - tk)).unflatten(2, (nb, period))
    own = q_pos // period  # (t,)
    # the landmarks: scored by every query; those of blocks before its own, not padded, compete
    land = (qf @ kb[:, :, :, b].transpose(-1, -2)) * scale  # (B, H, t, nb)
    land_seen = (torch.arange(nb, device=device)[None, :] < own[:, None])[None, None] & present[:, None, None, :, b]
    land = land.masked_fill(~land_seen, float("-inf"))
    chosen = _top_indices(land, topk)  # (B, H, t, k')
    share_logit = torch.gather(land, -1, chosen)  # (B, H, t, k'), -inf where fewer than k' landmarks compete
    # each (batch, head, block)'s b tokens as one row of a table, the chosen rows copied whole (index_select)
    rows = (torch.arange(bsz * heads, device=device).view(bsz, heads, 1, 1) * nb + chosen).flatten()
    picked_k = kb[:, :, :, :b].reshape(bsz * heads * nb, b * dim).index_select(0, rows).view(bsz, heads, t, -1, dim)
    picked_v = vb[:, :, :, :b].reshape(bsz * heads * nb, b * dim).index_select(0, rows).view(bsz, heads, t, -1, dim)
    rows = (torch.arange(bsz, device=device).view(bsz, 1, 1, 1) * nb + chosen).flatten()
    picked_present = present[:, :, :b].reshape(bsz * nb, b).index_select(0, rows).view(bsz, heads, t, -1)  # (B, H, t, k' b)
    inner = (picked_k @ qf[..., None]).squeeze(-1) * scale  # (B, H, t, k' b)
    inner = inner.masked_fill(~picked_present, float("-inf")).unflatten(-1, (-1, b))  # (B, H, t, k', b)
    # the blocks the slice lies in, each query its own one up to itself
    first, last = int(own[0]), int(own[-1])
    span = slice(first, last + 1)
    near_k = kb[:, :, span, :b].flatten(2, 3)  # (B, H, n b, D), n the blocks of the slice
    near_v = vb[:, :, span, :b].flatten(2, 3)
    near = position[span, :b].flatten()  # (n b,)
    own_seen = ((near[None, :] // period == own[:, None]) & (near[None, :] <= q_pos[:, None]))[None, None]
    own_seen = own_seen & present[:, span, :b].flatten(1)[:, None, None, :]  # (B, 1, t, n b)
    local = (qf @ near_k.transpose(-1, -2)) * scale
    local = local.masked_fill(~own_seen, float("-inf"))  # (B, H, t, n b)
    lse_outer = torch.logsumexp(torch.cat([local, share_logit], dim=-1), dim=-1)[..., None]  # (B, H, t, 1)
    empty = ~torch.isfinite(lse_outer)
    lse_outer = lse_outer.masked_fill(empty, 0.0)
    lse_inner = torch.logsumexp(inner, dim=-1, keepdim=True)
    lse_inner = lse_inner.masked_fill(~torch.isfinite(lse_inner), 0.0)
    far = (torch.exp(share_logit - lse_outer)[..., None] * torch.exp(inner - lse_inner)).flatten(-2)  # (B, H, t, k' b)
    out = torch.exp(local - lse_outer) @ near_v + (far[..., None, :] @ picked_v).squeeze(-2)
    if empty.any():  # such a row takes its own value (as _grouped's)
        out = torch.where(empty, v.to(dtype)[:, :, q_pos], out)
    return out.to(q.dtype)


def _grouped(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, padding, retrieval: LandmarkRetrieval,
             dropout_p: float, observe: bool = False):
    """Queries q (B, H, t, D) at absolute positions q_pos (t,) over keys and values (B, H, Tk, D) from position 0,
    ``padding`` (B, Tk) or None. Returns the logits each query sees in its groups ((B, H, t, Tk), -inf elsewhere: the
    observer's; None unless ``observe``) and the output (B, H, t, D) in q's dtype."""
    b, period = retrieval.block, retrieval.period
    bsz, heads, t, dim = q.shape
    tk = k.size(2)
    dtype, device = torch.promote_types(q.dtype, torch.float32), q.device
    nb, width, position, present = _layout(tk, period, padding, device)
    present = present[:, None, None]  # (B or 1, 1, 1, nb, P)
    logits = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) / math.sqrt(dim)  # (B, H, t, Tk)
    grid = F.pad(logits, (0, width - tk), value=float("-inf")).unflatten(-1, (nb, period))  # (B, H, t, nb, P)
    block = torch.arange(nb, device=device)  # (nb,)
    own = (q_pos // period)[:, None]  # (t, 1)
    token = position[:, :b]  # (nb, b)
    own_seen = (block[None, :, None] == own[..., None]) & (token[None] <= q_pos[:, None, None])  # (t, nb, b)
    own_seen = own_seen & present[..., :b]  # (B or 1, 1, t, nb, b)
    earlier = (block[None, :] < own).view(1, 1, t, nb)  # (1, 1, t, nb)
    land_seen = earlier & present[..., b]  # (B or 1, 1, t, nb)
    land = grid[..., b]  # (B, H, t, nb)
    land_seen = land_seen.expand(bsz, heads, t, nb)
    if retrieval.topk is not None and retrieval.topk < nb:
        land_seen = land_seen & _top(land.masked_fill(~land_seen, float("-inf")), retrieval.topk)
    inner_seen = land_seen[..., None] & present[..., :b]  # (B, H, t, nb, b): the chosen earlier blocks' tokens
    tokens = grid[..., :b]
    outer = torch.cat([tokens.masked_fill(~own_seen, float("-inf")).flatten(-2),
                       land.masked_fill(~land_seen, float("-inf"))], dim=-1)  # (B, H, t, nb b + nb)
    empty = ~torch.isfinite(outer).any(-1)  # (B, H, t): a padded query with nothing to see
    lse_outer = torch.logsumexp(outer, dim=-1).masked_fill(empty, 0.0)  # (B, H, t)
    inner = tokens.masked_fill(~inner_seen, float("-inf"))
    lse_inner = torch.logsumexp(inner, dim=-1)  # (B, H, t, nb), -inf where a block is not seen
    lse_inner = lse_inner.masked_fill(~torch.isfinite(lse_inner), 0.0)
    share = torch.exp(land.masked_fill(~land_seen, float("-inf")) - lse_outer[..., None])  # (B, H, t, nb)
    weights = (torch.exp(tokens.masked_fill(~own_seen, float("-inf")) - lse_outer[..., None, None])
               + share[..., None] * torch.exp(inner - lse_inner[..., None]))  # (B, H, t, nb, b)
    values = F.pad(v.to(dtype), (0, 0, 0, width - tk)).unflatten(2, (nb, period))[:, :, :, :b]  # (B, H, nb, b, D)
    weights = weights.flatten(-2)  # (B, H, t, nb b)
    if empty.any():  # such a row takes its own value (its own position: a token, or a landmark's)
        own_value = v.to(dtype)[:, :, q_pos]  # (B, H, t, D)
    if dropout_p:
        weights = F.dropout(weights, p=dropout_p)
    out = weights @ values.flatten(2, 3)  # (B, H, t, D)
    if empty.any():
        out = torch.where(empty[..., None], own_value, out)
    if not observe:
        return None, out.to(q.dtype)
    seen = torch.cat([own_seen.expand(bsz, heads, t, nb, b) | inner_seen, land_seen[..., None]], dim=-1)
    observed = grid.masked_fill(~seen, float("-inf")).flatten(-2)[..., :tk]
    return observed, out.to(q.dtype)


def _top_indices(scores: Tensor, k: int) -> Tensor:
    """(..., k) int64: the indices of the k highest of ``scores`` (..., nb) along the last axis, ties going to the later
    block (a landmark's key can equal another's exactly: without positions every landmark enters the first layer as the
    same vector), so the choice is the same in every pass, whatever its shape. -inf entries may be among them where
    fewer than k are finite; the caller masks them."""
    return scores.size(-1) - 1 - torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices[..., :k]


def _top(scores: Tensor, k: int) -> Tensor:
    """(..., nb) bool: True at :func:`_top_indices` (the k highest of ``scores``, ties to the later block)."""
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, _top_indices(scores, k), True)
