"""The attention executor: the one place attention scores exist. It runs the chunks of
:func:`~.planner.plan` on SDPA, with the position scheme, each chunk by the kernel of its kind
(:data:`~.kernels.KERNELS`: dense, windows, sinks, position map).

For each chunk it (1) rotates queries and keys with the scheme unless they already are (a generation
cache stores keys rotated at its centre, ``center``), (2) asks the scheme for its additive bias, (3)
builds SDPA's mask, the cheapest that is exact: none, ``is_causal``, ``causal_lower_right`` (fused
kernels), or an explicit boolean / additive float mask (:func:`~.kernels.ops.additive_mask`), and (4) calls
``F.scaled_dot_product_attention``, except for one query over a feature-major generation cache
(``KeyValueCache``), a bf16 / fp16 one on CPU or any one on CUDA, which runs as two matrix-vector products
(:func:`~.kernels.ops.one_query`).
Sink tokens (StreamingLLM, LM-Infinite) are keys placed at virtual positions: the scheme rotates them (or
biases them) there, and the executor scores them with the window's keys under one softmax. Randomized positions (Ruoss et al. 2023) are
per-sample position ids for the same dense chunks. Learned sink logits (gpt-oss: one per head, joining every
softmax's denominator with no value) enter every chunk shape: an extra key in each SDPA call (:func:`~.kernels.ops.sdpa`), an
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

from dataclasses import replace
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..autocast import autocast_dtype
from ..positions.scheme import PositionScheme
from .kernels import KERNELS, BlockRetrieval, ChunkRun, Observer, kernel_kind, with_positions
from .kv_cache import HeldKeys
from .planner import Chunk
from .spec import AttentionSpec
from .temperature import logn_scale

__all__ = ["Observer", "attend"]


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
    retrieval: Optional[BlockRetrieval] = None,
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
        retrieval: a design's top-k block attention (MoBA, :class:`~.retrieval.BlockRetrieval`): each query sees its
            own block and the k - 1 earlier blocks it scores highest, not the window's keys; full attention only (a
            global layer), a rotary scheme or none, no position map or per-sample positions. None: the spec's
            (``spec.retrieval``, an evaluation's), if any; a layer with both is refused.

    Under ``torch.autocast`` (``modules.autocast``) q, k and v are cast to its dtype and attention runs with
    autocast off, exactly as in a model of that dtype: rotation and biases in fp32, softmax statistics in fp32.

    Returns:
        (B, H, T, D) in q's dtype (the autocast dtype under autocast).

    Raises:
        ValueError: sinks over rotated or offset keys without ``sinks``; ``positions`` with a bounded
            window, a cache or sinks, or spread too far for the scheme's scale in q's dtype; a retrieval with what it
            does not take (above); a forget gate's decay (``held.decay``) with sinks, a position map or a retrieval.
    """
    dtype = autocast_dtype(q.device)
    if dtype is not None:  # autocast: run as a model of its dtype does (position math fp32 inside), autocast off
        with torch.autocast(q.device.type, enabled=False):  # (a cache's sink keys already hold its dtype)
            # a half cache widened for one query (fp32, feature-major: KeyValueCache) is read as it is, not copied back
            keep = held.feature_major and held.keys.dtype == torch.float32
            cast = held if keep else replace(held, keys=held.keys.to(dtype), values=held.values.to(dtype))
            return attend(q.to(dtype), cast, chunks, spec=spec, scheme=scheme, q_start=q_start, dropout_p=dropout_p,
                          observer=observer, positions=positions, sink_logits=sink_logits, retrieval=retrieval)
    if spec.logn:
        if positions is not None:
            raise ValueError("log-n scaling is an evaluation option; it does not apply to randomized training positions.")
        visible = spec.window.visible_keys(torch.arange(q_start, q_start + q.size(2), device=q.device))
        q = (q.float() * logn_scale(visible, spec.logn)[:, None]).to(q.dtype)  # one rounding, the factor exact in fp32
    if spec.logit_scale is not None and spec.logit_scale != 1.0:  # a constant temperature (DroPE's recalibration)
        q = (q.float() * spec.logit_scale).to(q.dtype)
    if spec.position_map is not None and (held.center is not None or positions is not None):
        raise ValueError("a position map rotates raw keys at remapped positions: give un-rotated keys (center=None), "
                         "no per-sample positions.")
    if retrieval is not None and spec.retrieval is not None:
        raise ValueError(f"this layer's design chooses its keys ({retrieval}); evaluate it without --retrieval-blocks.")
    retrieval = retrieval if retrieval is not None else spec.retrieval
    if retrieval is not None:
        _check_retrieval(retrieval, spec, scheme, positions)
    if held.decay is not None:
        _check_decay(spec, retrieval, chunks)
    run = ChunkRun(q, held.keys, held.values, spec.window, scheme, spec.rope_scaling, q_start, held.start, held.center,
                   held.padding, dropout_p, observer, held.feature_major, sink_logits, held.rotated_pieces,
                   position_map=spec.position_map, retrieval=retrieval, decay=held.decay)
    if spec.position_map is None:
        if positions is not None:
            run = with_positions(run, positions)
        if not scheme.translation_invariant and any(chunk.blocks for chunk in chunks):
            raise ValueError(f"{type(scheme).__name__} is not translation-invariant: it must see true positions, so plan "
                             "its attention with local_positions=False (no batched windows).")
        if run.window.sinks:
            run = replace(run, sink_keys=_sink_keys(held, run.window.sinks))
    outs = [KERNELS[kernel_kind(run, chunk)](run, chunk) for chunk in chunks]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def _check_retrieval(retrieval: BlockRetrieval, spec: AttentionSpec, scheme: PositionScheme,
                     positions: Optional[Tensor]) -> None:
    """Refuse what top-k block attention does not take, naming the option to change.

    Raises:
        ValueError: a bounded window or sinks, a position map, a bias scheme, per-sample positions."""
    if spec.window.bounded or spec.window.sinks:
        raise ValueError(f"{retrieval} chooses each query's blocks itself; its layers run full attention: evaluate "
                         f"them without --bca / --sliding-window / sink tokens (got {spec.window}), or put the design in "
                         "the global layers of a --layer-pattern and keep the windows in its local layers.")
    if spec.position_map is not None:
        raise ValueError(f"{retrieval} scores blocks at true distances: drop the position map ({spec.position_map}).")
    if scheme.kind == "bias":
        raise ValueError(f"{retrieval} takes a rotary position scheme or none, not the bias of "
                         f"{type(scheme).__name__}: train it with --pos-emb xpos, rope or none.")
    if positions is not None:
        raise ValueError(f"{retrieval} counts blocks by position from 0: train it without --random-positions.")


def _check_decay(spec: AttentionSpec, retrieval: Optional[BlockRetrieval], chunks: List[Chunk]) -> None:
    """Refuse what a forget gate's decay (``held.decay``) does not take, naming the option to change: its bias
    enters dense chunks only, at the keys' true indices.

    Raises:
        ValueError: sink tokens, a position map, a block retrieval; batched windows (a plan made with
            local_positions=True)."""
    what = ("sink tokens" if spec.window.sinks else f"the position map {spec.position_map}" if spec.position_map
            else f"{retrieval}" if retrieval is not None else None)
    if what is not None:
        raise ValueError(f"a forget gate's layer (--forget-gate) decays each key by the gates since it; {what} would "
                         "place keys where that decay is not defined. Evaluate it with full attention, --bca or "
                         "--sliding-window, without sinks, position maps or --retrieval-blocks.")
    if any(chunk.blocks for chunk in chunks):
        raise ValueError("a forget gate's decay enters dense chunks at true positions: plan its attention with "
                         "local_positions=False (no batched windows).")


def _sink_keys(held: HeldKeys, sinks: int) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """The sink tokens' raw keys, values and padding: a cache's (``held.sinks``), or the first ``sinks`` positions of a
    parallel pass.

    Raises:
        ValueError: a cache (rotated or offset keys) that holds no un-rotated sink keys."""
    if held.sinks is not None:
        return held.sinks
    if held.center is not None or held.start:
        raise ValueError("attention with sink tokens over a cache needs the cache's un-rotated sink keys.")
    k, v = held.keys, held.values
    return k[:, :, :sinks], v[:, :, :sinks], None if held.padding is None else held.padding[:, :sinks]
