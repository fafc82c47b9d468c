"""The decoder stack of the LeX Transformer, without fairseq: embeddings, positions, layers, output projection.

:class:`DecoderStack` is what every face of the model runs: fairseq's ``LexDecoder``
(``models.lex_decoder``, a ``FairseqIncrementalDecoder``) and the Hugging Face export (``lex_plugin.hf``)
both build their modules with :meth:`DecoderStack.build_stack` and run :meth:`DecoderStack.stack_features`,
so the two compute the same function of the same state dict (TorchScale's ``Decoder`` names). How attention
runs (window, position map, RoPE scaling, log-n: an ``AttentionSpec``) is an argument of every call, with a
default fixed when the stack is built; :meth:`DecoderStack.under` and :meth:`DecoderStack.with_autocast` give
views with another default, never a setting changed and restored.
"""

import contextlib
import copy
import hashlib
import logging
import math
from dataclasses import replace
from functools import partial
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .attention.self_attention import NOPE, IncrementalState
from .attention.spec import FULL_SPEC, AttentionSpec
from .autocast import AUTOCAST_DTYPES, autocast, check_autocast
from .decoder_layer import LexDecoderLayer
from .designs import build_designs
from .layer_pattern import LayerKind, parse_layer_pattern
from .padding import check_left_padding
from .positions import PositionScheme, build_positions, get_scheme

logger = logging.getLogger(__name__)

__all__ = ["DecoderStack", "UNBOUNDED_POSITIONS", "is_right_padded", "symbols_digest"]

# xPos has no position table, so the model itself takes any length. fairseq compares sample lengths
# with max_positions() and *silently skips* longer samples in eval-lm; the model must never be what
# caps them, so it reports a bound no corpus reaches.
UNBOUNDED_POSITIONS = 2**30


class DecoderStack:
    """Mixin of an ``nn.Module``: the decoder-only LeX Transformer configured by TorchScale's ``DecoderConfig``.

    Tokens are embedded (scaled by sqrt(C) unless ``no_scale_embedding``), plus an absolute position vector
    for absolute schemes, optionally layer-normed, passed through ``decoder_layers`` blocks
    (:class:`LexDecoderLayer`), the final LayerNorm (pre-LN models) and the output projection. The position
    scheme is ``config.pos_emb`` from the ``--pos-emb`` registry: one module shared by every layer, or one per
    layer for schemes with per-layer parameters (KERPLE); each layer's attention gets its scheme. A layer pattern
    (``config.layer_pattern``, :mod:`~.layer_pattern`) gives layers no positions (NoPE) and local windows of their
    own; the attention spec of a call then reaches the global layers only (:meth:`layer_spec`). With a sink token
    (``config.sink_token``, StreamingLLM section 3.3) a learned vector is placed before the first token of every
    sequence, at position 0 (the tokens at 1 ..), and its output dropped: ``--sink-tokens 1`` keeps it visible
    under a bounded window.

    Submodules (state-dict names, TorchScale's ``Decoder``): ``embed_tokens``, ``layernorm_embedding``,
    ``positions.N.*`` (KERPLE, T5, learned), ``layers.N.*``, ``layer_norm``, ``output_projection``; and
    ``sink_embedding``, the sink token's (C,) vector.
    """

    def build_stack(self, config, embed_tokens: nn.Embedding, output_size: int, spec: AttentionSpec = FULL_SPEC,
                    layer_norm: Callable[..., nn.Module] = nn.LayerNorm) -> None:
        """Create the submodules (called once from the module's ``__init__``, after ``nn.Module.__init__``).

        Args:
            config: TorchScale ``DecoderConfig`` plus ``pos_emb`` and its scheme options (``random_positions``
                optional).
            embed_tokens: ``nn.Embedding`` (V, C) with ``padding_idx``.
            output_size: rows of the output projection (the target vocabulary; tied: ``embed_tokens``'s).
            spec: the default attention spec.
            layer_norm: the LayerNorm class of the embedding and final norms (fairseq's fused one under fairseq).

        Raises:
            ValueError: an unknown ``pos_emb`` or options it cannot take; a spec the scheme or the designs cannot take
                (:meth:`check_spec`, run here on ``spec``: a design that chooses its blocks on a bias scheme is refused
                before any update).
        """
        dim = config.decoder_embed_dim
        self.embed_dim = dim
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if config.no_scale_embedding else math.sqrt(dim)
        self.layernorm_embedding = layer_norm(dim, eps=config.layernorm_eps) if config.layernorm_embedding else None
        self.dropout_module = nn.Dropout(config.dropout)

        self.pos_emb = config.pos_emb
        self.position_kind, self.positions = build_positions(config)
        self.random_positions = int(getattr(config, "random_positions", 0) or 0)  # L_max, 0: off
        # the trained designs this model has (modules.designs), each with what it does in a layer and in the stack
        self.designs = build_designs(config)
        self._num_updates = 0  # fairseq's (set_num_updates: each training step, and when it loads a checkpoint)
        for _, design in self.designs:
            design.attach_decoder(self)
        self.layer_pattern = str(getattr(config, "layer_pattern", None) or "") or None
        self.layer_kinds = parse_layer_pattern(self.layer_pattern, self.pos_emb, config.decoder_layers,
                                               getattr(config, "tokens_per_sample", None))
        if self.layer_kinds is not None:
            self._check_pattern(config)
        kinds = self.layer_kinds or (LayerKind(),) * config.decoder_layers
        self.layers = nn.ModuleList(
            LexDecoderLayer(config, i, designs=[layer for design, layer in self.designs
                                                if kinds[i].is_global or not layer.global_only])
            for i in range(config.decoder_layers))
        # a local layer's spec is its trained window, whatever the call's (layer_spec)
        self._local_specs = tuple(None if k.is_global else AttentionSpec(window=k.window) for k in kinds)
        self._spec = self.check_spec(spec)
        self._autocast: Optional[torch.dtype] = None  # a view's (with_autocast); the model itself runs in its dtype
        self.num_layers = len(self.layers)
        self.layer_norm = layer_norm(dim, eps=config.layernorm_eps) if config.decoder_normalize_before else None

        if config.share_decoder_input_output_embed:
            self.output_projection = nn.Linear(dim, embed_tokens.num_embeddings, bias=False)
            self.output_projection.weight = embed_tokens.weight
        else:
            self.output_projection = nn.Linear(dim, output_size, bias=False)
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=dim**-0.5)
        self._scale_init(config)

    def _check_pattern(self, config) -> None:
        """Refuse a layer pattern this model cannot train.

        Raises:
            ValueError: an absolute scheme (added to the embeddings, not per layer); NoPE layers under a scheme with
                per-layer parameters (they would go untrained); randomized positions with a local window.
        """
        name = f"--layer-pattern {self.layer_pattern}"
        if self.position_kind == "absolute":
            raise ValueError(f"{name}: --pos-emb {self.pos_emb} adds absolute positions to the embeddings, which no layer "
                             "can leave out; pattern the layers of a relative scheme (xpos, rope, alibi ...).")
        if get_scheme(self.pos_emb).per_layer and not all(k.positions for k in self.layer_kinds):
            raise ValueError(f"{name}: --pos-emb {self.pos_emb} has parameters in every layer, which a NoPE layer would "
                             "leave untrained; use a scheme without per-layer parameters, or no none/ entries.")
        if self.random_positions and not all(k.is_global for k in self.layer_kinds):
            raise ValueError(f"{name}: --random-positions places positions by sample over full attention; a local "
                             "window needs the ordinary positions. Drop one of the two.")
        for design, layer in self.designs:
            if layer.global_only and all(not k.is_global for k in self.layer_kinds):
                given = ", ".join(o.flag for o in design.options if o.read(config) not in (None, False))
                raise ValueError(f"{name}: {design.name} ({given}) acts in the global layers of a pattern, and this one "
                                 "has none; add a */full entry, or change those options.")
        logger.info("layer pattern: %s", ", ".join(k.describe(self.pos_emb) for k in self.layer_kinds))

    def _scale_init(self, config):
        """TorchScale's depth-dependent initialisation of fc1, fc2, out_proj, v_proj (decoder-only):
        DeepNet divides by (8 N) ** 0.25, Magneto (subln) multiplies by sqrt(log 2N)."""
        if config.deepnorm:
            factor = 1.0 / math.pow(8.0 * config.decoder_layers, 0.25)
        elif config.subln:
            factor = math.sqrt(math.log(config.decoder_layers * 2))
        else:
            return
        with torch.no_grad():
            for name, p in self.layers.named_parameters():
                if any(part in name for part in ("fc1", "fc2", "out_proj", "v_proj")):
                    p.mul_(factor)

    def _prefix(self) -> Optional[Tensor]:
        """(C,) the vector a design places before every sequence (the sink token's), or None."""
        return next((v for v in (design.prefix(self) for _, design in self.designs) if v is not None), None)

    @property
    def sink_positions(self) -> int:
        """Positions the model places before the tokens: 1 with a design's prefix (the sink token), else 0."""
        return 0 if self._prefix() is None else 1

    def _interleave(self) -> Optional[Tuple[int, Tensor]]:
        """(b, the (C,) vector) a design places after every b tokens (landmark tokens), or None."""
        return next((v for v in (design.interleave(self) for _, design in self.designs) if v is not None), None)

    def tokens_in(self, positions: int) -> int:
        """The tokens among the first ``positions`` positions the model has run: without the sink token
        (:attr:`sink_positions`) and the landmarks (one after every b tokens: P = b + 1 positions per block)."""
        tokens = max(0, positions - self.sink_positions)
        interleave = self._interleave()
        return tokens if interleave is None else tokens - tokens // (interleave[0] + 1)

    def past_length(self, incremental_state: Optional[IncrementalState]) -> int:
        """Tokens already run through ``incremental_state`` (0 without one); the positions the caches hold are
        this plus :attr:`sink_positions` once a token has run, plus one landmark per b tokens with landmark tokens."""
        if incremental_state is None:
            return 0
        return self.tokens_in(self.layers[0].self_attn.cached_length(incremental_state))

    def stack_features(self, prev_output_tokens: Tensor, incremental_state: Optional[IncrementalState] = None,
                       spec: Optional[AttentionSpec] = None, observer: Optional[Callable] = None,
                       padding_mask: Optional[Tensor] = None, prefix: bool = True) -> Tuple[Tensor, List[Tensor]]:
        """Final hidden states of the positions not yet in ``incremental_state``.

        Args:
            prev_output_tokens: (B, T) int64 ids: with ``prefix`` the whole prefix (fairseq's generator: the
                positions already cached are skipped), otherwise only the new positions (Hugging Face's).
            incremental_state: the key/value caches of the layers, or None (a parallel forward).
            spec: the attention spec (default :attr:`spec`).
            observer: ``observer(layer, logits, distance, visible)`` (``executor.Observer``) or None.
            padding_mask: (B, T') bool, True at padding, of the new positions; None: the tokens equal to
                ``padding_idx``.
            prefix: whether ``prev_output_tokens`` starts at position 0 (True) or after the cache (False).

        Returns:
            ((B, T', C) hidden states, [embedding output, each layer's output]), T' the new positions.

        Raises:
            ValueError: every position of ``prev_output_tokens`` is already in the cache; a spec this model
                cannot take (:meth:`check_spec`).
        """
        with self.autocast_context(prev_output_tokens.device):
            return self._features(prev_output_tokens, incremental_state, spec, observer, padding_mask, prefix)

    def _features(self, prev_output_tokens: Tensor, incremental_state: Optional[IncrementalState],
                  spec: Optional[AttentionSpec], observer: Optional[Callable],
                  padding_mask: Optional[Tensor] = None, prefix: bool = True) -> Tuple[Tensor, List[Tensor]]:
        past = self.past_length(incremental_state)
        tokens = prev_output_tokens[:, past:] if prefix else prev_output_tokens
        # a design's prefix (the sink token) goes first, once: in a parallel forward, or the first call through a cache
        vector = self._prefix()
        sink = vector is not None and (
            incremental_state is None or self.layers[0].self_attn.cached_length(incremental_state) == 0)
        if tokens.size(1) == 0:
            raise ValueError(
                f"the decoder got {prev_output_tokens.size(1)} tokens but {past} are already cached: "
                "pass the prefix plus at least one new token."
            )
        if padding_mask is None:
            padding_mask = tokens.eq(self.padding_idx)
        elif padding_mask.shape != tokens.shape:
            raise ValueError(f"the padding mask is {tuple(padding_mask.shape)}; the new positions are {tuple(tokens.shape)}.")

        x = self.embed_scale * self.embed_tokens(tokens)
        interleave = self._interleave()
        kept = None  # the token positions of x once landmarks are placed (None: every position is a token's)
        if interleave is not None:  # landmark tokens after every b tokens, counted from the first
            x, padding_mask, kept = _place_after_blocks(x, padding_mask, past, *interleave, self.embed_scale)
        if not padding_mask.any() or (incremental_state is None and is_right_padded(padding_mask)):
            padding_mask = None  # causal attention never lets a real token see trailing pads
        if sink:  # the sink token at position 0, before the first token
            x = torch.cat([(self.embed_scale * vector).to(x.dtype).expand(x.size(0), 1, -1), x], dim=1)
            if padding_mask is not None:
                padding_mask = torch.cat([padding_mask.new_zeros(x.size(0), 1), padding_mask], dim=1)
        # train()/eval() reach the layers whichever view they were called on (a view's own flag may be stale)
        training = self.layers.training
        positions = self._random_positions(tokens) if training and incremental_state is None else None
        if self.position_kind == "absolute":
            table = self.positions[0]
            start = past + (0 if sink else self.sink_positions)
            rows = table.embed(start, x.size(1), x.device) if positions is None else table.embed_at(positions)
            x = x + rows.to(x.dtype)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        inner_states = [x]
        spec = self._spec if spec is None and not self.positions_dropped else self.check_spec(spec or self._spec)
        if prefix:  # the fairseq face: the rows whole, cached positions included (the HF face checks its attention mask)
            check_left_padding(self, prev_output_tokens.ne(self.padding_idx), spec)
        for i, layer in enumerate(self.layers):
            x = self.run_layer(layer, x, self.position(i), padding_mask, incremental_state, self.layer_spec(i, spec),
                               positions, None if observer is None else partial(observer, i))
            inner_states.append(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if sink:  # the sink's outputs are no token's
            x, inner_states = x[:, 1:], [state[:, 1:] for state in inner_states]
        if kept is not None:  # nor the landmarks'
            x, inner_states = x[:, kept], [state[:, kept] for state in inner_states]
        return x, inner_states

    def run_layer(self, layer: nn.Module, x: Tensor, *args) -> Tensor:
        """Layer ``layer`` on ``x`` (arguments as ``LexDecoderLayer.forward``); the Hugging Face model wraps it for
        gradient checkpointing."""
        return layer(x, *args)

    def _random_positions(self, tokens: Tensor) -> Optional[Tensor]:
        """Randomized positions at training (Ruoss et al. 2023, section 3): for each sample, T distinct
        position ids drawn uniformly from [0, L_max) and sorted; None when ``random_positions`` is 0.

        Raises:
            ValueError: T > L_max.
        """
        limit = self.random_positions
        if not limit:
            return None
        bsz, length = tokens.shape
        if length > limit:
            raise ValueError(f"--random-positions {limit} must be at least the sample length {length}.")
        draws = torch.rand(bsz, limit, device=tokens.device).argsort(dim=1)[:, :length]
        return draws.sort(dim=1).values

    def position(self, layer: int) -> PositionScheme:
        """The position scheme of layer ``layer`` (shared, or its own for per-layer schemes); none once DroPE has
        dropped the positions, or in a pattern's NoPE layers."""
        if self.positions_dropped or (self.layer_kinds is not None and not self.layer_kinds[layer].positions):
            return NOPE
        return self.positions[layer if len(self.positions) > 1 else 0]

    def layer_spec(self, layer: int, spec: AttentionSpec) -> AttentionSpec:
        """The attention spec layer ``layer`` runs under when the call's is ``spec``: ``spec`` itself without a
        pattern; in a pattern, a local layer's trained window (whatever ``spec``), and for a global NoPE layer
        ``spec`` without what acts on positions (RoPE scaling, position map: :meth:`check_spec` refuses them when
        no global layer has positions)."""
        if self.layer_kinds is None:
            return spec
        local = self._local_specs[layer]
        if local is not None:
            return local
        if self.layer_kinds[layer].positions or (spec.rope_scaling is None and spec.position_map is None):
            return spec
        return replace(spec, rope_scaling=None, position_map=None)

    def set_num_updates(self, num_updates: int) -> None:
        """fairseq's hook, called with the updates done before each training step and when a checkpoint is loaded:
        a design may drop the positions from one on (DroPE, ``LayerDesign.drops_positions``)."""
        before = self._num_updates
        self._num_updates = int(num_updates)
        for _, design in self.designs:
            if design.drops_positions(self._num_updates) and not design.drops_positions(before):
                logger.info("%s (now at update %d): the model runs as NoPE", design, self._num_updates)

    @property
    def positions_dropped(self) -> bool:
        """Whether a design has dropped the positions at the updates done (DroPE from its start on)."""
        return any(design.drops_positions(self._num_updates) for _, design in self.designs)

    @property
    def active_position_kind(self) -> str:
        """The kind of the positions the layers use now: the scheme's, or ``none`` once DroPE has dropped them."""
        return "none" if self.positions_dropped else self.position_kind

    @property
    def spec(self) -> AttentionSpec:
        """The attention spec ``forward`` uses when given none (read-only; :meth:`under` for another)."""
        return self._spec

    def check_spec(self, spec: AttentionSpec) -> AttentionSpec:
        """``spec`` if this decoder can run it.

        Raises:
            TypeError: not an :class:`AttentionSpec`.
            ValueError: a RoPE scaling on a scheme that is not rotary or does not rotate; a position map on a scheme without
                distances (NoPE, absolute), or with fractional distances on a bias scheme, or on a scheme that is
                not translation-invariant; log-n on learned positions or on a model whose design refuses it (``DesignSpec.refuses_logn``);
                a block retrieval on a bias scheme, a MoBA model or an SSMax model; a model whose design chooses its
                blocks (MoBA) on a bias scheme, whatever the spec; sink tokens, a position map or a block
                retrieval on a forget gate's model.
        """
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"the attention spec must be an AttentionSpec, got {type(spec).__name__}.")
        if self.layer_kinds is not None:
            self._check_pattern_spec(spec)
        if spec.rope_scaling is not None and self.active_position_kind != "rotary":
            raise ValueError(
                f"--rope-scaling {spec.rope_scaling.kind} scales rotary positions; this model uses --pos-emb {self.pos_emb} "
                f"({self.active_position_kind}{', dropped by DroPE' if self.positions_dropped else ''}). Use it with rope or xpos checkpoints."
            )
        if spec.rope_scaling is not None and not all(getattr(scheme, "rotation", True) for scheme in self.positions):
            raise ValueError(
                f"--rope-scaling {spec.rope_scaling.kind} rescales rotation frequencies; this model was trained without "
                "rotation (--xpos-no-rotation: theta = 0), so there is nothing to scale. Evaluate it without --rope-scaling."
            )
        method = spec.position_map
        if method is not None:
            name = f"--position-map {method.name}"
            if self.active_position_kind == "none":
                raise ValueError(f"{name} remaps the distances a position scheme sees; NoPE has no positions to remap.")
            if self.active_position_kind == "absolute":
                raise ValueError(f"{name} remaps relative distances; --pos-emb {self.pos_emb} adds absolute positions to the "
                                 "embeddings, which attention never sees as distances. Use it with a rotary or bias scheme.")
            if self.active_position_kind == "bias" and not method.integer:
                raise ValueError(f"{name} gives fractional distances; --pos-emb {self.pos_emb}'s bias is tabulated at integer "
                                 "distances. Use rerope, self_extend or dca with bias schemes.")
            if not all(scheme.translation_invariant for scheme in self.positions):
                raise ValueError(f"{name} needs a translation-invariant scheme (logits a function of n - m).")
        for design, layer in self.designs:
            if spec.logn and design.refuses_logn:
                raise ValueError(design.refuses_logn)
            if spec.retrieval is not None and (layer.retrieves or design.name == "ssmax"):
                raise ValueError(f"--retrieval-blocks on a model trained with {design.name}: "
                                 + ("its layers choose their own blocks." if layer.retrieves else
                                    "its queries scale by the log of the keys their window shows, not the retrieved ones.")
                                 + " Evaluate it without --retrieval-blocks.")
            if layer.decays and (spec.window.sinks or spec.position_map is not None or spec.retrieval is not None):
                what = ("--sink-tokens" if spec.window.sinks else "a position map" if spec.position_map is not None
                        else "--retrieval-blocks")
                raise ValueError(f"{what} on a model trained with {design.name}: each key decays by the forget gates "
                                 "since it, which is defined at true positions only. Evaluate it with full attention, "
                                 "--bca or --sliding-window.")
        if self.active_position_kind == "bias":  # (the executor refuses both too, where it is reached directly)
            if spec.retrieval is not None:
                raise ValueError(f"--retrieval-blocks scores blocks by q . mean(K); --pos-emb {self.pos_emb}'s bias would "
                                 "not enter that gate. Use it with rotary, absolute or no positions.")
            for design, layer in self.designs:
                if layer.retrieves:
                    raise ValueError(f"{design.name} scores blocks by q . mean(K): it takes a rotary position scheme or "
                                     f"none, not the bias of --pos-emb {self.pos_emb}, which would not enter that gate; "
                                     "train it with --pos-emb xpos, rope or none.")
        if spec.logn and self.pos_emb == "learned":
            raise ValueError("log-n scaling matters only past the training length, where a learned position table ends "
                             "(--pos-emb learned); use it with relative schemes.")
        return spec

    def _check_pattern_spec(self, spec: AttentionSpec) -> None:
        """Refuse a spec that would change no layer of a pattern (:meth:`layer_spec`): any spec but full attention
        when no layer is global; a RoPE scaling or a position map when no global layer has positions."""
        global_layers = [k for k in self.layer_kinds if k.is_global]
        name = f"--layer-pattern {self.layer_pattern}"
        if not global_layers and spec != FULL_SPEC:
            raise ValueError(f"the evaluation's attention ({spec}) changes the global layers of a pattern, and {name} has "
                             "none: every layer keeps its trained window. Evaluate it without attention flags.")
        if not any(k.positions for k in global_layers) and (spec.rope_scaling is not None or spec.position_map is not None):
            what = (f"--rope-scaling {spec.rope_scaling.kind}" if spec.rope_scaling is not None
                    else f"--position-map {spec.position_map.name}")
            raise ValueError(f"{what} acts on the positions of the global layers, and those of {name} have none (NoPE); "
                             "the local layers keep their trained window and positions. Evaluate without it.")

    def under(self, spec: AttentionSpec) -> "DecoderStack":
        """A view of this decoder whose ``forward`` defaults to ``spec``: every parameter, buffer, layer and hook
        is shared (loading weights into one loads them into both; no copy; a submodule assigned or a hook
        registered on one is on both), only the default differs. ``train()``/``eval()`` on either reach the
        shared layers, which decide training behaviour (randomized positions, dropout).

        Raises:
            TypeError, ValueError: as :meth:`check_spec`.
        """
        view = copy.copy(self)  # a new __dict__ holding the same _modules / _parameters / _buffers
        object.__setattr__(view, "_spec", self.check_spec(spec))
        return view

    @property
    def autocast(self) -> Optional[torch.dtype]:
        """The dtype ``forward`` runs under ``torch.autocast`` in (a view's, :meth:`with_autocast`), or None: the
        weights' own dtype."""
        return self._autocast

    def with_autocast(self, dtype: Optional[torch.dtype]) -> "DecoderStack":
        """A view of this decoder (sharing everything, as :meth:`under`) whose ``forward`` and
        ``extract_features`` run under ``torch.autocast(dtype)`` on the input's device, fp32 weights kept
        (:mod:`~lex_plugin.modules.autocast`: position math, softmax statistics fp32); None: no autocast.

        Raises:
            ValueError: a dtype other than those of ``AUTOCAST_DTYPES`` (fp16 autocast needs a loss scaler:
                fairseq's ``--amp``).
        """
        if dtype is not None and dtype not in AUTOCAST_DTYPES.values():
            raise ValueError(f"autocast in {dtype} is not offered: {', '.join(map(str, AUTOCAST_DTYPES.values()))} "
                             "(fp16 needs a loss scaler: fairseq's --amp / --fp16).")
        view = copy.copy(self)
        object.__setattr__(view, "_autocast", dtype)
        return view

    def autocast_context(self, device: torch.device):
        """torch.autocast for :attr:`autocast` (checked: fp32 weights, a device with native support), or nothing;
        nothing inside an autocast region already open. A generation loop opens one around all its steps
        (``generation.continue_ids``): autocast casts each fp32 weight once per region, so the weights are
        cast once per generation, not at every step (2.1 ms of a 7 ms ``lex_lm_tiny`` step at 16k otherwise).

        Raises:
            ValueError: as :func:`~.autocast.check_autocast` (when called outside an open region)."""
        if self._autocast is None or torch.is_autocast_enabled(device.type):
            return contextlib.nullcontext()  # (nested: extract_features inside forward)
        check_autocast(device, self._autocast, self.embed_tokens.weight.dtype)
        return autocast(device, self._autocast)

    def output_layer(self, features: Tensor) -> Tensor:
        """(B, T, C) -> (B, T, V) logits."""
        return self.output_projection(features)

    def max_positions(self) -> int:
        """The scheme's limit (the learned table size); otherwise unbounded, not the training length:
        every other scheme takes any length (see ``UNBOUNDED_POSITIONS``)."""
        return self.positions[0].max_positions or UNBOUNDED_POSITIONS


def _place_after_blocks(x: Tensor, padding_mask: Tensor, first: int, block: int, vector: Tensor, scale: float):
    """x (B, T, C) of tokens first .. first + T - 1 with ``scale * vector`` (C,) placed after each token t with
    (t + 1) % block == 0 (a landmark closes its block in the call that completes it). Returns the (B, T', C) positions,
    their (B, T') padding (a landmark is padding where the token before it is) and the (T,) int64 indices of the
    tokens among them, T' = T + the landmarks placed."""
    length = x.size(1)
    t = torch.arange(first, first + length, device=x.device)
    at = t - first + (t // block - first // block)  # each token's index among the new positions
    closes = (t + 1) % block == 0
    total = length + int(closes.sum())
    out = (scale * vector).to(x.dtype).expand(x.size(0), total, -1).clone()
    out[:, at] = x
    padding = padding_mask.new_zeros(x.size(0), total)
    padding[:, at] = padding_mask
    padding[:, at[closes] + 1] = padding_mask[:, closes]
    return out, padding, at


def is_right_padded(key_padding_mask: Tensor) -> bool:
    """True when every (B, L) row is [real ..., real, pad ..., pad]: causality alone then hides the pads."""
    m = key_padding_mask.to(torch.int8)
    return bool((m[:, 1:] >= m[:, :-1]).all())


def symbols_digest(symbols: Sequence[str]) -> Tensor:
    """MD5 of a vocabulary's symbols in id order (joined by newlines), as a (16,) uint8 tensor: which
    vocabulary a model's token ids index (fairseq's ``Dictionary.symbols``, the export's ``dict.txt``)."""
    md5 = hashlib.md5("\n".join(symbols).encode("utf-8")).digest()
    return torch.tensor(list(md5), dtype=torch.uint8)
