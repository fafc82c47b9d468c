"""Analysis of trained models: attention resolution and expectation curves (LeX paper), receptive field
(Chi et al.). The ``lex resolution``, ``lex decay-curve`` and ``lex receptive-field`` commands."""

from .receptive_field import cumulative_gradient, effective_receptive_field, theoretical_receptive_field
from .resolution import attention_resolution, expectation_curve, score_by_distance

__all__ = [
    "attention_resolution", "cumulative_gradient", "effective_receptive_field", "expectation_curve",
    "score_by_distance", "theoretical_receptive_field",
]
