"""Attention: the window vocabulary, one planner, one SDPA executor, the key/value cache, and the
self-attention layer that puts them together."""

from .executor import Observer, attend, see_self
from .kv_cache import KeyValueCache
from .planner import Chunk, plan
from .self_attention import LexSelfAttention
from .spec import FULL_SPEC, AttentionOptions, AttentionSpec
from .window import AttentionWindow, window_from_options

__all__ = [
    "AttentionOptions", "AttentionSpec", "AttentionWindow", "Chunk", "FULL_SPEC", "KeyValueCache", "LexSelfAttention", "Observer", "attend", "plan", "see_self",
    "window_from_options",
]
