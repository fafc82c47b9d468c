"""``LexDecoder``: TorchScale's ``Decoder`` (decoder-only) as a fairseq ``FairseqIncrementalDecoder``."""

import hashlib
import math
from typing import Any, Dict, Optional, Tuple

import torch
from fairseq.models import FairseqIncrementalDecoder
from fairseq.models.transformer import Embedding
from fairseq.modules import LayerNorm
from torch import Tensor, nn
from torchscale.architecture.config import DecoderConfig

from ..modules.absolute_positions import LearnedPositions, SinusoidalPositions
from ..modules.attention import IncrementalState
from ..modules.decoder_layer import LexDecoderLayer
from ..modules.position_bias import ALiBi, KerpleLog, Sandwich, T5Bias
from ..modules.windowed_attention import AttentionWindow, RelativePosition, is_right_padded
from ..modules.xpos import XPos

__all__ = ["LexDecoder", "UNBOUNDED_POSITIONS"]

# xPos has no position table, so the model itself takes any length. fairseq compares sample lengths
# with max_positions() and *silently skips* longer samples in eval-lm; the model must never be what
# caps them, so it reports a bound no corpus reaches.
UNBOUNDED_POSITIONS = 2**30

# --pos-emb: where each scheme acts
ROTARY = ("xpos", "rope")  # rotate q and k inside attention
BIASES = ("alibi", "sandwich", "kerple_log", "t5")  # add f_h(n - m) to the attention logits
ABSOLUTE = ("sinusoidal", "learned")  # add a position vector to the token embeddings
POS_EMB_SCHEMES = ROTARY + BIASES + ABSOLUTE + ("none",)


class LexDecoder(FairseqIncrementalDecoder):
    """Decoder-only LeX Transformer configured by TorchScale's ``DecoderConfig``.

    Tokens are embedded (scaled by sqrt(C) unless ``no_scale_embedding``), plus an absolute position
    vector for ``sinusoidal`` / ``learned``, optionally layer-normed, passed through ``decoder_layers``
    blocks, final LayerNorm (pre-LN models) and the output projection. The position scheme
    (``config.pos_emb``, one of ``POS_EMB_SCHEMES``):

    * ``xpos`` (default, LeX Eq. 12), ``rope``: one shared :class:`XPos` rotates q and k in every layer
      (its tables are built once per forward);
    * ``alibi``, ``sandwich``, ``t5``: one shared bias module (T5's table is shared across layers, as in T5
      and TorchScale); ``kerple_log``: one per layer (KERPLE's r1, r2 are per layer and head);
    * ``sinusoidal``, ``learned``: absolute, added to the embeddings at positions 0, 1, ...;
    * ``none``: NoPE.

    Args:
        config: ``DecoderConfig``; also read: ``pos_emb``, ``xpos_gamma``, ``xpos_scalar_zeta``,
            ``xpos_no_rotation``, ``sandwich_dim``, ``t5_num_buckets``, ``t5_max_distance``,
            ``max_target_positions`` (learned table size), all set by the model builder.
        dictionary: fairseq ``Dictionary`` of the targets.
        embed_tokens: ``nn.Embedding`` (V, C) with ``padding_idx``.

    Raises:
        ValueError: an unknown ``pos_emb``, or ``learned`` without a table size.

    State dict (TorchScale's ``Decoder`` names): ``embed_tokens``, ``embed_positions`` (learned),
    ``layernorm_embedding``, ``layers.N.*`` (see :class:`LexDecoderLayer`), ``position_bias.N.*``
    (KERPLE, T5), ``layer_norm``, ``output_projection``; and ``dictionary_digest`` (16 uint8, the MD5 of
    the dictionary's symbols: a checkpoint names the vocabulary its ids index).
    """

    def __init__(self, config: DecoderConfig, dictionary, embed_tokens: nn.Embedding):
        super().__init__(dictionary)
        self.config = config
        dim = config.decoder_embed_dim
        self.embed_dim = dim
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if config.no_scale_embedding else math.sqrt(dim)
        self.layernorm_embedding = LayerNorm(dim, eps=config.layernorm_eps) if config.layernorm_embedding else None
        self.dropout_module = nn.Dropout(config.dropout)

        self.pos_emb = getattr(config, "pos_emb", "xpos" if config.xpos_rel_pos else "none")
        if self.pos_emb not in POS_EMB_SCHEMES:
            raise ValueError(f"--pos-emb must be one of {', '.join(POS_EMB_SCHEMES)}; got {self.pos_emb!r}.")
        self.xpos = build_rotary(config, self.pos_emb)
        self.position_bias = build_position_bias(config, self.pos_emb)
        self.embed_positions = build_absolute_positions(config, self.pos_emb)
        self.layers = nn.ModuleList(LexDecoderLayer(config, i) for i in range(config.decoder_layers))
        # Which keys each query attends: full causal for training; BCA or a sliding window at inference.
        self.attention_window = AttentionWindow()
        self.num_layers = len(self.layers)
        self.layer_norm = LayerNorm(dim, eps=config.layernorm_eps) if config.decoder_normalize_before else None
        # Which dictionary the token ids mean: saved with the weights, checked when a checkpoint is loaded.
        self.register_buffer("dictionary_digest", dictionary_digest(dictionary))

        if config.share_decoder_input_output_embed:
            self.output_projection = nn.Linear(dim, embed_tokens.num_embeddings, bias=False)
            self.output_projection.weight = embed_tokens.weight
        else:
            self.output_projection = nn.Linear(dim, len(dictionary), bias=False)
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=dim**-0.5)
        self._scale_init(config)

    def _scale_init(self, config: DecoderConfig):
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

    def forward(
        self,
        prev_output_tokens: Tensor,
        incremental_state: Optional[IncrementalState] = None,
        features_only: bool = False,
        src_lengths: Optional[Any] = None,
        **unused,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """Next-token logits.

        Args:
            prev_output_tokens: (B, T) int64 token ids. With ``incremental_state``, only the positions not
                yet cached are run (fairseq's generator passes the whole prefix each step; a prompt may
                be passed at once).
            incremental_state: fairseq's key/value cache, or None for a parallel forward.
            features_only: return the final hidden states (B, T', C) instead of logits (B, T', V).

        Returns:
            (logits or features, {"attn": [None], "inner_states": [(B, T', C), ...]}), T' the new positions.
        """
        x, extra = self.extract_features(prev_output_tokens, incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(
        self, prev_output_tokens: Tensor, incremental_state: Optional[IncrementalState] = None, **unused
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """Final hidden states (B, T', C) of the positions not yet cached, and fairseq's extras.

        Raises:
            ValueError: every position of ``prev_output_tokens`` is already in the cache.
        """
        past = self.layers[0].self_attn.cached_length(incremental_state) if incremental_state is not None else 0
        tokens = prev_output_tokens[:, past:]
        if tokens.size(1) == 0:
            raise ValueError(
                f"LexDecoder got {prev_output_tokens.size(1)} tokens but {past} are already cached: "
                "pass the prefix plus at least one new token."
            )
        padding_mask: Optional[Tensor] = tokens.eq(self.padding_idx)
        if not padding_mask.any() or (incremental_state is None and is_right_padded(padding_mask)):
            padding_mask = None  # causal attention never lets a real token see trailing pads

        x = self.embed_scale * self.embed_tokens(tokens)
        if self.embed_positions is not None:
            x = x + self.embed_positions(past, tokens.size(1), x.device).to(x.dtype)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        inner_states = [x]
        for i, layer in enumerate(self.layers):
            x = layer(x, self.relative_position(i), padding_mask, incremental_state, self.attention_window)
            inner_states.append(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return x, {"attn": [None], "inner_states": inner_states}

    def relative_position(self, layer: int) -> RelativePosition:
        """What layer ``layer``'s attention takes: the shared ``XPos``, its bias module, or None."""
        if self.xpos is not None:
            return self.xpos
        if self.position_bias is not None:
            return self.position_bias[layer if len(self.position_bias) > 1 else 0]
        return None

    def set_attention_window(self, window: AttentionWindow) -> None:
        """Attend with ``window`` from now on (``AttentionWindow.bca(l)``, ``AttentionWindow("sliding", W)``
        or the default ``AttentionWindow()``, full causal)."""
        self.attention_window = window

    def output_layer(self, features: Tensor) -> Tensor:
        """(B, T, C) -> (B, T, V) logits."""
        return self.output_projection(features)

    def max_positions(self) -> int:
        """The learned table size for ``learned``; otherwise unbounded, not the training length: every
        other scheme takes any length (see ``UNBOUNDED_POSITIONS``)."""
        if isinstance(self.embed_positions, LearnedPositions):
            return self.embed_positions.num_positions
        return UNBOUNDED_POSITIONS

    def upgrade_state_dict_named(self, state_dict: Dict[str, Tensor], name: str) -> Dict[str, Tensor]:
        """Accept TorchScale-trained weights: drop the per-layer ``self_attn.xpos.scale`` buffers
        (recomputed here in fp32, never stored) and fairseq's sinusoidal ``_float_tensor``; reject an
        absolute position table unless this model is ``--pos-emb learned``.

        Raises:
            ValueError: a learned position table in the checkpoint of a model without one.
        """
        prefix = f"{name}." if name else ""
        for key in [k for k in state_dict if k.startswith(prefix) and k.endswith("self_attn.xpos.scale")]:
            del state_dict[key]
        # checkpoints from before the digest (and TorchScale's) cannot be checked: take this dictionary's
        state_dict.setdefault(prefix + "dictionary_digest", self.dictionary_digest.clone())
        if isinstance(self.embed_positions, LearnedPositions):
            return state_dict
        learned = [k for k in state_dict if k.startswith(prefix + "embed_positions.") and k.endswith("weight")]
        if learned:
            raise ValueError(
                f"checkpoint has an absolute position table ({learned[0]}) but this model is --pos-emb {self.pos_emb}. "
                "Build it with --pos-emb learned, or train the TorchScale model with --no-token-positional-embeddings."
            )
        for key in [k for k in state_dict if k.startswith(prefix + "embed_positions.")]:
            del state_dict[key]
        return state_dict


def dictionary_digest(dictionary) -> Tensor:
    """MD5 of a fairseq ``Dictionary``'s symbols in order, as a (16,) uint8 tensor."""
    md5 = hashlib.md5("\n".join(dictionary.symbols).encode("utf-8")).digest()
    return torch.tensor(list(md5), dtype=torch.uint8)


def build_rotary(config: DecoderConfig, pos_emb: str) -> Optional[XPos]:
    """The shared ``XPos`` for ``xpos`` / ``rope`` (with the Table 4 ablation flags), else None."""
    if pos_emb not in ROTARY:
        return None
    return XPos(
        config.decoder_embed_dim // config.decoder_attention_heads,
        scale_base=config.xpos_scale_base,
        gamma=getattr(config, "xpos_gamma", 0.4),
        use_scale=pos_emb == "xpos",
        scalar_zeta=getattr(config, "xpos_scalar_zeta", False),
        rotation=not getattr(config, "xpos_no_rotation", False),
    )


def build_position_bias(config: DecoderConfig, pos_emb: str) -> Optional[nn.ModuleList]:
    """The bias modules of ``alibi`` / ``sandwich`` / ``t5`` (one, shared) or ``kerple_log`` (one per layer)."""
    heads = config.decoder_attention_heads
    if pos_emb == "alibi":
        return nn.ModuleList([ALiBi(heads)])
    if pos_emb == "sandwich":
        return nn.ModuleList([Sandwich(heads, getattr(config, "sandwich_dim", 128))])
    if pos_emb == "t5":
        return nn.ModuleList([T5Bias(heads, getattr(config, "t5_num_buckets", 32), getattr(config, "t5_max_distance", 128))])
    if pos_emb == "kerple_log":
        return nn.ModuleList(KerpleLog(heads) for _ in range(config.decoder_layers))
    return None


def build_absolute_positions(config: DecoderConfig, pos_emb: str) -> Optional[nn.Module]:
    """``SinusoidalPositions`` or ``LearnedPositions`` (``max_target_positions`` rows), else None.

    Raises:
        ValueError: ``learned`` without a table size.
    """
    if pos_emb == "sinusoidal":
        return SinusoidalPositions(config.decoder_embed_dim)
    if pos_emb == "learned":
        size = getattr(config, "max_target_positions", None)
        if not size:
            raise ValueError("--pos-emb learned needs a table size: --max-target-positions (or --tokens-per-sample).")
        return LearnedPositions(int(size), config.decoder_embed_dim)
    return None


def build_embedding(dictionary, embed_dim: int) -> nn.Embedding:
    """fairseq's token embedding: N(0, C ** -0.5), padding row zero. Shape (len(dictionary), C)."""
    return Embedding(len(dictionary), embed_dim, dictionary.pad())
