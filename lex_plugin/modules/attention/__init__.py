"""Attention: the flags (one declaration), the window vocabulary, the position maps (bounded distances), query
temperatures, one planner, one SDPA executor, the key/value cache, and the self-attention layer that puts them
together."""

from .executor import Observer, attend
from .kernels.ops import see_self
from .flags import ATTENTION_FLAGS, ATTENTION_MODES
from .kv_cache import HeldKeys, KeyValueCache
from .planner import Chunk, dense_query_limit, plan
from .position_map import POSITION_MAPS, PositionMap, position_map_from_options
from .self_attention import LexSelfAttention
from .spec import FULL_SPEC, AttentionOptions, AttentionSpec
from .window import AttentionWindow, window_from_options

__all__ = [
    "ATTENTION_FLAGS", "ATTENTION_MODES", "AttentionOptions", "AttentionSpec", "AttentionWindow", "Chunk", "FULL_SPEC", "HeldKeys", "KeyValueCache", "LexSelfAttention", "Observer", "POSITION_MAPS",
    "PositionMap", "attend", "dense_query_limit", "plan", "position_map_from_options", "see_self", "window_from_options",
]
