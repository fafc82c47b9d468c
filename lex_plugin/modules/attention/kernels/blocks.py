"""The block-retrieval kernel: each query attends causally to its own block and to the k - 1 earlier blocks whose
mean-pooled key it scores highest (MoBA, Lu et al. 2025, arXiv 2502.13189, section 2.2: the gate s_i = <q, mean(K_i)>,
top-k over the blocks that lie wholly before the query's own, the own block always chosen), under one softmax
(:func:`attend_blocks`; the retrieval: :class:`..retrieval.BlockRetrieval`), or with its ``local`` most recent blocks always seen
(BCA's window plus the chosen blocks: InfLLM-style retrieval at evaluation).

Blocks are fixed by absolute position: block i holds positions i b .. (i + 1) b - 1. The gate reads the keys as the
chunk's attention does (rotated by the position scheme), so <q, mean(K_i)> is the mean of the block's pre-softmax
logits (times sqrt(D)): the rotation's centre cancels in each product, so a generation step over a cache chooses the
blocks a parallel pass chooses up to fp32 rounding (a near-tie of two gates can fall either way: a hard choice; the
tests find none on real text's scale of gaps, and bf16 flips some of a random model's). With k at least the number of blocks every earlier key is chosen: full causal attention.

Two exact ways, chosen by cost: where the keys are few (Tk <= :data:`DENSE_FACTOR` k b: training at l), SDPA over all
of them with each query's chosen keys as a boolean mask (B, H, Tq, Tk), on its fused kernels; beyond, each query's keys
are gathered, k b of them ((B, H, Tq, k, b, D), queries taken in slices that bound that copy), and scored explicitly in
fp32: O(T k b D) work and memory for T queries, not O(T^2). Notation: :mod:`..executor`'s legend; nb the blocks the
chunk's keys span, b the block size, k the blocks each query attends.
"""

import math
import torch
import torch.nn.functional as F
from torch import Tensor

from ..planner import Chunk
from ..retrieval import BlockRetrieval
from .ops import sdpa, see_self, softmax_with_sink
from .run import ChunkRun

__all__ = ["DENSE_FACTOR", "GATHER_BYTES", "attend_blocks"]

# a chunk of Tk keys runs as one masked SDPA call over all of them up to DENSE_FACTOR k b keys, gathered beyond
DENSE_FACTOR = 4

# the gathered keys and values of one slice of queries stay under this many bytes (fp32): 256 MiB
GATHER_BYTES = 256 * 2**20


def attend_blocks(run: ChunkRun, chunk: Chunk) -> Tensor:
    """A dense chunk under ``run.retrieval``: queries rotated with their keys (``run.dense_inputs``), each query's own
    block (keys up to its position) and its top k - 1 earlier blocks by gate, one fp32 softmax with the learned sink
    logits if any, dropout on the weights at training. Returns (B, H, Tq, D) in q's dtype.

    Raises:
        ValueError: keys that do not start at position 0 (a bounded cache: block retrieval needs every key).

    Padded keys (``run.kpm``: right padding, the continuations of a probe's candidates; a design with blocks refuses a
    left-padded batch before it gets here) are hidden from every query but their own, as the dense kernel hides them.
    """
    retrieval: BlockRetrieval = run.retrieval
    b, k = retrieval.block, retrieval.topk
    qc, kc, vc, _, query, key = run.dense_inputs(chunk)
    first_key = run.k_start + chunk.k0
    if first_key != 0:
        raise ValueError(f"{retrieval}: the keys held start at position {first_key}; block retrieval needs every key "
                         "from position 0 on (a full-attention cache).")
    padding = None if run.kpm is None else run.kpm[:, chunk.k0 : chunk.k1]  # (B, Tk) True at padding
    bsz, heads, tq, dim = qc.shape
    tk = kc.size(2)
    nb = -(-tk // b)
    pad = nb * b - tk
    kb = F.pad(kc, (0, 0, 0, pad)).reshape(bsz, heads, nb, b, dim)  # (B, H, nb, b, D)
    means = kb.float().sum(3) / b  # (B, H, nb, D): a candidate block is complete (it ends before the query's own)
    q_pos = query[:, 0] - first_key  # (Tq,) positions relative to the first key
    own = q_pos // b  # (Tq,) the query's own block
    if run.observer is not None or tk <= DENSE_FACTOR * k * b:
        visible = _visible(qc, means, q_pos, own, retrieval, tk)  # (B, H, Tq, Tk)
        if padding is not None:
            visible = see_self(visible & ~padding[:, None, None, :], offset=int(q_pos[0]))
        if run.observer is not None:
            logits = (qc.float() @ kc.float().transpose(-1, -2)) / math.sqrt(dim)
            run.observer(logits, query - key, visible)
    if tk <= DENSE_FACTOR * k * b:  # (a widened fp32 cache under a half-precision model: one dtype for SDPA)
        out = sdpa(qc, kc.to(qc.dtype), vc.to(qc.dtype), attn_mask=visible, dropout_p=run.dropout_p, sink=run.sink(1))
        return out
    vb = F.pad(vc, (0, 0, 0, pad)).reshape(bsz, heads, nb, b, dim)
    per_query = 5 * k * b * dim * 4 * bsz * heads  # keys and values gathered, their fp32 copies, the weighted sum
    step = max(1, GATHER_BYTES // per_query)
    outs = []
    for s in range(0, tq, step):
        rows = slice(s, min(s + step, tq))
        outs.append(_attend_slice(run, qc[:, :, rows], kb, vb, means, q_pos[rows], own[rows], k, b, tk, padding))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def _choose(q: Tensor, means: Tensor, own: Tensor, k: int, local: int):
    """Each query's k blocks: (B, H, Tq, k') int64 indices, its ``local`` most recent first (own, own - 1, ...), and
    (B, H, Tq, k') bool, False at slots left empty (a local block before 0, fewer earlier blocks than k - local).
    q (B, H, Tq, D); means (B, H, nb, D) fp32; own (Tq,)."""
    nb = means.size(2)
    recent = own[:, None] - torch.arange(local, device=q.device)  # (Tq, local)
    index = recent.clamp(min=0).expand(q.size(0), q.size(1), -1, -1)
    valid = (recent >= 0).expand(q.size(0), q.size(1), -1, -1)
    if k == local or nb <= local:
        return index, valid
    gate = q.float() @ means.transpose(-1, -2)  # (B, H, Tq, nb)
    earlier = torch.arange(nb, device=q.device)[None, :] <= (own - local)[:, None]  # (Tq, nb): before the local blocks
    gate = gate.masked_fill(~earlier, float("-inf"))
    top, chosen = gate.topk(min(k - local, nb), dim=-1)  # (B, H, Tq, k - local)
    return torch.cat([index, chosen], dim=-1), torch.cat([valid, top > float("-inf")], dim=-1)


def _attend_slice(run: ChunkRun, q: Tensor, kb: Tensor, vb: Tensor, means: Tensor, q_pos: Tensor, own: Tensor,
                  k: int, b: int, tk: int, padding) -> Tensor:
    """One slice of queries q (B, H, t, D) over their chosen blocks of kb, vb (B, H, nb, b, D), padded keys
    (``padding`` (B, Tk) or None) hidden but a query's own. Returns (B, H, t, D)."""
    bsz, heads, t, dim = q.shape
    index, valid = _choose(q, means, own, k, run.retrieval.local)  # (B, H, t, k')
    batch = torch.arange(bsz, device=q.device)[:, None, None, None]
    head = torch.arange(heads, device=q.device)[None, :, None, None]
    keys, values = kb[batch, head, index], vb[batch, head, index]  # (B, H, t, k', b, D)
    logits = torch.einsum("bhtd,bhtkjd->bhtkj", q.float(), keys.float()) / math.sqrt(dim)
    position = index[..., None] * b + torch.arange(b, device=q.device)  # (B, H, t, k', b) relative key positions
    seen = valid[..., None] & (position <= q_pos.view(1, 1, -1, 1, 1)) & (position < tk)
    if padding is not None:
        padded = F.pad(padding, (0, kb.size(2) * b - tk), value=True).view(bsz, 1, 1, -1)  # (B, 1, 1, nb b)
        at = position.flatten(3).clamp(max=tk - 1)  # (B, H, t, k' b)
        hidden = torch.gather(padded.expand(-1, heads, t, -1), 3, at).view_as(position)
        seen = seen & (~hidden | (position == q_pos.view(1, 1, -1, 1, 1)))
    logits = logits.masked_fill(~seen, float("-inf")).flatten(3)  # (B, H, t, k' b)
    weights = softmax_with_sink(logits, run.sink(1))  # a learned sink logit joins the denominator with no value
    if run.dropout_p:
        weights = F.dropout(weights, p=run.dropout_p)
    out = torch.einsum("bhtn,bhtnd->bhtd", weights, values.float().flatten(3, 4))
    return out.to(q.dtype)


def _visible(q: Tensor, means: Tensor, q_pos: Tensor, own: Tensor, retrieval: BlockRetrieval, tk: int) -> Tensor:
    """(B, H, Tq, Tk) bool: the keys each query sees, its local blocks up to itself and its chosen blocks."""
    index, valid = _choose(q, means, own, retrieval.topk, retrieval.local)
    nb = means.size(2)
    slots = index.masked_fill(~valid, nb)  # an empty slot goes to a spare column
    blocks = torch.zeros(*index.shape[:-1], nb + 1, dtype=torch.bool, device=q.device)
    blocks.scatter_(-1, slots, True)  # (B, H, Tq, nb + 1): the blocks each query sees
    block_of_key = torch.arange(tk, device=q.device) // retrieval.block  # (Tk,)
    return blocks[..., block_of_key] & (torch.arange(tk, device=q.device) <= q_pos[:, None])
