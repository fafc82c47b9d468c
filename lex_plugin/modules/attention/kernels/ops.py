"""The attention primitives every chunk kernel shares: SDPA (with learned sink logits as one more key), SDPA with the
log-sum-exp (the fused CPU kernel, or explicit fp32), one query over a generation cache as two matrix-vector products,
and the masks' helpers.

Shapes as in :mod:`..executor`'s legend: B batch, H heads, D head dimension, Tq / Tk the queries and keys of one call
(S the keys of a cache). Logits and softmax statistics are fp32 whatever the inputs' dtype.
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import CausalBias, causal_lower_right

__all__ = ["FLASH_CPU_KERNEL", "HALF_STEP_FP32_KEYS", "additive_mask", "attention_lse", "four_d", "one_query",
           "per_head_products", "scaled_logits", "sdpa", "see_self", "softmax_with_sink", "step_as_products", "step_logits", "weighted_values",
           "windows_in_batch"]

# A one-query step over a bf16 / fp16 cache on CPU runs its two products per (batch, head) in that dtype beyond this
# many keys, and batched in fp32 on fp32 copies up to it: this CPU's half-precision products cost ~50 us a call
# whatever their size, so over 256 keys (a BCA window) the fp32 copies are 5x faster, and over 16k keys the per-head
# products 3.4x (examples/lex_lm/BENCHMARKS.md, "bf16 generation over short windows"). From kv_cache.FEATURE_MAJOR_KEYS
# keys on, a generation cache widens itself to fp32 feature-major, and its steps take fp32's path ("bf16 generation at
# 16k"): the per-head products serve the caches in between, and one-query chunks that are no cache's.
HALF_STEP_FP32_KEYS = 2048


def additive_mask(allowed: Tensor, bias: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """SDPA's mask from a boolean visibility (True: may attend) and an optional fp32 bias that broadcast
    together: the boolean itself without a bias, else the bias with -inf where not allowed, in ``dtype``."""
    if bias is None:
        return allowed
    return bias.masked_fill(~allowed, float("-inf")).to(dtype)


def four_d(mask: Optional[Tensor]) -> Optional[Tensor]:
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


def scaled_logits(q: Tensor, k: Tensor, bias: Optional[Tensor]) -> Tensor:
    """fp32 q k^T / sqrt(d) (+ bias) over the last two dimensions."""
    logits = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.size(-1))
    return logits if bias is None else logits + bias




# SDPA's fused CPU flash kernel, which also returns the log-sum-exp (a private op of torch 2.x), looked up once at
# import; None where this torch has no op of that name: attention_lse then takes the explicit path, which runs anywhere
FLASH_CPU_KERNEL = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attention_lse(q: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor],
                   fused: Optional[bool] = None) -> Tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d)) v over the allowed keys, and the fp32 log-sum-exp of those logits per query
    (-inf where a query is allowed no key; its output is then 0): q (B, H, Tq, D), k and v (B, H, Tk, D),
    ``allowed`` bool broadcastable to (B, H, Tq, Tk), or None: every key. On CPU, SDPA's fused flash kernel when
    this torch has it (``FLASH_CPU_KERNEL``); elsewhere, or without it, explicit fp32 logits (``fused``: force
    one or the other; the explicit one runs on any device and any torch).

    Raises:
        RuntimeError: ``fused=True`` on a torch without the kernel."""
    mask = None if allowed is None else four_d(torch.where(allowed, 0.0, float("-inf")).to(q.dtype))
    kernel = FLASH_CPU_KERNEL
    if fused and kernel is None:
        raise RuntimeError(f"torch {torch.__version__} has no aten::_scaled_dot_product_flash_attention_for_cpu: "
                           "pass fused=None (or False) to take the explicit path.")
    if fused if fused is not None else (q.device.type == "cpu" and kernel is not None):
        out, lse = kernel(q, k, v, 0.0, False, attn_mask=mask)
    else:
        logits = scaled_logits(q, k, None) + (0.0 if mask is None else mask.float())
        lse = torch.logsumexp(logits, dim=-1)
        out = (torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v.float()).to(q.dtype)
    if allowed is None:
        return out, lse.float()
    empty = ~four_d(allowed).any(-1)  # (B or 1, 1 or H, Tq)
    return out.masked_fill(empty[..., None], 0.0), lse.float().masked_fill(empty, float("-inf"))


def windows_in_batch(x: Tensor) -> Tensor:
    """(B, H, n, L, D) windows -> (B n, H, L, D) (a copy: windows of keys overlap)."""
    return x.transpose(1, 2).flatten(0, 1)


def step_as_products(q: Tensor) -> bool:
    """Whether a one-query chunk of q's dtype and device runs as :func:`one_query` on a sequence-major cache, with no
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


def one_query(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], allowed: Optional[Tensor],
               sink: Optional[Tensor] = None) -> Tensor:
    """One query per (batch, head) over the keys of a generation cache: two batched matrix-vector products with a
    softmax between. Over a feature-major fp32 cache (keys and values stored (D, S), ``KeyValueCache``) both read
    long contiguous rows, so a generation step reads each cached key and value once near the memory bandwidth
    (``lex_lm_tiny`` at a 64k context: 0.58-0.62 of the time of a step on PyTorch's CPU SDPA kernel;
    examples/lex_lm/BENCHMARKS.md, "Fourth run: generation at the memory bandwidth"). Over a bf16 / fp16 cache on CPU
    (sequence-major, :func:`step_as_products`) the softmax runs in fp32 and the products, over more than
    :data:`HALF_STEP_FP32_KEYS` keys, per head in that dtype: the logits are then rounded to the cache's dtype once (8
    significant bits in bf16, as an eager half-precision attention), where SDPA's fused kernel keeps them fp32; over
    fewer keys, in fp32 on fp32 copies of the keys and values. A generation cache of ``kv_cache.FEATURE_MAJOR_KEYS``
    keys or more widens itself to fp32 feature-major, so a half-precision step over it runs as fp32's does (the
    output is cast back to q's dtype). On CUDA both products run batched in fp32, on fp32 copies of half-precision
    keys and values (one kernel each, whatever the key length).

    Args:
        q: (B, H, 1, D); k, v: (B, H, S, D) of q's dtype (or fp32: a widened cache); bias: (H, 1, S) or
            (B, H, 1, S) fp32 (a forget gate's decay), or None;
        allowed: boolean visibility broadcastable to (B, H, 1, S) (padded keys), or None: every key.
        sink: learned sink logits (1, H, 1, 1) fp32, or None.

    Returns:
        (B, H, 1, D) in q's dtype.
    """
    scores = step_logits(q, k)
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return weighted_values(scores, v, sink).to(q.dtype)  # (a widened half cache's values are fp32)



def half_products_per_head(x: Tensor) -> bool:
    """Whether one query's products over ``x`` (B, H, S, D) keys or values run per (batch, head) in x's half precision
    (:func:`per_head_products`): on CPU, more than :data:`HALF_STEP_FP32_KEYS` of them. At or below it, in fp32 and
    on other devices, they run batched in fp32 (on fp32 copies of half-precision keys and values)."""
    return x.device.type == "cpu" and x.dtype != torch.float32 and x.size(-2) > HALF_STEP_FP32_KEYS


def step_logits(q: Tensor, k: Tensor) -> Tensor:
    """q k^T / sqrt(D), (B, H, 1, S) fp32, for one query q (B, H, 1, D) over keys k (B, H, S, D) of q's dtype: one
    batched product in fp32 (on fp32 copies of half-precision keys up to :data:`HALF_STEP_FP32_KEYS`); per (batch,
    head) in half precision on CPU beyond (:func:`per_head_products`), the logits rounded to that precision once
    before the cast (SDPA's fused kernel keeps them fp32: against float64, up to about 5x its error where attention
    is peaked, tests/test_autocast.py)."""
    if half_products_per_head(k):
        return per_head_products(q, k.transpose(-1, -2)).float() * (1.0 / math.sqrt(q.size(-1)))
    return (q.float() * (1.0 / math.sqrt(q.size(-1)))) @ k.float().transpose(-1, -2)


def weighted_values(scores: Tensor, v: Tensor, sink: Optional[Tensor]) -> Tensor:
    """softmax(scores) v for one query: scores (B, H, 1, S) fp32 (-inf where unseen), v (B, H, S, D); with learned sink
    logits ``sink`` (1, H, 1, 1) fp32 in the denominator only. The product as :func:`step_logits`'s. Returns
    (B, H, 1, D) in v's dtype."""
    weights = softmax_with_sink(scores, sink)
    if half_products_per_head(v):
        return per_head_products(weights.to(v.dtype), v)
    return (weights @ v.float()).to(v.dtype)


def softmax_with_sink(scores: Tensor, sink: Optional[Tensor]) -> Tensor:
    """softmax over the last dimension of fp32 ``scores`` (-inf where unseen), with learned sink logits ``sink``
    (broadcastable to scores' shape but its last dimension 1, fp32) in the denominator only: exp(z - m) / (sum exp(z -
    m) + exp(s - m)), m the row's largest of both (normalised in fp32: no overflow). None: a plain softmax."""
    if sink is None:
        return torch.softmax(scores, dim=-1)
    top = torch.maximum(scores.amax(dim=-1, keepdim=True), sink)
    weights = torch.exp(scores - top)
    return weights / (weights.sum(dim=-1, keepdim=True) + torch.exp(sink - top))


def per_head_products(a: Tensor, b: Tensor) -> Tensor:
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


def sdpa(q: Tensor, k: Tensor, v: Tensor, *, attn_mask=None, is_causal: bool = False, dropout_p: float = 0.0,
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
