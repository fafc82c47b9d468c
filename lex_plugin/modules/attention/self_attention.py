"""Causal multi-head self-attention on the planner and executor, with any position scheme and a cache.

Parameter names follow TorchScale's ``torchscale.component.multihead_attention.MultiheadAttention``
(``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, ``inner_attn_ln``) so TorchScale checkpoints load.
The math is TorchScale's (softmax(q k^T / sqrt(d)) v with xPos on q and k) computed by SDPA through
:func:`~.planner.plan` and :func:`~.executor.attend`: one path for training, evaluation under any window,
chunked prefill and generation steps.
"""

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from torch import Tensor, nn

from ..positions.scheme import NoPositions, PositionScheme
from ..positions.xpos import CENTER_STEP
from .executor import Observer, attend, see_self
from .kv_cache import KeyValueCache
from .planner import plan
from .window import AttentionWindow

__all__ = ["LexSelfAttention"]

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
FULL = AttentionWindow.full()
NOPE = NoPositions()


@with_incremental_state
class LexSelfAttention(nn.Module):
    """Causal self-attention for a decoder-only LM, with xPos on queries and keys (or another relative
    position: RoPE, an additive bias, none).

    Args:
        embed_dim: model dimension C.
        num_heads: H; C must be divisible by H.
        dropout: dropout on the attention probabilities (training only).
        subln: add TorchScale's ``inner_attn_ln`` (Magneto sub-LayerNorm) before ``out_proj``.
        layernorm_eps: epsilon of that LayerNorm.

    Raises:
        ValueError: C not divisible by H.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        subln: bool = False,
        layernorm_eps: float = 1e-5,
    ):
        super().__init__()
        if num_heads <= 0 or embed_dim % num_heads != 0:
            raise ValueError(
                f"--decoder-embed-dim ({embed_dim}) must be divisible by --decoder-attention-heads "
                f"({num_heads})."
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.inner_attn_ln = LayerNorm(embed_dim, eps=layernorm_eps) if subln else None
        self.reset_parameters()
        self.observer: Optional[Observer] = None  # set by analysis.capture_logits

    def reset_parameters(self):
        """TorchScale's initialisation (xavier, gain 1/sqrt(2) for q/k/v)."""
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(proj.weight, gain=2**-0.5)
            nn.init.zeros_(proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def _heads(self, x: Tensor) -> Tensor:
        """(B, T, C) -> (B, H, T, d)."""
        bsz, tgt_len, _ = x.shape
        return x.view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2)

    def _cache(self, incremental_state: Optional[IncrementalState]) -> Optional[KeyValueCache]:
        saved = self.get_incremental_state(incremental_state, "attn_state") if incremental_state is not None else None
        return None if saved is None else saved.get("cache")

    def cached_length(self, incremental_state: Optional[IncrementalState]) -> int:
        """Number of positions processed so far with this cache (0 without one)."""
        cache = self._cache(incremental_state)
        return 0 if cache is None else cache.end

    def cached_keys(self, incremental_state: Optional[IncrementalState]) -> int:
        """Number of key positions the cache holds now (under BCA at most l, sliding at most W; plus the
        sink tokens)."""
        cache = self._cache(incremental_state)
        return 0 if cache is None else cache.length + cache.sink_length

    def forward(
        self,
        x: Tensor,
        position: PositionScheme = NOPE,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        window: AttentionWindow = FULL,
        positions: Optional[Tensor] = None,
    ) -> Tensor:
        """Causal self-attention under ``window``.

        Args:
            x: (B, T, C) hidden states of T new positions.
            position: the layer's position scheme (xPos, RoPE, a bias, NoPE...).
            key_padding_mask: (B, T) bool, True at padding that causality does not hide; None when none.
            incremental_state: fairseq's incremental state. New positions may come one at a time or in
                chunks. Keys are cached rotated (see ``KeyValueCache``); under BCA / sliding window the
                cache keeps only what the next query can see (at most l or W positions): memory and
                per-token time stay flat.
            window: full (default), BCA or sliding window.
            positions: (B, T) int64 sorted position ids per sample (randomized positions at training,
                Ruoss et al. 2023), or None for 0 .. T - 1; full attention, no cache.

        Returns:
            (B, T, C) in x's dtype.

        Raises:
            ValueError: a cache filled under another window; ``positions`` with a cache or a bounded window.
        """
        bsz, tgt_len, _ = x.shape
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        dropout_p = self.dropout if self.training else 0.0
        if positions is not None:
            if incremental_state is not None or window.bounded:
                raise ValueError("arbitrary positions (--random-positions) are for training: full attention, no cache.")
            out = self._at_positions(q, k, v, position, positions, key_padding_mask, dropout_p)
            out = out.transpose(1, 2).reshape(bsz, tgt_len, self.embed_dim)
            return self.out_proj(out if self.inner_attn_ln is None else self.inner_attn_ln(out))
        cache = self._cache(incremental_state)
        if cache is not None and cache.window != str(window):
            raise ValueError(
                f"this key/value cache was filled under {cache.window} attention, not {window}; "
                "start a new incremental state to change the attention window."
            )
        if incremental_state is None or cache is None or cache.end == 0:
            out = attend(q, k, v, self._plan(window, 0, tgt_len, 0, position, key_padding_mask, bsz), window, position,
                         0, 0, False, key_padding_mask, dropout_p, self.observer)
            if incremental_state is not None:
                self._fill(incremental_state, k, v, key_padding_mask, window, position)
        else:
            out = self._step(q, k, v, cache, key_padding_mask, window, position, dropout_p)
        out = out.transpose(1, 2).reshape(bsz, tgt_len, self.embed_dim)
        if self.inner_attn_ln is not None:
            out = self.inner_attn_ln(out)
        return self.out_proj(out)

    @staticmethod
    def _at_positions(q, k, v, position: PositionScheme, positions: Tensor, key_padding_mask, dropout_p) -> Tensor:
        """Causal attention with each sample's own sorted positions (B, T): rotary schemes rotate at them,
        bias schemes add the bias of their distances; causality follows the order (positions are sorted)."""
        q, k = position.rotate_at(q, positions, keys=False), position.rotate_at(k, positions, keys=True)
        bias = position.bias_at(positions)
        if bias is None and key_padding_mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        length = q.size(2)
        allowed = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()[None, None]
        if key_padding_mask is not None:
            allowed = see_self(allowed & ~key_padding_mask[:, None, None, :])
        mask = allowed if bias is None else bias.masked_fill(~allowed, float("-inf")).to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)

    def _plan(self, window, q_start, q_len, k_start, position, key_padding_mask, bsz):
        return plan(window, q_start, q_len, k_start, has_bias=position.kind == "bias" or window.sinks > 0,
                    padded=key_padding_mask is not None, batch_heads=bsz * self.num_heads)

    def _fill(self, incremental_state, k, v, key_padding_mask, window, position) -> None:
        """Start a cache after a parallel pass over positions 0 .. T - 1: keep the keys the next query sees,
        rotated at a centre at the end (so every stored scale is <= 1)."""
        tgt_len = k.size(2)
        keep = window.first_key(tgt_len)
        cache = KeyValueCache(str(window))
        cache.center = (tgt_len - 1) // CENTER_STEP * CENTER_STEP
        keys = position.rotate(k[:, :, keep:], keep, cache.center, keys=True)
        pad = None if key_padding_mask is None else key_padding_mask[:, keep:]
        cache.append(keys, v[:, :, keep:], pad, start=keep)
        cache.keep_sinks(k, v, 0, window.sinks)
        self.set_incremental_state(incremental_state, "attn_state", {"cache": cache})

    def _step(self, q, k, v, cache: KeyValueCache, key_padding_mask, window, position, dropout_p) -> Tensor:
        """New positions after a filled cache, in segments short enough that xPos's scale stays in range."""
        tgt_len = q.size(2)
        limit = position.max_center_offset(q.dtype)
        segment = tgt_len if limit is None else max(1, limit - CENTER_STEP)
        outs = []
        for a in range(0, tgt_len, segment):
            b = min(tgt_len, a + segment)
            first = cache.end
            last = first + (b - a) - 1
            if limit is not None and last - cache.center > limit:
                center = first // CENTER_STEP * CENTER_STEP
                cache.recenter(center, position.rescale_keys(cache.center, center, q.device))
            pad = None if key_padding_mask is None else key_padding_mask[:, a:b]
            qr = position.rotate(q[:, :, a:b], first, cache.center, keys=False)
            cache.append(position.rotate(k[:, :, a:b], first, cache.center, keys=True), v[:, :, a:b], pad)
            cache.keep_sinks(k[:, :, a:b], v[:, :, a:b], first, window.sinks)
            keys, values, kpm = cache.view(queries=b - a)
            if kpm is not None and not bool(kpm.any()):
                kpm = None
            chunks = self._plan(window, first, b - a, cache.start, position, kpm, q.size(0))
            sinks = (cache.sink_k, cache.sink_v) if window.sinks else None
            outs.append(attend(qr, keys, values, chunks, window, position, first, cache.start, True, kpm, dropout_p,
                               self.observer, q[:, :, a:b], sinks))
            cache.drop_before(window.first_key(last + 1))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor):
        """Reorder the cached keys/values along the batch for beam search (fairseq's contract)."""
        cache = self._cache(incremental_state)
        if cache is not None:
            cache.reorder(new_order)
        return incremental_state
