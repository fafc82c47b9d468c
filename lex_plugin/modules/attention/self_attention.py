"""Causal multi-head self-attention on the planner and executor, with any position scheme and a cache.

Parameter names follow TorchScale's ``torchscale.component.multihead_attention.MultiheadAttention``
(``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, ``inner_attn_ln``) so TorchScale checkpoints load.
The math is TorchScale's (softmax(q k^T / sqrt(d)) v with xPos on q and k) computed by SDPA through
:func:`~.planner.plan` and :func:`~.executor.attend`: one path for training, evaluation under any window,
chunked prefill and generation steps.
"""

import uuid
from typing import Dict, Optional, Sequence

from torch import Tensor, nn

from ..autocast import autocast_dtype
from ..positions.scheme import NoPositions, PositionScheme
from .executor import Observer, attend
from .kv_cache import HeldKeys, KeyValueCache, cumulative_decay
from .planner import dense_query_limit, plan
from ..designs.registry import LayerDesign, QueryContext
from .spec import FULL_SPEC, AttentionSpec

__all__ = ["LexSelfAttention"]

# fairseq's incremental state: one dict per generation, each layer's cache under its own key
IncrementalState = Dict[str, object]
NOPE = NoPositions()


class LexSelfAttention(nn.Module):
    """Causal self-attention for a decoder-only LM, with xPos on queries and keys (or another relative
    position: RoPE, an additive bias, none).

    Args:
        embed_dim: model dimension C.
        num_heads: H; C must be divisible by H.
        dropout: dropout on the attention probabilities (training only).
        subln: add TorchScale's ``inner_attn_ln`` (Magneto sub-LayerNorm) before ``out_proj``.
        layernorm_eps: epsilon of that LayerNorm, and of a design's norms (QK-norm).
        designs: what the model's trained designs do in this layer (``modules.designs``: QK-norm, SSMax, Llama 4's
            temperature tuning, learned sinks, MoBA...), in the registry's order: each creates its parameters here
            (``attach``) and acts at its points of :meth:`forward` (queries and keys before the position scheme, a
            query factor, sink logits in the softmax, the attention call itself, the keys each query sees, each head's
            output before the output projection).
        depth: the layer's index in the stack, 0 first (a design may depend on it: differential attention's
            lambda_init).

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
        designs: Sequence[LayerDesign] = (),
        depth: int = 0,
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
        self.inner_attn_ln = nn.LayerNorm(embed_dim, eps=layernorm_eps) if subln else None
        self.layernorm_eps = layernorm_eps
        self.depth = depth
        self.designs = tuple(designs)
        for design in self.designs:
            design.attach(self)
        self._sinks = next((design for design in self.designs if design.sinks), None)  # (build_designs: one at most)
        self._taker = next((design for design in self.designs if design.takes_attention), None)  # (one at most)
        retriever = next((design for design in self.designs if design.retrieves), None)  # (one at most)
        self._retrieval = None if retriever is None else retriever.retrieval(self)
        self._forget = next((design for design in self.designs if design.decays), None)  # (one at most)
        self.reset_parameters()
        # this layer's key in fairseq's incremental-state dict (the contract of fairseq's
        # FairseqIncrementalState: a unique id per module; the dict is the generation's, not the module's)
        self._state_key = f"{uuid.uuid4()}.attn_state"

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

    def cache(self, incremental_state: Optional[IncrementalState]) -> Optional[KeyValueCache]:
        """This layer's key/value cache in ``incremental_state`` (None: none yet, or no state)."""
        return None if incremental_state is None else incremental_state.get(self._state_key)

    def cached_length(self, incremental_state: Optional[IncrementalState]) -> int:
        """Number of positions processed so far with this cache (0 without one)."""
        cache = self.cache(incremental_state)
        return 0 if cache is None else cache.end

    def cached_keys(self, incremental_state: Optional[IncrementalState]) -> int:
        """Number of key positions the cache holds now (under BCA at most l, sliding at most W; plus the
        sink tokens)."""
        cache = self.cache(incremental_state)
        return 0 if cache is None else cache.length + cache.sink_length

    def forward(
        self,
        x: Tensor,
        scheme: PositionScheme = NOPE,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        spec: AttentionSpec = FULL_SPEC,
        positions: Optional[Tensor] = None,
        observer: Optional[Observer] = None,
    ) -> Tensor:
        """Causal self-attention under ``spec`` (its window and RoPE scaling).

        Args:
            x: (B, T, C) hidden states of T new positions.
            scheme: the layer's position scheme (xPos, RoPE, a bias, NoPE...).
            key_padding_mask: (B, T) bool, True at padding that causality does not hide; None when none.
            incremental_state: fairseq's incremental state. New positions may come one at a time or in
                chunks. Keys are cached rotated (see ``KeyValueCache``); under BCA / sliding window the
                cache keeps only what the next query can see (at most l or W positions): memory and
                per-token time stay flat.
            spec: the attention window (full by default, BCA, sliding, sinks, Λ) and RoPE scaling.
            positions: (B, T) int64 sorted position ids per sample (randomized positions at training,
                Ruoss et al. 2023), or None for 0 .. T - 1; full attention, no cache.
            observer: called with the pre-softmax logits of every chunk (``executor.Observer``), or None.

        Returns:
            (B, T, C) in x's dtype.

        Raises:
            ValueError: a cache filled under another spec; ``positions`` with a cache or a bounded window.
        """
        bsz, tgt_len, _ = x.shape
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        cache = self.cache(incremental_state)
        if self.designs:  # (a model without designs does nothing here)
            for design in self.designs:  # before any rotation (QK-norm)
                q, k = design.queries_and_keys(self, q, k)
            at = QueryContext(first=0 if cache is None else cache.end, length=tgt_len, spec=spec, positions=positions)
            for design in self.designs:  # query factors (SSMax, temperature tuning), before any rotation
                q = design.queries(self, q, at)
        dropout_p = self.dropout if self.training else 0.0
        if positions is not None and (incremental_state is not None or spec.window.bounded or spec.rope_scaling is not None):
            raise ValueError("arbitrary positions (--random-positions) are for training: full attention, no cache.")
        if cache is not None and cache.spec != spec:
            raise ValueError(
                f"this key/value cache was filled under {cache.spec} attention, not {spec}; "
                "start a new incremental state to change the attention window or scaling."
            )
        log_forget = None if self._forget is None else self._forget.log_forget(self, x)  # (B, H, T) fp32
        if cache is None or cache.end == 0:
            chunks = self._plan(q, spec=spec, scheme=scheme, q_len=tgt_len, key_padding_mask=key_padding_mask,
                                observer=observer)
            decay = None if log_forget is None else cumulative_decay(log_forget)
            held = HeldKeys(k, v, key_padding_mask, decay=decay)
            out = self._attention(q, lambda queries: attend(
                queries, held, chunks, spec=spec, scheme=scheme, dropout_p=dropout_p, observer=observer,
                positions=positions, sink_logits=self._sink_logits(), retrieval=self._retrieval))
            if incremental_state is not None:
                incremental_state[self._state_key] = KeyValueCache.after_prefill(
                    spec, scheme, k, v, key_padding_mask, decay=decay)
        else:
            out = self._step(q, k, v, cache, key_padding_mask, spec, scheme, dropout_p, observer, log_forget)
        for design in self.designs:  # on each head's output, before the heads are merged (an output gate)
            out = design.output(self, out, x)
        out = out.transpose(1, 2).reshape(bsz, tgt_len, self.embed_dim)
        if self.inner_attn_ln is not None:
            out = self.inner_attn_ln(out)
        return self.out_proj(out)

    def _attention(self, q: Tensor, run) -> Tensor:
        """The executor's attention for queries ``q`` (B, H, T, d), ``run(queries)`` one executor call over the layer's
        keys: through the design that takes the attention call (differential attention), else one call."""
        return run(q) if self._taker is None else self._taker.attend(self, q, run)

    def _sink_logits(self) -> Optional[Tensor]:
        """(H,) logits a design adds to every softmax's denominator (learned sinks), or None."""
        return None if self._sinks is None else self._sinks.sink_logits(self)

    def _plan(self, q: Tensor, *, spec: AttentionSpec, scheme: PositionScheme, q_len: int, q_start: int = 0,
              k_start: int = 0, key_padding_mask: Optional[Tensor] = None, observer=None):
        """The chunks of ``plan`` for queries ``q`` (B, H, T, D): sized by its batch, bounded by its dtype's range
        (the autocast dtype under autocast: attention runs in it)."""
        bsz, dtype = q.size(0), autocast_dtype(q.device) or q.dtype
        decays = self._forget is not None  # a forget gate's bias: explicit logits in dense chunks at true positions
        explicit = scheme.kind == "bias" or spec.window.sinks > 0 or spec.position_map is not None or decays
        # a rotary position map's chunk holds a (B, Tq, Tk) mask, not (B, H, Tq, Tk) logits, where the fused CPU
        # kernel returns the log-sum-exp (kernels.ops.attention_lse); other devices form the logits explicitly
        per_head = not (spec.position_map is not None and scheme.kind == "rotary" and observer is None
                        and q.device.type == "cpu")
        return plan(spec.window, q_start=q_start, q_len=q_len, k_start=k_start, has_bias=explicit,
                    padded=key_padding_mask is not None, batch_heads=bsz * (self.num_heads if per_head else 1),
                    local_positions=scheme.translation_invariant and not decays,
                    dense_queries=dense_query_limit(scheme, dtype, spec.rope_scaling))

    def _step(self, q, k, v, cache: KeyValueCache, key_padding_mask, spec: AttentionSpec, scheme, dropout_p,
              observer, log_forget: Optional[Tensor] = None) -> Tensor:
        """New positions after a filled cache: the cache runs its segments (``SegmentedAttention.attend``), each
        planned and attended here over what it holds (with a forget gate, the log gates of the new positions)."""

        def segment(queries: Tensor, held: HeldKeys, first: int) -> Tensor:
            chunks = self._plan(queries, spec=spec, scheme=scheme, q_len=queries.size(2), q_start=first,
                                k_start=held.start, key_padding_mask=held.padding, observer=observer)
            return self._attention(queries, lambda rotated: attend(
                rotated, held, chunks, spec=spec, scheme=scheme, q_start=first, dropout_p=dropout_p, observer=observer,
                sink_logits=self._sink_logits(), retrieval=self._retrieval))

        return cache.attend(q, k, v, key_padding_mask, segment, log_forget=log_forget)

    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor):
        """Reorder the cached keys/values along the batch for beam search (fairseq's contract)."""
        cache = self.cache(incremental_state)
        if cache is not None:
            cache.reorder(new_order)
        return incremental_state
