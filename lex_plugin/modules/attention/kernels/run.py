"""What one ``attend`` call hands each chunk kernel (:class:`ChunkRun`): its inputs, and the helpers every kernel
shares (rotation of a block of queries and keys, a dense chunk's inputs and visibility, a windows chunk's views,
the learned sink logits as SDPA takes them). Notation: :mod:`..executor`'s legend."""

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from ...positions.scheme import PositionScheme
from ..kv_cache import RotatedPieces
from ..planner import Chunk
from ..position_map import PositionMap
from ..window import AttentionWindow
from .ops import see_self

__all__ = ["ChunkRun", "HORIZON_NATS", "Observer", "with_positions"]

# a key whose logit lies this many nats below its row's largest weighs exp(-110) < 2^-158 of it: nothing in any dtype
HORIZON_NATS = 110.0

# observer(logits (B, H, ..., Tq, Tk) fp32, distance (..., Tq, Tk) int64, visible (B or 1, 1, ..., Tq, Tk) bool;
# (B, H, Tq, Tk) under a block retrieval, whose keys are chosen per head)
Observer = Callable[[Tensor, Tensor, Tensor], None]


@dataclass(frozen=True)
class ChunkRun:
    """One ``attend`` call as its kernels see it (frozen: a kernel reads it, never sets it).

    Attributes:
        q: (B, H, T, D) queries at positions q_start ..; k, v: (B, H, S, D) keys and values at k_start ..
        window, scheme, scaling: the attention window, the position scheme and the RoPE scaling (or None).
        center: the position the keys were rotated at (a generation cache), or None: raw keys.
        kpm: (B, S) bool key padding, True at padding, or None.
        dropout_p: attention dropout; observer: :data:`Observer` or None.
        feature_major: keys and values laid out (D, S) for one query (``KeyValueCache``).
        sink_logits: (H,) learned sink logits, or None. rotated_pieces: a generation cache's rotated keys of each
            position-map piece, or None.
        positions: (B, T) int64 per-sample positions (randomized positions), or None; positions_center: their
            rotation centre (:func:`with_positions`).
        position_map: the bounded-distance map (ReRoPE, Self-Extend, DCA), or None.
        sink_keys: the sink tokens' raw keys (B, H, s, D), values and padding ((B, s) or None), or None without sinks.
        retrieval: top-k block attention (MoBA's ``blocks.BlockRetrieval``), or None.
        decay: (B, H, S) float64 cumulative log forget gates of the keys (``kv_cache.HeldKeys.decay``: the forgetting
            transformer), or None; a dense chunk's bias then gains c_n - c_m (:meth:`with_decay`), over the keys
            within its horizon (:meth:`decay_horizon`).
    """

    q: Tensor
    k: Tensor
    v: Tensor
    window: AttentionWindow
    scheme: PositionScheme
    scaling: object
    q_start: int
    k_start: int
    center: Optional[int]
    kpm: Optional[Tensor]
    dropout_p: float
    observer: Optional[Observer]
    feature_major: bool
    sink_logits: Optional[Tensor] = None  # (H,) fp32
    rotated_pieces: Optional[RotatedPieces] = None
    positions: Optional[Tensor] = None
    positions_center: int = 0
    position_map: Optional[PositionMap] = None
    sink_keys: Optional[Tuple[Tensor, Tensor, Optional[Tensor]]] = None
    retrieval: Optional[object] = None
    decay: Optional[Tensor] = None

    # ---- positions, rotation and bias of a block of queries and keys ------------------------------------

    def rotate(self, q: Tensor, k: Tensor, q_pos, k_pos, center: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        """Raw q and k at positions q_pos .., k_pos .. (ints: contiguous) rotated with one centre (default:
        near the middle of the queries: keys before it only shrink, so xPos's scale stays within
        zeta^(+-Tq/2B) however many keys precede; the planner bounds Tq, ``dense_queries``)."""
        if self.scheme.kind != "rotary":
            return q, k
        if center is None:
            center = self.scheme.center_near(q_pos + q.size(-2) // 2)
        return (self.scheme.rotate(q, start=q_pos, center=center, keys=False, scaling=self.scaling),
                self.scheme.rotate(k, start=k_pos, center=center, keys=True, scaling=self.scaling))

    def dense_inputs(self, chunk: Chunk):
        """Queries, keys, values of a dense chunk rotated, their position scheme's bias (broadcastable to (B, H, Tq,
        Tk) or None; a forget gate's decay is added apart, :meth:`with_decay`) and the (Tq, Tk) or (B, Tq, Tk) query
        and key positions."""
        qc, kc, vc = self.q[:, :, chunk.q0 : chunk.q1], self.k[:, :, chunk.k0 : chunk.k1], self.v[:, :, chunk.k0 : chunk.k1]
        if self.positions is not None:  # per-sample positions: (B, 1, T) for rotation, (B, Tq, Tk) pairs
            pq, pk = self.positions[:, chunk.q0 : chunk.q1], self.positions[:, chunk.k0 : chunk.k1]
            if self.scheme.kind == "rotary":
                qc = self.scheme.rotate_at(qc, pq[:, None], center=self.positions_center, keys=False, scaling=self.scaling)
                kc = self.scheme.rotate_at(kc, pk[:, None], center=self.positions_center, keys=True, scaling=self.scaling)
            query, key = pq[:, :, None], pk[:, None, :]
            bias = self.scheme.bias_at(query, key)
            return qc, kc, vc, None if bias is None else bias.transpose(0, 1), query, key
        q_pos, k_pos = self.q_start + chunk.q0, self.k_start + chunk.k0
        if self.center is None:
            qc, kc = self.rotate(qc, kc, q_pos, k_pos)
        query = torch.arange(q_pos, q_pos + qc.size(2), device=qc.device)[:, None]
        key = torch.arange(k_pos, k_pos + kc.size(2), device=qc.device)[None, :]
        bias = self.scheme.bias(q_pos, qc.size(2), k_pos, kc.size(2), qc.device)
        return qc, kc, vc, bias, query, key

    def with_decay(self, bias: Optional[Tensor], chunk: Chunk) -> Optional[Tensor]:
        """``bias`` (broadcastable to (B, H, Tq, Tk) fp32, or None) plus the forget gate's c_n - c_m of the chunk's
        queries and keys ((B, H, Tq, Tk): the difference in float64, then fp32, or float64 for a float64 model), or
        ``bias`` without a decay. A query is the key of its own position: its c is the held keys' at that index."""
        if self.decay is None:
            return bias
        first = self.q_start - self.k_start  # the held keys' index of query 0
        c_q = self.decay[:, :, first + chunk.q0 : first + chunk.q1]  # (B, H, Tq)
        c_k = self.decay[:, :, chunk.k0 : chunk.k1]  # (B, H, Tk)
        dtype = torch.promote_types(self.q.dtype, torch.float32)
        decay = (c_q[..., :, None] - c_k[..., None, :]).to(dtype)
        return decay if bias is None else decay + bias

    def decay_horizon(self, chunk: Chunk, q: Tensor, k: Tensor) -> int:
        """How many of a dense chunk's first keys no query of it can weigh, under a forget gate's decay: 0 without one.

        Query n sees itself, so its softmax's largest logit is at least its own, q_n . k_n / sqrt(d) (the decay is 0
        on the diagonal); key m's logit is at most |q_n| |k_m| / sqrt(d) + c_n - c_m. With Q and K the largest norms of
        the chunk's queries and keys ``q`` (B, H, Tq, D) and ``k`` (B, H, Tk, D), rotated, and c_n <= c_r for every
        query n after the chunk's first r, key m's weight is below exp(2 Q K / sqrt(d) + c_r - c_m) of the largest.
        The keys where that bound is below exp(-:data:`HORIZON_NATS`) in every (batch, head) are left out: each weighs
        under 2^-158 of the row's largest, below the fp32 softmax's smallest number (exp(-104)) and far below any
        dtype's rounding of the sum, so the output is the same to the dtype's rounding. c_m never rises with m
        (log f <= 0), so they are a prefix; a head that forgets nothing keeps every key. A position scheme's bias
        (ALiBi) is not bounded here: with one, nothing is left out (the caller's choice, ``kernels.dense``). Nor is
        anything for one query (a generation step: the keys' norms cost as much as attending to them all; 3x the
        step's time at 16k, measured), nor while a gradient is wanted (a training batch of l tokens holds little
        beyond the horizon, and the count would wait on the device once per chunk)."""
        if (self.decay is None or q.size(2) == 1 or k.size(2) <= q.size(2)
                or (torch.is_grad_enabled() and q.requires_grad)):
            return 0
        first = self.q_start - self.k_start
        c_r = self.decay[:, :, first + chunk.q0, None]  # (B, H, 1) float64
        c_k = self.decay[:, :, chunk.k0 : chunk.k1]  # (B, H, Tk)
        reach = 2.0 * q.float().norm(dim=-1).amax(-1) * k.float().norm(dim=-1).amax(-1) / math.sqrt(q.size(-1))
        beyond = ((c_r - c_k + reach.double()[..., None]) < -HORIZON_NATS).flatten(0, 1).all(0)  # (Tk,)
        return int(beyond.int().cumprod(0).sum())

    def allowed(self, chunk: Chunk, query: Tensor, key: Tensor) -> Tensor:
        """Visibility of a dense chunk by position (by index with per-sample positions: causal), with the
        padded keys hidden (each query still sees itself)."""
        if self.positions is not None:
            rows = torch.arange(chunk.q0, chunk.q1, device=query.device)[:, None]
            allowed = self.window.allowed(rows, torch.arange(chunk.k0, chunk.k1, device=query.device)[None, :])
        else:
            allowed = self.window.allowed(query, key)  # (Tq, Tk)
        if self.kpm is not None and chunk.mask == "explicit":
            allowed = see_self(allowed[None, None] & ~self.kpm[:, None, None, chunk.k0 : chunk.k1],
                               offset=chunk.q0 - chunk.k0 + self.q_start - self.k_start)
        return allowed

    def sink(self, windows: int) -> Optional[Tensor]:
        """The sink logits (1, H windows, 1, 1) fp32 for SDPA inputs laid out (B, H windows, Tq, D) (each head's
        logit repeated for its windows), or None without learned sinks."""
        if self.sink_logits is None:
            return None
        return self.sink_logits.float().repeat_interleave(windows)[None, :, None, None]

    def window_views(self, chunk: Chunk) -> Tuple[Tensor, Tensor, Tensor]:
        """The n windows of a windows chunk: queries (B, H, n, c, D), keys and values (B, H, n, 2c, D), all views."""
        n, c = chunk.blocks, chunk.stride
        qw = self.q[:, :, chunk.q0 : chunk.q1].unflatten(2, (n, c))
        kw = self.k[:, :, chunk.k0 : chunk.k1].unfold(2, 2 * c, c).transpose(-1, -2)
        vw = self.v[:, :, chunk.k0 : chunk.k1].unfold(2, 2 * c, c).transpose(-1, -2)
        return qw, kw, vw

    def window_padding(self, chunk: Chunk) -> Optional[Tensor]:
        """(B, 1, n, 1, 2c) padding of each window's keys, or None."""
        if self.kpm is None:
            return None
        return self.kpm[:, chunk.k0 : chunk.k1].unfold(1, 2 * chunk.stride, chunk.stride)[:, None, :, None, :]


def with_positions(run: ChunkRun, positions: Tensor) -> ChunkRun:
    """``run`` with per-sample positions (B, T) int64 (randomized positions) and their rotation centre.

    Raises:
        ValueError: a bounded window, a cache or an offset (positions are for training: full attention, no cache);
            positions spread too far for the scheme's scale in q's dtype.
    """
    if run.window.bounded or run.center is not None or run.k_start or run.q_start:
        raise ValueError("arbitrary positions (--random-positions) are for training: full attention, no cache.")
    low, high = int(positions.min()), int(positions.max())
    center = run.scheme.center_near((low + high) // 2)
    limit = run.scheme.max_center_offset(run.q.dtype, run.scaling)
    if limit is not None and max(high - center, center - low) > limit:
        raise ValueError(
            f"positions {low}..{high} are too far apart for --pos-emb {type(run.scheme).__name__} in {run.q.dtype} "
            f"(at most {limit} from the centre): lower --random-positions or train in fp32."
        )
    return replace(run, positions=positions, positions_center=center)
