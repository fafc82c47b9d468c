"""Components of the LeX Transformer: xPos, attention, decoder layer (TorchScale's component split)."""

from .attention import LexSelfAttention
from .decoder_layer import LexDecoderLayer
from .drop_path import DropPath
from .windowed_attention import AttentionWindow, windowed_attention
from .xpos import XPos, apply_rotary_scaled, rope_theta, xpos_zeta

__all__ = ["AttentionWindow", "windowed_attention", "DropPath", "LexDecoderLayer", "LexSelfAttention", "XPos", "apply_rotary_scaled", "rope_theta", "xpos_zeta"]
