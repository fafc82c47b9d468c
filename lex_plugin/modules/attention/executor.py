"""The attention executor: the one place attention scores exist. It runs the chunks of
:func:`~.planner.plan` on SDPA, with the position scheme.

For each chunk it (1) rotates queries and keys with the scheme unless they already are (a generation
cache stores keys rotated at its centre, ``center``), (2) asks the scheme for its additive bias, (3)
builds SDPA's mask, the cheapest that is exact: none, ``is_causal``, ``causal_lower_right`` (fused
kernels), or an explicit boolean / additive float mask (:func:`additive_mask`), and (4) calls
``F.scaled_dot_product_attention``, except for one query over a feature-major generation cache
(``KeyValueCache``), a bf16 / fp16 one on CPU or any one on CUDA, which runs as two matrix-vector products
(:func:`_one_query`).
Sink tokens (StreamingLLM, LM-Infinite) are keys placed at virtual positions: the scheme rotates them (or
biases them) there, and the executor scores them with the window's keys under one softmax. Randomized positions (Ruoss et al. 2023) are
per-sample position ids for the same dense chunks. Learned sink logits (gpt-oss: one per head, joining every
softmax's denominator with no value) enter every chunk shape: an extra key in each SDPA call (:func:`_sdpa`), an
extra column where logits are explicit, an extra piece where pieces merge by their log-sum-exps. With an
``observer`` it also hands the pre-softmax
logits it computes to the observer (the analysis tools read them from here, so they follow any change
to attention).

Positions of un-rotated inputs: a dense chunk rotates queries and keys at their own positions with one
centre (``scheme.center_near`` of the middle of its queries: earlier keys only shrink, and the planner keeps
a chunk's queries within the scheme's range, so full attention stays finite at any length); a windows chunk
rotates every window at local positions (queries c .. 2c - 1, keys 0 .. 2c - 1; shifted by k with k sinks), so
one (2c, d/2) table serves all windows and xPos's zeta^(+-n/B) stays within zeta^(+-c/B) at any length: finite in fp32,
bf16 and fp16. For a translation-invariant scheme this equals global positions (the logit depends only
on n - m); the planner gives the others dense chunks only, at true positions.

Notation (shape comments and names in this module):

* B batch, H heads, D head dimension; T queries of one call, S keys held; Tq, Tk the queries and keys of one
  chunk; n, m query and key positions (n - m the distance; a position map's ``pieces(n, m)``).
* A windows chunk: ``chunk.blocks`` windows (``n`` where no position is in scope) of c queries
  (``chunk.stride``: the BCA block w = l/2 or the sliding width W), each against 2c keys; G the leading window
  axis of a chunk under sinks (its windows, or 1 for a dense chunk).
* s (or k) the sink keys held; f a window's first key. lse: SDPA's log-sum-exp of a softmax row.
* Suffixes of a tensor's name say which slice it is: ``qc/kc/vc`` a dense chunk's queries, keys and values;
  ``qw/kw/vw`` a windows chunk's views (B, H, n, c or 2c, D); ``qb/kb/vb`` the same under sinks (windows or
  dense, a G axis either way); ``qr/kr`` a position map's piece, rotated at its remapped positions; ``pq/pk``
  per-sample query and key positions (randomized positions). ``kpm``: the key padding mask (B, S), True at
  padding.
"""

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import CausalBias, causal_lower_right

from ..autocast import autocast_dtype
from ..positions.scheme import PositionScheme
from .kv_cache import HeldKeys, RotatedPieces
from .planner import Chunk
from .position_map import PositionMap
from .temperature import logn_scale
from .spec import AttentionSpec
from .window import AttentionWindow

__all__ = ["Observer", "additive_mask", "attend", "see_self"]

# queries per SDPA call under a rotary position map: each call copies its keys into their pieces' slots, so
# larger blocks copy less often; each holds a (Tq, Tk) mask (executor.remapped)
MAP_QUERY_BLOCK = 2048
# A one-query step over a bf16 / fp16 cache on CPU runs its two products per (batch, head) in that dtype beyond this
# many keys, and batched in fp32 on fp32 copies up to it: this CPU's half-precision products cost ~50 us a call
# whatever their size, so over 256 keys (a BCA window) the fp32 copies are 5x faster, and over 16k keys the per-head
# products 3.4x (examples/lex_lm/BENCHMARKS.md, "bf16 generation over short windows"). From kv_cache.FEATURE_MAJOR_KEYS
# keys on, a generation cache widens itself to fp32 feature-major, and its steps take fp32's path ("bf16 generation at
# 16k"): the per-head products serve the caches in between, and one-query chunks that are no cache's.
HALF_STEP_FP32_KEYS = 2048

# observer(logits (B, H, ..., Tq, Tk) fp32, distance (..., Tq, Tk) int64, visible (B or 1, 1, ..., Tq, Tk) bool)
Observer = Callable[[Tensor, Tensor, Tensor], None]


def attend(
    q: Tensor,
    held: HeldKeys,
    chunks: List[Chunk],
    *,
    spec: AttentionSpec,
    scheme: PositionScheme,
    q_start: int = 0,
    dropout_p: float = 0.0,
    observer: Optional[Observer] = None,
    positions: Optional[Tensor] = None,
    sink_logits: Optional[Tensor] = None,
) -> Tensor:
    """softmax(q k^T / sqrt(d) + bias + mask) v over the planned chunks.

    Args:
        q: (B, H, T, D) queries at positions q_start .. q_start + T - 1, rotated at ``held.center`` if it is set.
        held: the keys and values (B, H, S, D) at positions held.start .. q_start + T - 1 and what attention must
            know about them (:class:`~.kv_cache.HeldKeys`: padding, whether and where they are rotated, the sinks,
            the layout): ``HeldKeys(k, v, padding)`` for a parallel pass, ``KeyValueCache.held`` for a cache.
            A padded query still sees itself (``see_self``), so no softmax row is empty; the loss ignores those rows.
            Feature-major keys (a cache laid out for one query) run a one-query chunk as two matrix-vector products.
        chunks: ``plan(spec.window, q_start=q_start, q_len=T, k_start=held.start, ...)``.
        spec: the window the plan was made for (explicit masks are built from it) and the RoPE scaling
            the scheme rotates with.
        scheme: the position scheme (rotation and / or bias; a no-op for NoPE and absolute schemes).
        dropout_p: attention dropout.
        observer: called once per chunk (per window for windows chunks) with the fp32 pre-softmax
            logits, the distances n - m and the visibility mask.
        positions: (B, T) int64 strictly increasing position ids of each sample's queries and keys
            (randomized positions at training), or None: positions q_start ..; full attention, no cache.
        sink_logits: (H,) learned sink logits s_h (gpt-oss), or None: each softmax row becomes
            exp(z_j) / (exp(s_h) + sum_i exp(z_i)), the sink taking its share of the mass and giving no value;
            differentiable in s_h. The observer's logits do not include it (it has no key or distance).

    Under ``torch.autocast`` (``modules.autocast``) q, k and v are cast to its dtype and attention runs with
    autocast off, exactly as in a model of that dtype: rotation and biases in fp32, softmax statistics in fp32.

    Returns:
        (B, H, T, D) in q's dtype (the autocast dtype under autocast).

    Raises:
        ValueError: sinks over rotated or offset keys without ``sinks``; ``positions`` with a bounded
            window, a cache or sinks, or spread too far for the scheme's scale in q's dtype.
    """
    dtype = autocast_dtype(q.device)
    if dtype is not None:  # autocast: run as a model of its dtype does (position math fp32 inside), autocast off
        with torch.autocast(q.device.type, enabled=False):  # (a cache's sink keys already hold its dtype)
            # a half cache widened for one query (fp32, feature-major: KeyValueCache) is read as it is, not copied back
            keep = held.feature_major and held.keys.dtype == torch.float32
            cast = held if keep else replace(held, keys=held.keys.to(dtype), values=held.values.to(dtype))
            return attend(q.to(dtype), cast, chunks, spec=spec, scheme=scheme, q_start=q_start, dropout_p=dropout_p,
                          observer=observer, positions=positions, sink_logits=sink_logits)
    if spec.logn:
        if positions is not None:
            raise ValueError("log-n scaling is an evaluation option; it does not apply to randomized training positions.")
        visible = spec.window.visible_keys(torch.arange(q_start, q_start + q.size(2), device=q.device))
        q = (q.float() * logn_scale(visible, spec.logn)[:, None]).to(q.dtype)  # one rounding, the factor exact in fp32
    if spec.logit_scale is not None and spec.logit_scale != 1.0:  # a constant temperature (DroPE's recalibration)
        q = (q.float() * spec.logit_scale).to(q.dtype)
    k, v, center, sinks = held.keys, held.values, held.center, held.sinks
    run = _Run(q, k, v, spec.window, scheme, spec.rope_scaling, q_start, held.start, center, held.padding,
               dropout_p, observer, held.feature_major, sink_logits, held.rotated_pieces)
    if spec.position_map is not None:
        if center is not None or positions is not None:
            raise ValueError("a position map rotates raw keys at remapped positions: give un-rotated keys (center=None), "
                             "no per-sample positions.")
        outs = [run.remapped(chunk, spec.position_map) for chunk in chunks]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    if positions is not None:
        run.use_positions(positions)
    if not scheme.translation_invariant and any(chunk.blocks for chunk in chunks):
        raise ValueError(f"{type(scheme).__name__} is not translation-invariant: it must see true positions, so plan "
                         "its attention with local_positions=False (no batched windows).")
    if run.window.sinks:
        if sinks is None:
            if center is not None or held.start:
                raise ValueError("attention with sink tokens over a cache needs the cache's un-rotated sink keys.")
            s = run.window.sinks
            sinks = (k[:, :, :s], v[:, :, :s], None if held.padding is None else held.padding[:, :s])
        outs = [run.with_sinks(chunk, *sinks) for chunk in chunks]
    else:
        outs = [run.blocks(chunk) if chunk.blocks else run.dense(chunk) for chunk in chunks]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def additive_mask(allowed: Tensor, bias: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """SDPA's mask from a boolean visibility (True: may attend) and an optional fp32 bias that broadcast
    together: the boolean itself without a bias, else the bias with -inf where not allowed, in ``dtype``."""
    if bias is None:
        return allowed
    return bias.masked_fill(~allowed, float("-inf")).to(dtype)


def _four_d(mask: Optional[Tensor]) -> Optional[Tensor]:
    """A mask with leading size-1 dimensions up to 4-D: SDPA's fast CPU kernels take a (1, H, Tq, Tk) mask; a
    3-D (H, Tq, Tk) one sends them to a path 3.2x slower (BENCHMARKS.md, "The core, finished")."""
    if mask is None or mask.dim() >= 4:
        return mask
    return mask.view((1,) * (4 - mask.dim()) + tuple(mask.shape))


def see_self(allowed: Tensor, offset: int = 0) -> Tensor:
    """Let query t of a (..., T, S) boolean mask see key t + offset (its own position), in place, so that
    masking padded keys never leaves a softmax row empty (pad rows then give finite values the loss
    ignores). Returns ``allowed``."""
    rows = torch.arange(allowed.size(-2), device=allowed.device)
    allowed[..., rows, rows + offset] = True
    return allowed


def _logits(q: Tensor, k: Tensor, bias: Optional[Tensor]) -> Tensor:
    """fp32 q k^T / sqrt(d) (+ bias) over the last two dimensions."""
    logits = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.size(-1))
    return logits if bias is None else logits + bias


@dataclass
class _Run:
    """One ``attend`` call: its inputs, and one method per chunk shape."""

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
    rotated_pieces: Optional[RotatedPieces] = None  # a generation cache's rotated keys of each position-map piece
    positions: Optional[Tensor] = None
    positions_center: int = 0

    def use_positions(self, positions: Tensor) -> None:
        if self.window.bounded or self.center is not None or self.k_start or self.q_start:
            raise ValueError("arbitrary positions (--random-positions) are for training: full attention, no cache.")
        low, high = int(positions.min()), int(positions.max())
        self.positions_center = self.scheme.center_near((low + high) // 2)
        limit = self.scheme.max_center_offset(self.q.dtype, self.scaling)
        if limit is not None and max(high - self.positions_center, self.positions_center - low) > limit:
            raise ValueError(
                f"positions {low}..{high} are too far apart for --pos-emb {type(self.scheme).__name__} in {self.q.dtype} "
                f"(at most {limit} from the centre): lower --random-positions or train in fp32."
            )
        self.positions = positions

    # ---- positions, rotation and bias of a block of queries and keys ------------------------------------

    def _rotate(self, q: Tensor, k: Tensor, q_pos, k_pos, center: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        """Raw q and k at positions q_pos .., k_pos .. (ints: contiguous) rotated with one centre (default:
        near the middle of the queries: keys before it only shrink, so xPos's scale stays within
        zeta^(+-Tq/2B) however many keys precede; the planner bounds Tq, ``dense_queries``)."""
        if self.scheme.kind != "rotary":
            return q, k
        if center is None:
            center = self.scheme.center_near(q_pos + q.size(-2) // 2)
        return (self.scheme.rotate(q, start=q_pos, center=center, keys=False, scaling=self.scaling),
                self.scheme.rotate(k, start=k_pos, center=center, keys=True, scaling=self.scaling))

    def _block(self, chunk: Chunk):
        """Queries, keys, values of a dense chunk rotated, their bias (broadcastable to (B, H, Tq, Tk) or
        None) and the (Tq, Tk) or (B, Tq, Tk) query and key positions."""
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
            qc, kc = self._rotate(qc, kc, q_pos, k_pos)
        query = torch.arange(q_pos, q_pos + qc.size(2), device=qc.device)[:, None]
        key = torch.arange(k_pos, k_pos + kc.size(2), device=qc.device)[None, :]
        return qc, kc, vc, self.scheme.bias(q_pos, qc.size(2), k_pos, kc.size(2), qc.device), query, key

    def _allowed(self, chunk: Chunk, query: Tensor, key: Tensor) -> Tensor:
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

    # ---- the chunk shapes ---------------------------------------------------------------------------------

    def dense(self, chunk: Chunk) -> Tensor:
        qc, kc, vc, bias, query, key = self._block(chunk)
        allowed = None
        if chunk.mask == "explicit" or bias is not None or self.observer is not None:
            allowed = self._allowed(chunk, query, key)
            if self.observer is not None:
                self.observer(_logits(qc, kc, bias), query - key, allowed)
        if qc.size(2) == 1 and not self.dropout_p and (self.feature_major or _step_as_products(qc)):
            return _one_query(qc, kc, vc, bias, allowed if chunk.mask == "explicit" else None, self._sink(1))
        is_causal, mask = False, None
        if bias is not None or chunk.mask == "explicit":
            mask = _four_d(additive_mask(allowed, bias, qc.dtype))
        elif chunk.mask == "causal":
            if qc.size(2) == kc.size(2):
                is_causal = True
            else:
                mask = causal_lower_right(qc.size(2), kc.size(2))
        return _sdpa(qc, kc, vc, attn_mask=mask, dropout_p=self.dropout_p, is_causal=is_causal, sink=self._sink(1))

    def _sink(self, windows: int) -> Optional[Tensor]:
        """The sink logits (1, H windows, 1, 1) fp32 for SDPA inputs laid out (B, H windows, Tq, D) (each head's
        logit repeated for its windows), or None without learned sinks."""
        if self.sink_logits is None:
            return None
        return self.sink_logits.float().repeat_interleave(windows)[None, :, None, None]

    def remapped(self, chunk: Chunk, position_map: PositionMap) -> Tensor:
        """A dense chunk of full attention under a position map (:mod:`.position_map`).

        Rotary schemes: each piece rotates the queries at its positions and its keys at theirs (one centre per
        piece) and attends, on SDPA's fused CPU kernel, to the keys it selects, returning its output and the
        log-sum-exp of its logits (:func:`_attention_lse`); the pieces' outputs are merged by their log-sum-exps,
        which is one softmax over every key. A generation step's one query (fp32, or bf16 / fp16 on CPU) instead
        scores every piece into one row of logits and takes one softmax (:func:`_step_logits`; in half precision each
        piece's product in fp32 or per head by its own key count, so one row may hold both). Bias schemes: one SDPA
        call, biased at the remapped distance.

        Queries go in the map's blocks of at most ``MAP_QUERY_BLOCK`` (``PositionMap.query_blocks``: DCA's also end
        at chunk boundaries), so each block meets only the keys its pieces can select (the far piece of a block of
        ReRoPE ends w before its last query): about the pairs of causal attention."""
        blocks = position_map.query_blocks(self.q_start + chunk.q0, self.q_start + chunk.q1, MAP_QUERY_BLOCK)
        if len(blocks) > 1:
            return torch.cat([self.remapped(Chunk(a - self.q_start, b - self.q_start, chunk.k0,
                                                  b - self.q_start + chunk.k1 - chunk.q1, chunk.mask), position_map)
                              for a, b in blocks], dim=2)
        if self.dropout_p:
            raise ValueError("position maps are an evaluation method: run them without attention dropout (model.eval()).")
        qc, kc, vc = self.q[:, :, chunk.q0 : chunk.q1], self.k[:, :, chunk.k0 : chunk.k1], self.v[:, :, chunk.k0 : chunk.k1]
        dev = qc.device
        n = torch.arange(self.q_start + chunk.q0, self.q_start + chunk.q1, device=dev)
        m = torch.arange(self.k_start + chunk.k0, self.k_start + chunk.k1, device=dev)
        allowed = None  # one query after every key, no padding: a position map's window (full) sees them all
        last_key, first_query = self.k_start + chunk.k1 - 1, self.q_start + chunk.q0  # (ints: no device sync)
        if self.kpm is not None or qc.size(2) > 1 or last_key > first_query or self.scheme.kind != "rotary":
            allowed = self.window.allowed(n[:, None], m[None, :])  # (Tq, Tk)
        if self.kpm is not None:
            allowed = see_self(allowed[None, None] & ~self.kpm[:, None, None, chunk.k0 : chunk.k1],
                               offset=chunk.q0 - chunk.k0 + self.q_start - self.k_start)  # (B, 1, Tq, Tk)
        if self.scheme.kind != "rotary":  # a bias at the remapped (integer) distance
            distance = position_map.distance(n[:, None], m[None, :]).clamp(min=0).long()
            bias = self.scheme.bias_at(distance, torch.zeros_like(distance))  # (H, Tq, Tk)
            if self.observer is not None:
                self.observer(_logits(qc, kc, bias), n[:, None] - m[None, :], allowed)
            return _sdpa(qc, kc, vc, attn_mask=_four_d(additive_mask(allowed, bias, qc.dtype)), sink=self._sink(1))
        rotated = []
        # a generation cache keeps the rotated keys of each kind of piece, from the first key (RotatedPieces)
        memo = self.rotated_pieces if chunk.k0 == 0 and self.k_start == 0 else None
        limit = self.scheme.max_center_offset(qc.dtype, self.scaling)  # None: no scale, any centre is exact
        for piece in position_map.pieces(n, m):
            # the map's shared centre where the scheme's scale allows it about every position the map uses; else
            # centred among the piece's queries: a selected key is never after its query, so keys only shrink
            # (Self-Extend's far keys at m / G would otherwise put zeta^(n / 2GB) on the queries: fp16 overflows), and
            # the pieces of one kind no longer share their rotated keys (RotatedPieces keeps one centre's)
            center = None if piece.center is None else self.scheme.center_near(piece.center)
            if center is None or (limit is not None and max(center, position_map.max_position - center) > limit):
                center = self.scheme.center_near(int(piece.q_pos.min() + piece.q_pos.max()) // 2)
            rotate = partial(self.scheme.rotate_at, center=center, keys=True, scaling=self.scaling)
            keys = (rotate(kc[:, :, piece.lo : piece.hi], piece.k_pos) if memo is None
                    else memo.keys(piece.kind, center, kc, piece.lo, piece.hi, piece.k_pos, rotate))
            rotated.append((piece, self.scheme.rotate_at(qc, piece.q_pos, center=center, keys=False, scaling=self.scaling),
                            keys))
        if self.observer is not None:
            logits = torch.full(qc.shape[:-1] + (kc.size(2),), float("-inf"), device=dev)
            for piece, qr, kr in rotated:
                part = logits[..., piece.lo : piece.hi]
                part.copy_(_logits(qr, kr, None) if piece.select is None else torch.where(piece.select, _logits(qr, kr, None), part))
            self.observer(logits, n[:, None] - m[None, :], self.window.allowed(n[:, None], m[None, :]) if allowed is None else allowed)
        if qc.size(2) == 1 and (qc.dtype == torch.float32 or _step_as_products(qc)):
            # a generation step: one row of logits over every piece, one softmax (no SDPA call per piece)
            scores = torch.full(qc.shape[:-1] + (kc.size(2),), float("-inf"), device=dev)  # (B, H, 1, Tk) fp32
            for piece, qr, kr in rotated:
                part, seen = scores[..., piece.lo : piece.hi], _seen(allowed, piece)
                part.copy_(_step_logits(qr, kr) if seen is None else torch.where(seen, _step_logits(qr, kr), part))
            return _weighted_values(scores, vc, self._sink(1)).to(qc.dtype)
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
                    out, lse = _attention_lse(qr, kr[:, :, a:b], vc[:, :, piece.lo + a : piece.lo + b],
                                              seen[..., a:b] if masked else None)
                    outs.append(out)
                    lses.append(lse)
        if self.sink_logits is not None:  # the sink: one more piece, its log-sum-exp s_h, its output 0
            lses.append(self.sink_logits.float()[:, None].expand_as(lses[0]))
            outs.append(torch.zeros_like(outs[0]))
        if len(outs) == 1:
            return outs[0]
        weights = torch.softmax(torch.stack(lses), dim=0)  # (P, B, H, Tq): each piece's share of the softmax
        return sum(w[..., None] * o.float() for w, o in zip(weights, outs)).to(qc.dtype)

    def _window_views(self, chunk: Chunk) -> Tuple[Tensor, Tensor, Tensor]:
        """The n windows of a windows chunk: queries (B, H, n, c, D), keys and values (B, H, n, 2c, D), all views."""
        n, c = chunk.blocks, chunk.stride
        qw = self.q[:, :, chunk.q0 : chunk.q1].unflatten(2, (n, c))
        kw = self.k[:, :, chunk.k0 : chunk.k1].unfold(2, 2 * c, c).transpose(-1, -2)
        vw = self.v[:, :, chunk.k0 : chunk.k1].unfold(2, 2 * c, c).transpose(-1, -2)
        return qw, kw, vw

    def _window_padding(self, chunk: Chunk) -> Optional[Tensor]:
        """(B, 1, n, 1, 2c) padding of each window's keys, or None."""
        if self.kpm is None:
            return None
        return self.kpm[:, chunk.k0 : chunk.k1].unfold(1, 2 * chunk.stride, chunk.stride)[:, None, :, None, :]

    def blocks(self, chunk: Chunk) -> Tensor:
        """n windows of c queries against their 2c keys, at window-local positions, in one SDPA call on 4-D
        inputs ((B, H n, c, D): the shape of SDPA's fast CPU kernels); a mask or bias is 4-D too, one
        (H or 1, c, 2c) for every window unless padding makes it per window."""
        n, c = chunk.blocks, chunk.stride
        bsz, heads, _, dim = self.q.shape
        qw, kw, vw = self._window_views(chunk)
        if self.center is None:
            qw, kw = self._rotate(qw, kw, c, 0)  # window-local positions
        bias = self.scheme.bias(c, c, 0, 2 * c, self.q.device)  # (H, c, 2c): only distances matter
        allowed = None
        if chunk.mask == "explicit" or self.observer is not None:
            query = torch.arange(c, 2 * c, device=self.q.device)[:, None]
            key = torch.arange(0, 2 * c, device=self.q.device)[None, :]
            allowed = self.window.allowed(query, key)  # (c, 2c) in local positions
            pad = self._window_padding(chunk) if chunk.mask == "explicit" else None
            if pad is not None:
                allowed = see_self(allowed[None, None] & ~pad, offset=c)  # (B, 1, n, c, 2c)
            if self.observer is not None:
                self.observer(_logits(qw, kw, None if bias is None else bias[:, None]), query - key, allowed)
            if pad is not None and bias is not None:
                bias = bias[:, None]  # (H, 1, c, 2c) against (B, 1, n, c, 2c)
        if chunk.mask == "causal":  # BCA's (c, 2c) mask is causal aligned to the lower right: fused kernels
            shape = (bsz, heads * n)
            out = _sdpa(qw.reshape(*shape, c, dim), kw.reshape(*shape, 2 * c, dim), vw.reshape(*shape, 2 * c, dim),
                        attn_mask=causal_lower_right(c, 2 * c), dropout_p=self.dropout_p, sink=self._sink(n))
            return out.view(bsz, heads, n, c, dim).flatten(2, 3)
        # windows in the batch: (B n, H, c or 2c, D), so one (H, c, 2c) bias (or (c, 2c) mask) serves every
        # window and sample, or padding gives a (B n, 1 or H, c, 2c) mask: 4-D, SDPA's fast kernels
        mask = additive_mask(allowed, bias, self.q.dtype)  # (c, 2c) | (H, c, 2c) | (B, H or 1, n, c, 2c)
        mask = mask.transpose(1, 2).flatten(0, 1) if mask.dim() == 5 else _four_d(mask)
        out = _sdpa(_windows_in_batch(qw), _windows_in_batch(kw), _windows_in_batch(vw), attn_mask=mask,
                    dropout_p=self.dropout_p, sink=self._sink(1))
        return out.unflatten(0, (bsz, n)).transpose(1, 2).flatten(2, 3)

    def with_sinks(self, chunk: Chunk, sink_k: Tensor, sink_v: Tensor, sink_pad: Optional[Tensor]) -> Tensor:
        """One chunk with sink tokens, computed explicitly in fp32: the window's keys at their own positions,
        the sinks at virtual positions (``window.sink_distance`` before each query), one softmax over both;
        padded sinks are never seen."""
        window, dev, held = self.window, self.q.device, sink_k.size(2)
        if sink_pad is not None and not bool(sink_pad.any()):
            sink_pad = None
        if (chunk.blocks and window.mode == "bca" and self.q_start + chunk.q0 >= 2 * chunk.stride and self.center is None
                and self.kpm is None and sink_pad is None and self.observer is None and held == window.sinks
                and self.scheme.kind != "bias"):
            return self._bca_windows_with_sinks(chunk, sink_k, sink_v)
        if chunk.blocks:  # n windows of c queries against 2c keys, positions local to each window (shifted by k)
            n, c = chunk.blocks, chunk.stride
            qb, kb, vb = self._window_views(chunk)
            step = torch.arange(n, device=dev)[:, None] * c
            query = self.q_start + chunk.q0 + step + torch.arange(c, device=dev)  # (n, c) global positions
            key = self.k_start + chunk.k0 + step + torch.arange(2 * c, device=dev)  # (n, 2c)
            if self.center is None:  # local frame, shifted by k so that every sink's virtual position is >= 0
                frame = c + window.sinks  # local position of each window's first query
                qb, kb = self._rotate(qb, kb, frame, window.sinks)
                q_local, center = (frame + torch.arange(c, device=dev)).expand(n, c), self.scheme.center_near(window.sinks + c)
            else:  # rotated by the cache: global positions at its centre
                q_local, center = query, self.center
            bias = self.scheme.bias(c, c, 0, 2 * c, dev)
            bias = None if bias is None else bias[:, None]
            pad = self._window_padding(chunk)
        else:
            qb, kb, vb = (t[:, :, None, a:b] for t, (a, b) in ((self.q, (chunk.q0, chunk.q1)), (self.k, (chunk.k0, chunk.k1)),
                                                               (self.v, (chunk.k0, chunk.k1))))
            q_pos, k_pos = self.q_start + chunk.q0, self.k_start + chunk.k0
            center = self.center if self.center is not None else self.scheme.center_near(k_pos + kb.size(-2) // 2)
            if self.center is None:
                qb, kb = self._rotate(qb, kb, q_pos, k_pos, center)
            query = torch.arange(q_pos, q_pos + qb.size(-2), device=dev)[None]  # (1, Tq)
            key = torch.arange(k_pos, k_pos + kb.size(-2), device=dev)[None]
            q_local = query
            bias = self.scheme.bias(q_pos, qb.size(-2), k_pos, kb.size(-2), dev)
            bias = None if bias is None else bias[:, None]  # (H, 1, Tq, Tk) against (B, H, 1, Tq, Tk)
            pad = None if self.kpm is None else self.kpm[:, None, None, None, chunk.k0 : chunk.k1]
        logits = _logits(qb, kb, bias)  # (B, H, G, Tq, Tk)
        visible = window.in_window(query[..., None], key[..., None, :])  # (G, Tq, Tk)
        if pad is not None:
            visible = see_self(visible[None, None] & ~pad, offset=int(query[0, 0] - key[0, 0]))
        j = torch.arange(held, device=dev)
        sink_visible = window.sink_visible(query[..., None], j)  # (G, Tq, s)
        if sink_pad is not None:
            sink_visible = sink_visible[None, None] & ~sink_pad[:, None, None, None, :]  # (B, 1, G, Tq, s)
        distance = window.sink_distance(query[..., None], j).clamp(min=0)  # (G, Tq, s)
        sink_logits = self._sink_logits(qb, sink_k, q_local[..., None] - distance, query[..., None] - distance, query, center)
        all_logits = torch.cat([logits, sink_logits], dim=-1)
        all_visible = torch.cat([visible.expand_as(logits), sink_visible.expand_as(sink_logits)], dim=-1)
        if self.observer is not None:
            self.observer(all_logits, torch.cat([query[..., None] - key[..., None, :], distance], dim=-1), all_visible)
        all_logits = all_logits.masked_fill(~all_visible, float("-inf"))
        if self.sink_logits is not None:  # the learned sink: one more column, seen by every query, no value
            learned = self.sink_logits.float()[:, None, None, None].expand(*all_logits.shape[:-1], 1)
            all_logits = torch.cat([all_logits, learned], dim=-1)
        probs = torch.softmax(all_logits, dim=-1)
        if self.dropout_p:
            probs = F.dropout(probs, self.dropout_p)
        keys = kb.size(-2)  # (a learned sink's column, last, has no value)
        out = probs[..., :keys] @ vb.float() + probs[..., keys : keys + held] @ sink_v.float()[:, :, None]
        return out.flatten(2, 3).to(self.q.dtype)

    def _sink_logits(self, qb: Tensor, sink_k: Tensor, local: Tensor, virtual: Tensor, query: Tensor, center: int) -> Tensor:
        """fp32 logits (B, H, G, Tq, s) of rotated queries qb (B, H, G, Tq, D) against the raw sink keys
        (B, H, s, D) placed at virtual positions: ``local`` (G, Tq, s) in the queries' rotation frame (the
        scheme rotates each sink key there, with the queries' centre), ``virtual`` (G, Tq, s) global ones for
        the bias at true positions ``query`` (G, Tq)."""
        columns = []
        for j in range(sink_k.size(2)):  # one sink at a time: (B, H, G, Tq, D) rotated copies, not s of them
            key = sink_k[:, :, None, None, j]  # (B, H, 1, 1, D)
            if self.scheme.kind == "rotary":
                key = self.scheme.rotate_at(key, local[..., j], center=center, keys=True, scaling=self.scaling)  # (B, H, G, Tq, D)
            columns.append((qb.float() * key.float()).sum(-1))
        logits = torch.stack(columns, dim=-1) / math.sqrt(qb.size(-1))
        bias = self.scheme.bias_at(query[..., None], virtual)  # (H, G, Tq, s)
        return logits if bias is None else logits + bias

    def _bca_windows_with_sinks(self, chunk: Chunk, sink_k: Tensor, sink_v: Tensor) -> Tensor:
        """BCA windows with k sinks on SDPA's fused kernel. Every query of block b >= 2 (the caller checks) has
        the same first key f = (b - 1) c >= c >= k, so StreamingLLM places the sinks at f - k .. f - 1 for the
        whole window: prepended to the window's 2c keys at local positions 0 .. k - 1 (queries then at
        k + c .., keys at k ..), the (c, k + 2c) mask is causal aligned to the lower right."""
        n, c = chunk.blocks, chunk.stride
        bsz, heads, _, dim = self.q.shape
        sinks = sink_k.size(2)
        qw, kw, vw = self._window_views(chunk)
        kw = torch.cat([sink_k[:, :, None].expand(-1, -1, n, -1, -1), kw], dim=3)  # (B, H, n, k + 2c, D)
        vw = torch.cat([sink_v[:, :, None].expand(-1, -1, n, -1, -1), vw], dim=3)
        qw, kw = self._rotate(qw, kw, c + sinks, 0)
        shape = (bsz, heads * n)
        span = 2 * c + sinks
        out = _sdpa(qw.reshape(*shape, c, dim), kw.reshape(*shape, span, dim), vw.reshape(*shape, span, dim),
                    attn_mask=causal_lower_right(c, span), dropout_p=self.dropout_p, sink=self._sink(n),
                    ).view(bsz, heads, n, c, dim)
        return out.flatten(2, 3)


# SDPA's fused CPU flash kernel, which also returns the log-sum-exp (a private op of torch 2.x), looked up once at
# import; None where this torch has no op of that name: _attention_lse then takes the explicit path, which runs anywhere
_FLASH_CPU_KERNEL = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attention_lse(q: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor],
                   fused: Optional[bool] = None) -> Tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d)) v over the allowed keys, and the fp32 log-sum-exp of those logits per query
    (-inf where a query is allowed no key; its output is then 0): q (B, H, Tq, D), k and v (B, H, Tk, D),
    ``allowed`` bool broadcastable to (B, H, Tq, Tk), or None: every key. On CPU, SDPA's fused flash kernel when
    this torch has it (``_FLASH_CPU_KERNEL``); elsewhere, or without it, explicit fp32 logits (``fused``: force
    one or the other; the explicit one runs on any device and any torch).

    Raises:
        RuntimeError: ``fused=True`` on a torch without the kernel."""
    mask = None if allowed is None else _four_d(torch.where(allowed, 0.0, float("-inf")).to(q.dtype))
    kernel = _FLASH_CPU_KERNEL
    if fused and kernel is None:
        raise RuntimeError(f"torch {torch.__version__} has no aten::_scaled_dot_product_flash_attention_for_cpu: "
                           "pass fused=None (or False) to take the explicit path.")
    if fused if fused is not None else (q.device.type == "cpu" and kernel is not None):
        out, lse = kernel(q, k, v, 0.0, False, attn_mask=mask)
    else:
        logits = _logits(q, k, None) + (0.0 if mask is None else mask.float())
        lse = torch.logsumexp(logits, dim=-1)
        out = (torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v.float()).to(q.dtype)
    if allowed is None:
        return out, lse.float()
    empty = ~_four_d(allowed).any(-1)  # (B or 1, 1 or H, Tq)
    return out.masked_fill(empty[..., None], 0.0), lse.float().masked_fill(empty, float("-inf"))


def _windows_in_batch(x: Tensor) -> Tensor:
    """(B, H, n, L, D) windows -> (B n, H, L, D) (a copy: windows of keys overlap)."""
    return x.transpose(1, 2).flatten(0, 1)


def _step_as_products(q: Tensor) -> bool:
    """Whether a one-query chunk of q's dtype and device runs as :func:`_one_query` on a sequence-major cache, with no
    gradient to keep (a training batch whose last window holds one query keeps SDPA):

    - on CUDA, any dtype: SDPA's cuDNN backend builds an execution plan for each new key length, and a generation
      step under full attention has a new one at every token. The two products need no plan: ``lex_lm_small`` in
      fp16 on an H100 under full attention, 4.8-9.3 ms a token at 1k-64k against 48-63 ms on SDPA; in fp32 the same
      log-probabilities as a parallel forward within 3e-5 over 528 steps (examples/lex_lm/GPU.md, run 2);
    - bf16 / fp16 on CPU, where PyTorch's fused SDPA kernel takes 4.4 ms for one query over 16k keys (4 heads of 64)
      and two products per head over the same (S, D) rows 0.4 ms (examples/lex_lm/BENCHMARKS.md, "bf16
      generation")."""
    if torch.is_grad_enabled() and q.requires_grad:
        return False
    return q.device.type == "cuda" or (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16))


def _one_query(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], allowed: Optional[Tensor],
               sink: Optional[Tensor] = None) -> Tensor:
    """One query per (batch, head) over the keys of a generation cache: two batched matrix-vector products with a
    softmax between. Over a feature-major fp32 cache (keys and values stored (D, S), ``KeyValueCache``) both read
    long contiguous rows, so a generation step reads each cached key and value once near the memory bandwidth
    (``lex_lm_tiny`` at a 64k context: 0.58-0.62 of the time of a step on PyTorch's CPU SDPA kernel;
    examples/lex_lm/BENCHMARKS.md, "Fourth run: generation at the memory bandwidth"). Over a bf16 / fp16 cache on CPU
    (sequence-major, :func:`_step_as_products`) the softmax runs in fp32 and the products, over more than
    :data:`HALF_STEP_FP32_KEYS` keys, per head in that dtype: the logits are then rounded to the cache's dtype once (8
    significant bits in bf16, as an eager half-precision attention), where SDPA's fused kernel keeps them fp32; over
    fewer keys, in fp32 on fp32 copies of the keys and values. A generation cache of ``kv_cache.FEATURE_MAJOR_KEYS``
    keys or more widens itself to fp32 feature-major, so a half-precision step over it runs as fp32's does (the
    output is cast back to q's dtype). On CUDA both products run batched in fp32, on fp32 copies of half-precision
    keys and values (one kernel each, whatever the key length).

    Args:
        q: (B, H, 1, D); k, v: (B, H, S, D) of q's dtype (or fp32: a widened cache); bias: (H, 1, S) or None;
        allowed: boolean visibility broadcastable to (B, H, 1, S) (padded keys), or None: every key.
        sink: learned sink logits (1, H, 1, 1) fp32, or None.

    Returns:
        (B, H, 1, D) in q's dtype.
    """
    scores = _step_logits(q, k)
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return _weighted_values(scores, v, sink).to(q.dtype)  # (a widened half cache's values are fp32)


def _seen(allowed: Optional[Tensor], piece) -> Optional[Tensor]:
    """The pairs of ``piece`` (``position_map.Piece``) a query scores: the window's ``allowed`` ((Tq, Tk), or
    (B, 1, Tq, Tk) with padding; None: every key) over the piece's range, and its ``select``; None where that is every
    pair of the range."""
    if allowed is None:
        return piece.select
    seen = allowed[..., piece.lo : piece.hi]
    return seen if piece.select is None else seen & piece.select


def _half_products_per_head(x: Tensor) -> bool:
    """Whether one query's products over ``x`` (B, H, S, D) keys or values run per (batch, head) in x's half precision
    (:func:`_per_head_products`): on CPU, more than :data:`HALF_STEP_FP32_KEYS` of them. At or below it, in fp32 and
    on other devices, they run batched in fp32 (on fp32 copies of half-precision keys and values)."""
    return x.device.type == "cpu" and x.dtype != torch.float32 and x.size(-2) > HALF_STEP_FP32_KEYS


def _step_logits(q: Tensor, k: Tensor) -> Tensor:
    """q k^T / sqrt(D), (B, H, 1, S) fp32, for one query q (B, H, 1, D) over keys k (B, H, S, D) of q's dtype: one
    batched product in fp32 (on fp32 copies of half-precision keys up to :data:`HALF_STEP_FP32_KEYS`); per (batch,
    head) in half precision on CPU beyond (:func:`_per_head_products`), the logits rounded to that precision once
    before the cast (SDPA's fused kernel keeps them fp32: against float64, up to about 5x its error where attention
    is peaked, tests/test_autocast.py)."""
    if _half_products_per_head(k):
        return _per_head_products(q, k.transpose(-1, -2)).float() * (1.0 / math.sqrt(q.size(-1)))
    return (q.float() * (1.0 / math.sqrt(q.size(-1)))) @ k.float().transpose(-1, -2)


def _weighted_values(scores: Tensor, v: Tensor, sink: Optional[Tensor]) -> Tensor:
    """softmax(scores) v for one query: scores (B, H, 1, S) fp32 (-inf where unseen), v (B, H, S, D); with learned sink
    logits ``sink`` (1, H, 1, 1) fp32 in the denominator only. The product as :func:`_step_logits`'s. Returns
    (B, H, 1, D) in v's dtype."""
    if sink is None:
        weights = torch.softmax(scores, dim=-1)
    else:  # the sink in the denominator only: exp(z - m) v / (sum exp(z - m) + exp(s - m)), m the row's largest of both
        top = torch.maximum(scores.amax(dim=-1, keepdim=True), sink)
        weights = torch.exp(scores - top)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + torch.exp(sink - top))  # normalised in fp32: no fp16 overflow
    if _half_products_per_head(v):
        return _per_head_products(weights.to(v.dtype), v)
    return (weights @ v.float()).to(v.dtype)


def _per_head_products(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for a (B, H, 1, X) and b (B, H, X, Y) of a half-precision dtype on CPU, one 2-D product per (batch,
    head): b is a view of a cache whose (batch, head) matrices lie ``cap`` rows apart, and PyTorch's batched
    half-precision product copies such a view whole first (3.9 ms for 4 heads of 16k keys; 0.3 ms as 4 products).
    Differentiable where a gradient is wanted (the products are then stacked)."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return torch.stack([x @ y for x, y in zip(a.flatten(0, 1), b.flatten(0, 1))]).unflatten(0, b.shape[:2])
    out = a.new_empty(*b.shape[:2], 1, b.size(-1))
    rows, mats, outs = a.flatten(0, 1), b.flatten(0, 1), out.flatten(0, 1)
    for i in range(rows.size(0)):
        torch.mm(rows[i], mats[i], out=outs[i])
    return out


def _sdpa(q: Tensor, k: Tensor, v: Tensor, *, attn_mask=None, is_causal: bool = False, dropout_p: float = 0.0,
          sink: Optional[Tensor] = None) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)``; with learned sink logits ``sink``
    (broadcastable to (B', H', 1, 1) for q (B', H', Tq, D), fp32) each softmax row also holds the sink: one key
    placed first, seen by every query, with value 0 and logit s. It is carried by extra feature dimensions (1 on
    CPU; 8 on CUDA, where fused kernels want a head dimension that is a multiple of 8): queries get [q, 1, 0..],
    keys [k, 0..], the sink key [0, s sqrt(D), 0..], so q k^T / sqrt(D) is unchanged and the sink's logit is s; the
    mask gets a leading visible column (a lower-right causal mask one more key; a square causal one a dummy first
    query, whose row is dropped), and the values are padded to the keys' width (the fused CPU kernel takes equal
    widths; a value of another width sends SDPA to its L x L path). Still one SDPA call on its fused kernels,
    differentiable in s (training stays on SDPA)."""
    if sink is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    dim = q.size(-1)
    extra = 8 if q.device.type == "cuda" else 1
    ones = torch.zeros(extra, dtype=q.dtype, device=q.device)
    ones[0] = 1.0
    q = torch.cat([q, ones.expand(*q.shape[:-1], extra)], dim=-1)
    lead = k.shape[:-2]
    column = (sink * math.sqrt(dim)).to(k.dtype).expand(*lead, 1, 1)
    sink_key = torch.cat([k.new_zeros(*lead, 1, dim), column, k.new_zeros(*lead, 1, extra - 1)], dim=-1)
    k = torch.cat([sink_key, F.pad(k, (0, extra))], dim=-2)
    v = F.pad(v, (0, extra, 1, 0))  # the fused kernels want the values' width equal to the keys': sliced off after
    if is_causal:  # a dummy query first keeps the mask square and causal (the fused kernel): query i + 1 sees the
        # sink and keys 0 .. i; a lower-right mask of one more key would send SDPA to its L x L path on CPU
        q = F.pad(q, (0, 0, 1, 0))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=1.0 / math.sqrt(dim))
        return out[..., 1:, :dim]
    if isinstance(attn_mask, CausalBias):  # a lower-right causal mask (a Tensor subclass): one more key
        attn_mask = causal_lower_right(attn_mask.seq_len_q, attn_mask.seq_len_kv + 1)
    elif attn_mask is not None:
        attn_mask = F.pad(attn_mask, (1, 0), value=True if attn_mask.dtype == torch.bool else 0.0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=1.0 / math.sqrt(dim))
    return out[..., :dim]
