"""RULER-lite: RULER's synthetic retrieval, tracing and aggregation tasks (:mod:`.tasks`) for small language
models, scored by greedy exact match and by candidate log-probability, with RULER's effective length
(:mod:`.probe`): ``lex ruler``, ``lex ruler-data``."""

from .probe import (AVERAGE_AT, RulerResult, answer_query, check_threshold, effective_length, finetune_samples,
                    format_ruler, plot_ruler, ruler_accuracy, sentence_stops)
from .tasks import DEPTHLESS, TASKS, Query, RulerSample, make_sample

__all__ = ["AVERAGE_AT", "DEPTHLESS", "Query", "RulerResult", "RulerSample", "TASKS", "answer_query", "check_threshold",
           "effective_length", "finetune_samples", "format_ruler", "make_sample", "plot_ruler", "ruler_accuracy",
           "sentence_stops"]
