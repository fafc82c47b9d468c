"""Registered fairseq tasks of the plugin."""

from .lex_language_modeling import LexLanguageModelingTask

__all__ = ["LexLanguageModelingTask"]
