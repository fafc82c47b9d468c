"""One decoder block in TorchScale's layout: self-attention and FFN, each with a residual."""

import math
from typing import Optional

from torch import Tensor, nn

from .attention.executor import Observer
from .attention.self_attention import NOPE, IncrementalState, LexSelfAttention
from .attention.spec import FULL_SPEC, AttentionSpec
from .attention.temperature import TemperatureTuning
from .drop_path import DropPath
from .feedforward import FeedForwardNetwork
from .positions.scheme import PositionScheme

__all__ = ["LexDecoderLayer"]


def _ssmax_length(config):
    """l for SSMax's initial s = 1 / log(l) when ``config.ssmax`` (the recorded ``tokens_per_sample``), else None.

    Raises:
        ValueError: --ssmax without a training length.
    """
    if not getattr(config, "ssmax", False):
        return None
    if not getattr(config, "tokens_per_sample", None):
        raise ValueError("--ssmax starts each head's s at 1 / log(l): it needs the training length (--tokens-per-sample).")
    return int(config.tokens_per_sample)


def _temperature_tuning(config) -> Optional[TemperatureTuning]:
    """Llama 4's temperature tuning when ``config.temperature_tuning_beta`` is set: F is
    ``config.temperature_tuning_floor`` or else the recorded training length.

    Raises:
        ValueError: a floor without a beta; neither a floor nor a training length; a bad beta or floor.
    """
    beta, floor = getattr(config, "temperature_tuning_beta", None), getattr(config, "temperature_tuning_floor", None)
    if not beta:  # None or 0: off
        if floor is not None:
            raise ValueError(f"--temperature-tuning-floor {floor} belongs to Llama 4's temperature tuning: give "
                             "--temperature-tuning-beta (0.1 in Llama 4) too, or leave the floor out.")
        return None
    floor = floor if floor is not None else getattr(config, "tokens_per_sample", None)
    if floor is None:
        raise ValueError("--temperature-tuning-beta scales queries past F = l positions: give --tokens-per-sample or "
                         "--temperature-tuning-floor.")
    return TemperatureTuning(float(beta), int(floor))


class LexDecoderLayer(nn.Module):
    """TorchScale's ``DecoderLayer`` (decoder-only, dense FFN) with :class:`LexSelfAttention`.

    Pre-LN when ``config.decoder_normalize_before`` (also forced by ``subln``), post-LN with the DeepNet
    residual scale alpha = (2 N) ** 0.25 when ``config.deepnorm`` (Wang et al. 2022).

    Args:
        config: TorchScale ``DecoderConfig``, or any object with its fields (the Hugging Face export's namespace).
        depth: index of this layer (drop-path rate grows linearly with depth, as in TorchScale).
        global_attention: False for a local layer of a layer pattern (``--layer-pattern``): Llama 4's temperature
            tuning then leaves it alone (its queries never see past their window).

    State-dict names: ``self_attn.*``, ``self_attn_layer_norm``, ``ffn.fc1``, ``ffn.fc2``,
    ``ffn.ffn_layernorm`` (subln), ``final_layer_norm``, exactly TorchScale's.
    """

    def __init__(self, config, depth: int, global_attention: bool = True):
        super().__init__()
        dim = config.decoder_embed_dim
        self.embed_dim = dim
        self.dropout_module = nn.Dropout(config.dropout)
        rate = config.drop_path_rate * depth / max(config.decoder_layers - 1, 1)
        tuning = _temperature_tuning(config)  # (checked in every layer, used in the global ones)
        self.drop_path = DropPath(rate) if config.drop_path_rate > 0 else None
        self.self_attn = LexSelfAttention(
            dim,
            config.decoder_attention_heads,
            dropout=config.attention_dropout,
            subln=config.subln,
            layernorm_eps=config.layernorm_eps,
            qk_norm=bool(getattr(config, "qk_norm", False)),
            ssmax_length=_ssmax_length(config),
            temperature_tuning=tuning if global_attention else None,
            learned_sinks=bool(getattr(config, "learned_sinks", False)),
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
