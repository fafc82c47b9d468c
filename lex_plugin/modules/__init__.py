"""Components of the LeX Transformer (TorchScale's component split): position schemes (``positions``),
attention (``attention``: window, planner, executor, cache), the decoder layer."""

from .attention import AttentionSpec, AttentionWindow, LexSelfAttention, window_from_options
from .decoder_layer import LexDecoderLayer
from .drop_path import DropPath
from .positions import POSITION_SCHEMES, PositionScheme, XPos

__all__ = [
    "AttentionSpec", "AttentionWindow", "DropPath", "LexDecoderLayer", "LexSelfAttention", "POSITION_SCHEMES", "PositionScheme", "XPos",
    "window_from_options",
]
