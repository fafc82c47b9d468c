"""Corpus preparation (``lex prepare``)."""

from .prepare import PrepareConfig, PrepareError, prepare

__all__ = ["PrepareConfig", "PrepareError", "prepare"]
