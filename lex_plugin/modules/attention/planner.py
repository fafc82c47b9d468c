"""The attention planner: which queries meet which keys, in how many SDPA calls.

Every attention in the package (training forward, evaluation under BCA / sliding window, chunked prefill,
single-token generation steps, the analysis tools) is described by

* a window (:class:`~.window.AttentionWindow`),
* new queries at positions P .. P + T - 1,
* a key tensor holding positions S .. P + T - 1 (S > 0 when a bounded cache dropped older keys),

and cut by :func:`plan` into :class:`Chunk` s that :func:`~.executor.attend` runs. Two chunk shapes exist:

* dense: a range of queries against a range of keys, with a mask that is ``all`` (every key visible: one
  query), ``causal`` (causal aligned to the lower right: every query sees the same first key, so SDPA's
  fused kernels apply) or ``explicit`` (a per-position boolean mask: sliding windows, padding);
* blocks: n consecutive query blocks at once (BCA and sliding windows; chunked attention, whose blocks see
  only their own keys, is one dense causal chunk per block). Block b of c = window.stride queries needs only the
  keys of blocks b - 1 and b, so n blocks are n (c, 2c) attentions over ``unfold`` views of the keys
  (no copy, nothing grows as L^2), batched into one SDPA call (BCA: ``causal_lower_right``; sliding:
  the same (c, 2c) band for every window).

Additive biases are always explicit float masks; dense chunks carrying one are split so that no call
holds more than ``bias_elements`` attention entries. Time and memory of a windowed plan are O(L c).
"""

from dataclasses import dataclass
from typing import List, Optional

from .window import AttentionWindow

__all__ = ["Chunk", "plan", "dense_query_limit", "GROUP_TOKENS", "BIAS_ELEMENTS"]

GROUP_TOKENS = 1 << 16  # queries per batched blocks call (bounds the rotated copies and SDPA's workspace)
BIAS_ELEMENTS = 1 << 24  # attention entries per SDPA call when a bias is added (about 64 MB in fp32)


@dataclass(frozen=True)
class Chunk:
    """One SDPA call.

    Attributes:
        q0, q1: rows [q0, q1) of the new queries (positions P + q0 ..).
        k0, k1: rows [k0, k1) of the key tensor (positions S + k0 ..).
        mask: ``all``, ``causal`` (lower-right aligned) or ``explicit`` (see the module docstring).
        blocks: n > 0 for a blocks chunk: block j holds queries q0 + j c .. q0 + (j + 1) c - 1 and keys
            k0 + j c .. k0 + (j + 2) c - 1 (its window), c = ``stride``; 0 for a dense chunk.
        stride: c of a blocks chunk.
    """

    q0: int
    q1: int
    k0: int
    k1: int
    mask: str
    blocks: int = 0
    stride: int = 0


def dense_query_limit(scheme, dtype, scaling=None) -> Optional[int]:
    """The most queries of one dense chunk rotated about their middle (``executor``) whose scale stays in
    ``dtype``'s range: 2 (max_center_offset - center_step), the centre being rounded down by up to a step;
    None for schemes without a scale (every scheme but xPos)."""
    limit = scheme.max_center_offset(dtype, scaling)
    return None if limit is None else max(1, 2 * (limit - scheme.center_step))


def plan(
    window: AttentionWindow,
    *,
    q_start: int = 0,
    q_len: int,
    k_start: int = 0,
    has_bias: bool = False,
    padded: bool = False,
    batch_heads: int = 1,
    group_tokens: int = GROUP_TOKENS,
    bias_elements: int = BIAS_ELEMENTS,
    local_positions: bool = True,
    dense_queries: Optional[int] = None,
) -> List[Chunk]:
    """Cut the attention of queries at q_start .. q_start + q_len - 1 over keys at k_start .. q_start + q_len - 1.

    Args:
        window: which keys each query may see.
        q_start, q_len: P and T (T >= 1).
        k_start: S, the position of the first key held (S <= window.first_key(P)).
        has_bias: the position scheme adds a bias, or the window has sinks (explicit logits): dense chunks
            split to at most ``bias_elements`` entries.
        padded: some keys are padding that causality alone does not hide (masks become explicit).
        batch_heads: B * H, to size bias chunks.
        group_tokens: at most this many queries per blocks chunk.
        bias_elements: at most this many attention entries per biased dense chunk.
        local_positions: the scheme may see a window at window-local positions (translation-invariant
            schemes); False: dense chunks only, each at its true positions.
        dense_queries: at most this many queries per dense chunk, or None: any. A scheme with a scale (xPos)
            rotates a dense chunk about the middle of its queries, so its range bounds a chunk's queries
            (:func:`dense_query_limit`), not its keys: full attention stays finite at any length.

    Returns:
        Chunks covering the T queries in order.

    Raises:
        ValueError: keys that start after a query's first visible key, or T < 1.
    """
    end = q_start + q_len
    if q_len < 1:
        raise ValueError(f"attention needs at least one query, got {q_len}.")
    if k_start > window.first_key(q_start):
        raise ValueError(
            f"the keys start at position {k_start}, but the query at {q_start} sees keys from {window.first_key(q_start)} "
            f"under {window} attention: the cache dropped keys that are still needed."
        )
    chunks: List[Chunk] = []

    def dense(a: int, b: int) -> None:
        first = window.first_key(a)
        shared = window.first_key(b - 1) == first
        kind = "all" if b - a == 1 else "causal" if shared else "explicit"
        if padded:
            kind = "explicit"
        keys = b - first
        step = b - a
        if has_bias:
            step = max(1, min(step, bias_elements // max(1, batch_heads * keys)))
        if dense_queries is not None:
            step = min(step, dense_queries)
        for s in range(a, b, step):
            e = min(b, s + step)
            f = window.first_key(s)
            part = kind if e - s > 1 or kind == "explicit" else "all"
            if part == "causal" and window.first_key(e - 1) != f:
                part = "explicit"
            chunks.append(Chunk(s - q_start, e - q_start, f - k_start, e - k_start, part))

    if not window.bounded or window.covers(end):
        dense(q_start, end)
        return chunks
    if not local_positions or window.own_block_only:  # block by block at true positions (chunks: causal, own keys)
        a = q_start
        while a < end:
            b = min(end, (a // window.stride + 1) * window.stride)
            dense(a, b)
            a = b
        return chunks

    c = window.stride
    a = q_start
    head_end = min(end, -(-a // c) * c)  # the rest of the block that holds the first query
    if head_end > a:
        dense(a, head_end)
        a = head_end
    per_call = max(1, group_tokens // c)
    if window.sinks:  # computed explicitly (fp32 logits of 2c + k keys per query): bound them like a bias
        per_call = min(per_call, max(1, bias_elements // max(1, batch_heads * c * (2 * c + window.sinks))))
    while a + c <= end:
        block = a // c
        if block == 0 or (block - 1) * c < k_start or (window.sinks and block == 1):
            dense(a, a + c)  # no previous block held as a window (or, with sinks, none outside it): one dense block
            a += c
            continue
        n = min((end - a) // c, per_call)
        k0 = (block - 1) * c - k_start
        mask = "causal" if window.mode == "bca" and not padded and not has_bias else "explicit"
        chunks.append(Chunk(a - q_start, a - q_start + n * c, k0, k0 + (n + 1) * c, mask, n, c))
        a += n * c
    if a < end:
        dense(a, end)
    return chunks
