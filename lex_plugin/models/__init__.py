"""Registered fairseq models of the plugin (fairseq also imports every module here by itself)."""

from .lex_decoder import UNBOUNDED_POSITIONS, LexDecoder
from .lex_lm import LexLanguageModel, LexLanguageModelConfig

__all__ = ["LexDecoder", "LexLanguageModel", "LexLanguageModelConfig", "UNBOUNDED_POSITIONS"]
