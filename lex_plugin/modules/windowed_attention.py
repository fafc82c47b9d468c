"""Blockwise causal attention (BCA) and sliding-window attention, chunked: O(L * l) time and memory.

LeX paper, section 3.3 and Figure 3: with training length l, queries are cut into blocks of w = l / 2;
block b attends causally to its own keys and to all keys of block b - 1 (block 0 only to itself). Each
query therefore sees between w and 2w - 1 keys, never more than the training length.

Sliding window (the locality baseline; LeX Table 5, last row): each query attends its W most recent
positions, itself included.

Both are computed per window of two blocks: the keys of blocks b - 1 and b (2c positions, c = w or W),
taken with ``Tensor.unfold`` (a view: nothing grows as L^2, no L x L mask is ever built), with the c
queries of block b against those 2c keys, windows batched into SDPA calls of about GROUP_TOKENS queries
(grouping keeps the working set bounded in L). BCA's (c, 2c) mask is causal aligned to the lower right,
which SDPA takes as ``causal_lower_right`` on its fused kernels. Measured on 2 cores (one layer, 4 heads
of 64, c = 512, L = 32k): 97k tokens/s, against 44k with an explicit boolean mask (SDPA's unfused path)
and 19k with the mask-free causal kernel over whole 2c windows (a third more work, half of it thrown
away). The sliding window's band mask, and rows padded other than at the end, use the boolean mask. xPos uses
window-local positions 0 .. 2c - 1, so every window shares one (2c, d/2) table, and zeta^(+-n/B) stays
within zeta^(+-c/B) at any L: finite in fp32, bf16 and fp16. In exact arithmetic this equals global
xPos (the logit depends only on n - m).

Additive relative biases (ALiBi, Sandwich, KERPLE, T5; ``position_bias``) go to SDPA as a float mask:
one (H, c, 2c) bias shared by every window, and under full causal attention one (H, T, S) bias per chunk
of queries (``BIAS_ELEMENTS`` bounds T * S), so no L x L bias or mask exists at any L.
"""

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from .position_bias import DistanceBias
from .xpos import XPos

__all__ = [
    "AttentionWindow", "RelativePosition", "biased_mask", "causal_padding_mask", "is_right_padded",
    "relative_terms", "see_self", "window_mask", "windowed_attention",
]

MODES = ("full", "bca", "sliding")
GROUP_TOKENS = 8192  # queries per SDPA call in windowed attention (bounds the working set)
BIAS_ELEMENTS = 2**24  # attention-matrix entries per SDPA call when a bias is added (about 64 MB in fp32)

# What attention takes as its relative position: a rotation of q and k (xPos, RoPE, the Table 4 ablations),
# an additive bias (ALiBi, Sandwich, KERPLE, T5), or nothing (NoPE and the absolute schemes).
RelativePosition = Optional[Union[XPos, DistanceBias]]


@dataclass(frozen=True)
class AttentionWindow:
    """Which keys a query may attend at inference.

    Attributes:
        mode: ``full`` (causal over everything), ``bca`` (blockwise causal), ``sliding``.
        size: bca: the block length w = l / 2 (queries per block; keys per window 2w);
              sliding: the window W (keys per query, itself included). Unused for ``full``.

    Raises:
        ValueError: unknown mode, or a non-positive size for bca / sliding.
    """

    mode: str = "full"
    size: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"attention window mode must be one of {MODES}, got {self.mode!r}")
        if self.mode != "full" and self.size <= 0:
            raise ValueError(f"{self.mode} needs a positive size, got {self.size}")

    @classmethod
    def bca(cls, training_length: int) -> "AttentionWindow":
        """BCA for a model trained on ``training_length`` tokens: blocks of l / 2.

        Raises:
            ValueError: l odd or < 2 (blocks are l / 2).
        """
        if training_length < 2 or training_length % 2:
            raise ValueError(
                f"BCA cuts the training length l into blocks of l/2, so l must be even and >= 2; got {training_length}."
            )
        return cls("bca", training_length // 2)

    @classmethod
    def for_model(cls, mode: str, training_length: Optional[int], size: Optional[int] = None) -> "AttentionWindow":
        """The window ``mode`` for a model trained on ``training_length`` tokens: ``full``; ``bca`` with
        blocks of l/2 (l = ``size`` if given, else the training length); ``sliding`` with W = ``size`` or l.

        Raises:
            ValueError: bca / sliding with neither ``size`` nor a training length (a checkpoint that records
                no tokens_per_sample), an odd BCA length, an unknown mode.
        """
        if mode == "full":
            return cls()
        length = size or training_length
        if not length:
            raise ValueError(
                f"{mode} needs the training length l, and this checkpoint records no tokens_per_sample; "
                "give it explicitly (--bca-block-size l for BCA, --sliding-window W)."
            )
        return cls.bca(int(length)) if mode == "bca" else cls(mode, int(length))

    def covers(self, length: int) -> bool:
        """True if, for sequences of ``length``, this window is plain causal attention."""
        if self.mode == "full":
            return True
        return length <= (2 * self.size if self.mode == "bca" else self.size)

    def first_key(self, position):
        """Position of the earliest key visible to a query at ``position`` (an int, or an integer tensor
        of positions, elementwise)."""
        if self.mode == "full":
            first = position * 0
        elif self.mode == "bca":
            first = (position // self.size - 1) * self.size
        else:
            first = position - self.size + 1
        return first.clamp(min=0) if isinstance(first, Tensor) else max(0, first)

    def __str__(self) -> str:
        return "full" if self.mode == "full" else f"{self.mode}({self.size})"


def window_mask(window: AttentionWindow, length: int, device=None) -> Tensor:
    """The explicit (length, length) boolean mask of ``window`` (True = may attend). For tests and
    analysis only: O(L^2). Query i sees key j iff first_key(i) <= j <= i."""
    i = torch.arange(length, device=device)
    j = i[None, :]
    return (j <= i[:, None]) & (j >= window.first_key(i)[:, None])


def _pad_to(x: Tensor, length: int, dim: int = 2, value=0) -> Tensor:
    extra = length - x.size(dim)
    if extra == 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, extra]
    return F.pad(x, pad, value=value)


def _windows(x: Tensor, c: int) -> Tensor:
    """(B, H, n*c, D) -> (B, H, n-1, 2c, D): window j holds blocks j and j+1 (a view)."""
    return x.unfold(2, 2 * c, c).transpose(-1, -2)


def windowed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: AttentionWindow,
    pos: RelativePosition = None,
    key_padding_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Causal attention restricted to ``window``, chunked over blocks.

    Args:
        q, k, v: (B, H, L, D) projections of positions 0 .. L-1, *before* xPos.
        window: ``bca`` or ``sliding`` (``full`` is accepted and runs plain causal attention).
        pos: xPos / RoPE (applied with window-local positions), a ``DistanceBias`` (one window-local
            (H, c, 2c) bias for every window), or None for no relative position.
        key_padding_mask: (B, L) bool, True at padding, or None. Padding only at the end of rows needs
            no mask (causality hides it); other padding builds a per-window mask, O(L * c).
        dropout_p: attention dropout.

    Returns:
        (B, H, L, D) in q's dtype.
    """
    bsz, heads, length, dim = q.shape
    if window.covers(length):
        return causal_attention(q, k, v, pos, key_padding_mask, dropout_p)

    c = window.size
    n = -(-length // c)  # blocks
    padded = n * c
    q, k, v = (_pad_to(t, padded) for t in (q, k, v))
    if key_padding_mask is not None:
        key_padding_mask = _pad_to(key_padding_mask, padded, dim=1, value=True)

    # block 0: causal over itself, local positions = global positions
    kpm0 = key_padding_mask[:, :c] if key_padding_mask is not None else None
    out0 = causal_attention(q[:, :, :c], k[:, :, :c], v[:, :, :c], pos, kpm0, dropout_p)

    # blocks 1 .. n-1: queries of block b over the keys of blocks b-1 and b, positions local to the window.
    # Windows go through SDPA in groups of ~GROUP_TOKENS queries, so the working set (rotated copies,
    # attention weights) stays bounded whatever L is.
    qw = _windows(q, c)[:, :, :, c:]  # (B, H, n-1, c, D) views, local positions c .. 2c-1
    kw, vw = _windows(k, c), _windows(v, c)  # (B, H, n-1, 2c, D) views, local positions 0 .. 2c-1
    kpm_w = None
    if key_padding_mask is not None and not is_right_padded(key_padding_mask):
        kpm_w = key_padding_mask.unfold(1, 2 * c, c)  # (B, n-1, 2c)
    group = max(1, GROUP_TOKENS // c)
    outs = [out0]
    bias = shared_mask = None  # the bias is (H, 1, c, 2c), the same for every window
    if isinstance(pos, DistanceBias):
        bias = pos(c, c, 0, 2 * c, q.device)[:, None]
        if kpm_w is None:
            shared_mask = biased_mask(bias, _block_mask(window, c, q.device), q.dtype)
    for g in range(0, n - 1, group):
        sl = slice(g, g + group)
        qg, kg = qw[:, :, sl], kw[:, :, sl]
        if isinstance(pos, XPos):
            qg, kg = pos(qg, kg, q_start=c, k_start=0)
        vg = vw[:, :, sl]
        if window.mode == "bca" and kpm_w is None and bias is None:
            # BCA's (c, 2c) mask is causal aligned to the lower right: SDPA's fused kernels take it as is
            shape = (bsz, heads * qg.size(2))
            out = F.scaled_dot_product_attention(
                qg.reshape(*shape, c, dim), kg.reshape(*shape, 2 * c, dim), vg.reshape(*shape, 2 * c, dim),
                attn_mask=causal_lower_right(c, 2 * c), dropout_p=dropout_p,
            ).view(bsz, heads, -1, c, dim)
        elif shared_mask is not None:
            out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=shared_mask, dropout_p=dropout_p)
        else:
            mask = _block_mask(window, c, q.device)  # (c, 2c), the same for every window
            if kpm_w is not None:
                mask = see_self(mask[None, None] & ~kpm_w[:, None, sl, None, :], offset=c)  # (B, 1, g, c, 2c)
            if bias is not None:
                mask = biased_mask(bias, mask, q.dtype)
            out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, dropout_p=dropout_p)
        outs.append(out.flatten(2, 3))
    out = torch.cat(outs, dim=2)
    return out[:, :, :length]


def relative_terms(pos: RelativePosition, q: Tensor, k: Tensor, q_start: int, k_start: int) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """The relative position of one attention call: (q', k', bias).

    Args:
        pos: xPos / RoPE (rotates q and k), a ``DistanceBias`` (gives the bias) or None.
        q: (..., Tq, D) queries at q_start ..; k: (..., Tk, D) keys at k_start .. (absolute or
            window-local positions: only differences matter).

    Returns:
        q', k' in the input dtypes, and the (H, Tq, Tk) fp32 bias or None.
    """
    if pos is None:
        return q, k, None
    if isinstance(pos, DistanceBias):
        return q, k, pos(q_start, q.size(-2), k_start, k.size(-2), q.device)
    q, k = pos(q, k, q_start=q_start, k_start=k_start)
    return q, k, None


def biased_mask(bias: Tensor, allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """SDPA's float mask: ``bias`` where ``allowed``, -inf elsewhere, broadcast together, in ``dtype``
    (SDPA adds it to q k^T / sqrt(d))."""
    return bias.masked_fill(~allowed, float("-inf")).to(dtype)


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pos: RelativePosition = None,
    key_padding_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Plain causal attention over positions 0 .. L-1 (``full``, or any window covering L).

    Args:
        q, k, v: (B, H, L, D), before xPos.
        pos: as in :func:`windowed_attention`. A bias goes in chunks of queries, each against the keys up to
            its last query, so at most ``BIAS_ELEMENTS`` attention entries exist per SDPA call.
        key_padding_mask: (B, L) bool, True at padding, or None.

    Returns:
        (B, H, L, D) in q's dtype.
    """
    if not isinstance(pos, DistanceBias):
        if pos is not None:
            q, k = pos(q, k, q_start=0, k_start=0)
        mask = causal_padding_mask(key_padding_mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)
    bsz, heads, length, _ = q.shape
    if key_padding_mask is not None and (not bool(key_padding_mask.any()) or is_right_padded(key_padding_mask)):
        key_padding_mask = None  # causality alone hides trailing pads
    chunk = max(1, BIAS_ELEMENTS // (bsz * heads * length))
    outs = []
    for start in range(0, length, chunk):
        end = min(length, start + chunk)
        bias = pos(start, end - start, 0, end, q.device)  # (H, T, end)
        allowed = torch.ones(end - start, end, dtype=torch.bool, device=q.device).tril(start)  # key j <= query
        if key_padding_mask is not None:
            allowed = see_self(allowed[None, None] & ~key_padding_mask[:, None, None, :end], offset=start)
        mask = biased_mask(bias, allowed, q.dtype)
        outs.append(F.scaled_dot_product_attention(q[:, :, start:end], k[:, :, :end], v[:, :, :end],
                                                   attn_mask=mask, dropout_p=dropout_p))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def see_self(allowed: Tensor, offset: int = 0) -> Tensor:
    """Let query t of a (..., T, S) boolean mask see key t + offset (its own position), in place, so that
    masking padded keys never leaves a softmax row empty (pad rows then give finite values the loss
    ignores). Returns ``allowed``."""
    rows = torch.arange(allowed.size(-2), device=allowed.device)
    allowed[..., rows, rows + offset] = True
    return allowed


def _block_mask(window: AttentionWindow, c: int, device) -> Tensor:
    """(c, 2c) mask of block b's queries (local c + t) over window keys (local 0 .. 2c-1)."""
    t = torch.arange(c, device=device)[:, None]
    key = torch.arange(2 * c, device=device)[None, :]
    allowed = key <= c + t  # causal: up to and including itself
    if window.mode == "sliding":
        allowed &= key > t  # the W most recent positions: local keys t+1 .. c+t
    return allowed


def is_right_padded(key_padding_mask: Tensor) -> bool:
    """True when every (B, L) row is [real ..., real, pad ..., pad]: causality alone then hides the pads."""
    m = key_padding_mask.to(torch.int8)
    return bool((m[:, 1:] >= m[:, :-1]).all())


def causal_padding_mask(key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """None when causality alone is exact (no padding, or padding only at the row ends); else the
    (B, 1, L, L) boolean causal & not-pad mask, in which each query still sees itself."""
    if key_padding_mask is None or not bool(key_padding_mask.any()) or is_right_padded(key_padding_mask):
        return None
    length = key_padding_mask.size(1)
    device = key_padding_mask.device
    allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return see_self(allowed[None, None] & ~key_padding_mask[:, None, None, :])
