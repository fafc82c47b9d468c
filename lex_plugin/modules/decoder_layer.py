"""One decoder block in TorchScale's layout: self-attention and FFN, each with a residual."""

import math
from typing import Optional, Sequence

from torch import Tensor, nn

from .attention.executor import Observer
from .attention.self_attention import NOPE, IncrementalState, LexSelfAttention
from .attention.spec import FULL_SPEC, AttentionSpec
from .designs.registry import LayerDesign
from .drop_path import DropPath
from .feedforward import FeedForwardNetwork
from .positions.scheme import PositionScheme

__all__ = ["LexDecoderLayer"]


class LexDecoderLayer(nn.Module):
    """TorchScale's ``DecoderLayer`` (decoder-only, dense FFN) with :class:`LexSelfAttention`.

    Pre-LN when ``config.decoder_normalize_before`` (also forced by ``subln``), post-LN with the DeepNet
    residual scale alpha = (2 N) ** 0.25 when ``config.deepnorm`` (Wang et al. 2022).

    Args:
        config: TorchScale ``DecoderConfig``, or any object with its fields (the Hugging Face export's namespace).
        depth: index of this layer (drop-path rate grows linearly with depth, as in TorchScale).
        designs: what the model's trained designs do in this layer (``modules.designs``; the decoder leaves out, in a
            local layer of a layer pattern, those that act in global layers only).

    State-dict names: ``self_attn.*``, ``self_attn_layer_norm``, ``ffn.fc1``, ``ffn.fc2``,
    ``ffn.ffn_layernorm`` (subln), ``final_layer_norm``, exactly TorchScale's.
    """

    def __init__(self, config, depth: int, designs: Sequence[LayerDesign] = ()):
        super().__init__()
        dim = config.decoder_embed_dim
        self.embed_dim = dim
        self.dropout_module = nn.Dropout(config.dropout)
        rate = config.drop_path_rate * depth / max(config.decoder_layers - 1, 1)
        self.drop_path = DropPath(rate) if config.drop_path_rate > 0 else None
        self.self_attn = LexSelfAttention(
            dim,
            config.decoder_attention_heads,
            dropout=config.attention_dropout,
            subln=config.subln,
            layernorm_eps=config.layernorm_eps,
            designs=designs,
            depth=depth,
        )
        self.self_attn_layer_norm = nn.LayerNorm(dim, eps=config.layernorm_eps)
        self.ffn = FeedForwardNetwork(
            dim,
            config.decoder_ffn_embed_dim,
            config.activation_fn,
            config.dropout,
            config.activation_dropout,
            config.layernorm_eps,
            config.subln,
        )
        self.final_layer_norm = nn.LayerNorm(dim, eps=config.layernorm_eps)
        self.normalize_before = config.decoder_normalize_before
        self.alpha = math.pow(2.0 * config.decoder_layers, 0.25) if config.deepnorm else 1.0

    def _residual(self, x: Tensor, residual: Tensor) -> Tensor:
        if self.drop_path is not None:
            x = self.drop_path(x)
        return residual * self.alpha + x

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
        """x: (B, T, C) -> (B, T, C); arguments as in :meth:`LexSelfAttention.forward`."""
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x = self.self_attn(x, scheme, key_padding_mask, incremental_state, spec, positions, observer)
        x = self._residual(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self._residual(self.ffn(x), residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x
