"""Causal multi-head self-attention with xPos (or another relative position), on SDPA.

Parameter names follow TorchScale's ``torchscale.component.multihead_attention.MultiheadAttention``
(``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, ``inner_attn_ln``) so TorchScale checkpoints load.
The math is TorchScale's (softmax(q k^T / sqrt(d)) v with xPos on q and k) computed by SDPA instead of
bmm + softmax, which keeps the fused CPU/GPU kernels and never materialises the L x L weights when no
mask is needed.
"""

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from torch import Tensor, nn
from torch.nn.attention.bias import causal_lower_right

from .windowed_attention import AttentionWindow, RelativePosition, biased_mask, relative_terms, see_self, windowed_attention

__all__ = ["LexSelfAttention"]

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
FULL = AttentionWindow()


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

    def cached_length(self, incremental_state: Optional[IncrementalState]) -> int:
        """Number of positions processed so far with this cache (0 without one); under BCA or a
        sliding window the cache itself holds only the last l or W of them."""
        if incremental_state is None:
            return 0
        saved = self.get_incremental_state(incremental_state, "attn_state")
        if saved is None or saved.get("prev_key") is None:
            return 0
        return saved["cache_start"] + saved["prev_key"].size(2)

    def forward(
        self,
        x: Tensor,
        pos: RelativePosition = None,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        window: AttentionWindow = FULL,
    ) -> Tensor:
        """Causal self-attention, optionally restricted to a BCA / sliding window.

        Args:
            x: (B, T, C) hidden states of T new positions.
            pos: the decoder's ``XPos`` (xPos, RoPE, Table 4 ablations), a ``DistanceBias`` (ALiBi, Sandwich,
                KERPLE, T5), or None (NoPE, absolute positions).
            key_padding_mask: (B, T) bool, True at padding; None when there is none.
            incremental_state: fairseq's incremental state. Keys and values are cached *before* xPos,
                so every call re-applies xPos with positions local to the visible keys and a centre
                inside them. Under BCA / sliding window the cache is trimmed after every call to what the
                next query can see (at most l or W positions): memory and per-token time stay flat.
            window: ``full`` (default), ``bca`` or ``sliding`` (see ``windowed_attention``). With a
                cache, new positions may come one at a time or in chunks (e.g. one block at a time).

        Returns:
            (B, T, C) in x's dtype.
        """
        bsz, tgt_len, _ = x.shape
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))

        start = 0  # absolute position of the first cached key
        past = 0  # positions processed before this call
        if incremental_state is not None:
            saved = self.get_incremental_state(incremental_state, "attn_state") or {}
            if saved.get("prev_key") is not None:
                if saved["window"] != str(window):
                    raise ValueError(
                        f"this key/value cache was filled under {saved['window']} attention, not {window}; "
                        "start a new incremental state to change the attention window."
                    )
                start = saved["cache_start"]
                past = start + saved["prev_key"].size(2)
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
                prev_mask = saved.get("prev_key_padding_mask")
                if prev_mask is not None or key_padding_mask is not None:
                    if prev_mask is None:
                        prev_mask = key_padding_mask.new_zeros(bsz, k.size(2) - tgt_len)
                    if key_padding_mask is None:
                        key_padding_mask = prev_mask.new_zeros(bsz, tgt_len)
                    key_padding_mask = torch.cat([prev_mask, key_padding_mask], dim=1)

        dropout_p = self.dropout if self.training else 0.0
        if past == 0:
            out = windowed_attention(q, k, v, window, pos, key_padding_mask, dropout_p)
        else:
            out = self._cached(q, k, v, window, pos, key_padding_mask, dropout_p, start)

        if incremental_state is not None:
            # Keep only the keys the next query can see: the cache never exceeds l (BCA: when a new block
            # starts, the oldest of two cached blocks goes) or W (sliding); full attention keeps all.
            drop = window.first_key(past + tgt_len) - start
            if drop > 0:
                k, v = k[:, :, drop:], v[:, :, drop:]
                key_padding_mask = key_padding_mask[:, drop:] if key_padding_mask is not None else None
                start += drop
            self.set_incremental_state(
                incremental_state,
                "attn_state",
                {"prev_key": k, "prev_value": v, "prev_key_padding_mask": key_padding_mask,
                 "cache_start": start, "window": str(window)},
            )
        out = out.transpose(1, 2).reshape(bsz, tgt_len, self.embed_dim)
        if self.inner_attn_ln is not None:
            out = self.inner_attn_ln(out)
        return self.out_proj(out)

    @staticmethod
    def _cached(q, k, v, window: AttentionWindow, pos: RelativePosition, key_padding_mask, dropout_p, start: int):
        """New queries after a cached prefix (a generation step, or the next block of a blockwise pass).

        Args:
            q: (B, H, T, D) queries of absolute positions P .. P + T - 1.
            k, v: (B, H, S, D) keys of positions start .. P + T - 1 (cache + new), before xPos.
            start: absolute position of k[:, :, 0].

        Only keys from the first one any query may see are used, with xPos positions local to them, so
        positions stay below l (BCA) or W (sliding) however long the sequence. The mask is causal aligned
        to the lower right when all queries share their first visible key (full attention; BCA within a
        block); otherwise (sliding window over several queries, padding, or an additive bias) an explicit
        (T, S') band, which carries the (H, T, S') bias when there is one.
        """
        tgt_len = q.size(2)
        last = start + k.size(2) - 1
        past = last - tgt_len + 1
        first = window.first_key(past)
        k, v = k[:, :, first - start :], v[:, :, first - start :]
        src_len = k.size(2)
        q, k, bias = relative_terms(pos, q, k, past - first, 0)
        mask = None
        padded = key_padding_mask is not None and bool(key_padding_mask.any())
        if window.first_key(last) != first or padded or (bias is not None and tgt_len > 1):
            query = torch.arange(past, last + 1, device=q.device)[:, None]
            key = torch.arange(first, last + 1, device=q.device)[None, :]
            mask = (key <= query) & (key >= window.first_key(query))  # (T, S')
            if padded:
                kpm = key_padding_mask[:, first - start :]
                mask = see_self(mask[None, None] & ~kpm[:, None, None, :], offset=past - first)
        elif tgt_len > 1:
            mask = causal_lower_right(tgt_len, src_len)
        if bias is not None:
            mask = bias.to(q.dtype) if mask is None else biased_mask(bias, mask, q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)

    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor):
        """Reorder the cached keys/values along the batch for beam search (fairseq's contract)."""
        saved = self.get_incremental_state(incremental_state, "attn_state")
        if saved is not None:
            for key, value in saved.items():
                if isinstance(value, Tensor):
                    saved[key] = value.index_select(0, new_order)
            incremental_state = self.set_incremental_state(incremental_state, "attn_state", saved)
        return incremental_state
