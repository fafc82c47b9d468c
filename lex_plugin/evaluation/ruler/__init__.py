"""RULER-lite: RULER's synthetic retrieval, tracing and aggregation tasks (:mod:`.tasks`) for small language
models, scored by candidate log-probability (:mod:`.probe`): ``lex ruler``, ``lex ruler-data``."""

from .probe import RulerResult, finetune_samples, format_ruler, plot_ruler, ruler_accuracy, sentence_stops
from .tasks import TASKS, Query, RulerSample, make_sample

__all__ = ["Query", "RulerResult", "RulerSample", "TASKS", "finetune_samples", "format_ruler", "make_sample", "plot_ruler",
           "ruler_accuracy", "sentence_stops"]
