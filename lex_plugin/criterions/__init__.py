"""fairseq criterions of lex_plugin (registered on import)."""

from .answer_cross_entropy import AnswerCrossEntropyCriterion

__all__ = ["AnswerCrossEntropyCriterion"]
