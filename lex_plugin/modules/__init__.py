"""Components of the LeX Transformer (TorchScale's component split): position schemes (xPos and the
baselines), attention with BCA / sliding windows, the decoder layer."""

from .absolute_positions import LearnedPositions, SinusoidalPositions
from .attention import LexSelfAttention
from .decoder_layer import LexDecoderLayer
from .drop_path import DropPath
from .position_bias import ALiBi, DistanceBias, KerpleLog, Sandwich, T5Bias, alibi_slopes
from .windowed_attention import AttentionWindow, windowed_attention
from .xpos import XPos, apply_rotary_scaled, rope_theta, xpos_zeta

__all__ = [
    "ALiBi", "AttentionWindow", "DistanceBias", "DropPath", "KerpleLog", "LearnedPositions", "LexDecoderLayer",
    "LexSelfAttention", "Sandwich", "SinusoidalPositions", "T5Bias", "XPos", "alibi_slopes", "apply_rotary_scaled",
    "rope_theta", "windowed_attention", "xpos_zeta",
]
