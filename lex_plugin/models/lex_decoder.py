"""``LexDecoder``: TorchScale's ``Decoder`` (decoder-only) as a fairseq ``FairseqIncrementalDecoder``."""

from typing import Any, Callable, Dict, Optional, Tuple

from fairseq.models import FairseqIncrementalDecoder
from fairseq.models.transformer import Embedding
from fairseq.modules import LayerNorm
from torch import Tensor, nn
from torchscale.architecture.config import DecoderConfig

from ..modules.attention.self_attention import IncrementalState
from ..modules.attention.spec import FULL_SPEC, AttentionSpec
from ..modules.decoder import UNBOUNDED_POSITIONS, DecoderStack, is_right_padded, symbols_digest

__all__ = ["LexDecoder", "UNBOUNDED_POSITIONS", "dictionary_digest", "is_right_padded"]


class LexDecoder(DecoderStack, FairseqIncrementalDecoder):
    """Decoder-only LeX Transformer configured by TorchScale's ``DecoderConfig`` (the fairseq-free
    :class:`~lex_plugin.modules.decoder.DecoderStack` as a fairseq incremental decoder).

    Tokens are embedded (scaled by sqrt(C) unless ``no_scale_embedding``), plus an absolute position
    vector for absolute schemes, optionally layer-normed, passed through ``decoder_layers`` blocks, final
    LayerNorm (pre-LN models) and the output projection. The position scheme is ``config.pos_emb``, built
    from the ``--pos-emb`` registry (``modules.positions``): one module shared by every layer, or one per
    layer for schemes with per-layer parameters (KERPLE); each layer's attention gets its scheme.

    How attention runs at inference (window, RoPE scaling: an :class:`AttentionSpec`) is an argument of
    ``forward``; :attr:`spec`, fixed when the decoder is built, is used when none is given (fairseq's own
    generator and scorer call ``forward`` without one). :meth:`under` gives a view of the same weights
    with another default: nothing is ever set on a decoder and restored.

    Args:
        config: ``DecoderConfig``; also read: ``pos_emb`` and its options (see ``lex_lm.build_decoder_config``).
        dictionary: fairseq ``Dictionary`` of the targets.
        embed_tokens: ``nn.Embedding`` (V, C) with ``padding_idx``.
        spec: the default attention spec (full causal attention, as trained).

    Raises:
        ValueError: an unknown ``pos_emb`` or options it cannot take; a spec the scheme cannot take.

    State dict (TorchScale's ``Decoder`` names): ``embed_tokens``, ``layernorm_embedding``, ``layers.N.*``
    (see :class:`LexDecoderLayer`), ``positions.N.*`` (KERPLE, T5, learned), ``layer_norm``,
    ``output_projection``; and ``dictionary_digest`` (16 uint8, the MD5 of the dictionary's symbols: a
    checkpoint names the vocabulary its ids index).
    """

    def __init__(self, config: DecoderConfig, dictionary, embed_tokens: nn.Embedding, spec: AttentionSpec = FULL_SPEC):
        super().__init__(dictionary)
        self.build_stack(config, embed_tokens, len(dictionary), spec, layer_norm=LayerNorm)
        # Which dictionary the token ids mean: saved with the weights, checked when a checkpoint is loaded.
        self.register_buffer("dictionary_digest", dictionary_digest(dictionary))

    def forward(
        self,
        prev_output_tokens: Tensor,
        incremental_state: Optional[IncrementalState] = None,
        features_only: bool = False,
        src_lengths: Optional[Any] = None,
        spec: Optional[AttentionSpec] = None,
        observer: Optional[Callable[[int, Tensor, Tensor, Tensor], None]] = None,
        **unused,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """Next-token logits.

        Args:
            prev_output_tokens: (B, T) int64 token ids. With ``incremental_state``, only the positions not
                yet cached are run (fairseq's generator passes the whole prefix each step; a prompt may
                be passed at once).
            incremental_state: fairseq's key/value cache, or None for a parallel forward.
            features_only: return the final hidden states (B, T', C) instead of logits (B, T', V).
            spec: the attention window and RoPE scaling (default: :attr:`spec`).
            observer: ``observer(layer, logits, distance, visible)`` receives the pre-softmax logits of every
                attention chunk of every layer (``modules.attention.executor.Observer``), or None.

        Returns:
            (logits or features, {"attn": [None], "inner_states": [(B, T', C), ...]}), T' the new positions.

        Raises:
            ValueError: a spec the position scheme cannot take (:meth:`check_spec`).
        """
        removed = sorted(set(unused) & {"window", "rope_scaling"})
        if removed:
            raise TypeError(f"LexDecoder.forward no longer takes {', '.join(removed)}=: pass spec=AttentionSpec(window, "
                            "rope_scaling) (modules.attention.spec).")
        with self.autocast_context(prev_output_tokens.device):
            x, extra = self.extract_features(prev_output_tokens, incremental_state, spec, observer)
            if not features_only:
                x = self.output_layer(x)
        return x, extra

    def extract_features(
        self, prev_output_tokens: Tensor, incremental_state: Optional[IncrementalState] = None,
        spec: Optional[AttentionSpec] = None, observer: Optional[Callable] = None, **unused
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """Final hidden states (B, T', C) of the positions not yet cached, and fairseq's extras.

        Raises:
            ValueError: every position of ``prev_output_tokens`` is already in the cache.
        """
        x, inner_states = self.stack_features(prev_output_tokens, incremental_state, spec, observer)
        return x, {"attn": [None], "inner_states": inner_states}

    def upgrade_state_dict_named(self, state_dict: Dict[str, Tensor], name: str) -> Dict[str, Tensor]:
        """Accept TorchScale-trained weights and earlier lex_lm checkpoints: drop the per-layer
        ``self_attn.xpos.scale`` buffers (recomputed here in fp32, never stored) and fairseq's sinusoidal
        ``_float_tensor``; rename ``position_bias.N`` and a learned ``embed_positions`` table to
        ``positions.N``; reject an absolute position table unless this model is ``--pos-emb learned``.

        Raises:
            ValueError: a learned position table in the checkpoint of a model without one.
        """
        prefix = f"{name}." if name else ""
        for key in [k for k in state_dict if k.startswith(prefix) and k.endswith("self_attn.xpos.scale")]:
            del state_dict[key]
        # checkpoints from before the digest (and TorchScale's) cannot be checked: take this dictionary's
        state_dict.setdefault(prefix + "dictionary_digest", self.dictionary_digest.clone())
        for key in [k for k in state_dict if k.startswith(prefix + "position_bias.")]:
            state_dict[prefix + "positions." + key[len(prefix + "position_bias."):]] = state_dict.pop(key)
        learned = [k for k in state_dict if k.startswith(prefix + "embed_positions.") and k.endswith("weight")]
        if learned and "positions.0.weight" not in self.state_dict():  # this model has no learned table
            raise ValueError(
                f"checkpoint has an absolute position table ({learned[0]}) but this model is --pos-emb {self.pos_emb}. "
                "Build it with --pos-emb learned, or train the TorchScale model with --no-token-positional-embeddings."
            )
        for key in [k for k in state_dict if k.startswith(prefix + "embed_positions.")]:
            value = state_dict.pop(key)
            if key in learned:
                state_dict[prefix + "positions.0.weight"] = value
        return state_dict


def dictionary_digest(dictionary) -> Tensor:
    """MD5 of a fairseq ``Dictionary``'s symbols in order, as a (16,) uint8 tensor."""
    return symbols_digest(dictionary.symbols)


def build_embedding(dictionary, embed_dim: int) -> nn.Embedding:
    """fairseq's token embedding: N(0, C ** -0.5), padding row zero. Shape (len(dictionary), C)."""
    return Embedding(len(dictionary), embed_dim, dictionary.pad())

