"""fairseq's cross-entropy at the positions that have a target, the others never projected onto the vocabulary.

A probe's fine-tuning with ``--answer-only-loss`` (:mod:`lex_plugin.data.answer_loss`) keeps the targets of each
row's answer and end-of-sentence, 5-30 of up to l positions; the other targets are padding. fairseq's
``cross_entropy`` still projects every position's hidden state onto the vocabulary (C x V multiply-adds a position,
forward and backward, about a third of ``lex_lm_tiny``'s step) and takes its log-softmax, then drops them.
``answer_cross_entropy`` runs the decoder to its last hidden states (``features_only``), keeps the positions whose
target is not padding, and projects those alone: the same loss, sample size and gradients as ``cross_entropy``
(tested), in less time. The ``lex_language_modeling`` task uses it in place of ``cross_entropy`` under
``--answer-only-loss``; ``--criterion answer_cross_entropy`` selects it for any task.
"""

import contextlib

import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig

__all__ = ["AnswerCrossEntropyCriterion"]


@register_criterion("answer_cross_entropy", dataclass=CrossEntropyCriterionConfig)
class AnswerCrossEntropyCriterion(CrossEntropyCriterion):
    """fairseq's ``cross_entropy`` (the summed negative log-likelihood in nats over the targets that are not padding,
    its sample size and logging; ``reduce_metrics`` inherited), computed at those positions alone.

    Needs a decoder that takes ``features_only=True`` and has ``output_layer`` (every fairseq language model;
    a lex_lm model's bf16 autocast region covers the projection as in its forward)."""

    def forward(self, model, sample, reduce=True):
        if not reduce:  # a loss per position, padding included: fairseq's own shapes
            return super().forward(model, sample, reduce=False)
        features, _ = model(**sample["net_input"], features_only=True)  # (B, T, C)
        target = model.get_targets(sample, None)  # (B, T) int64, padding where there is no target
        kept = target.ne(self.padding_idx)
        decoder = model.decoder
        region = getattr(decoder, "autocast_context", None)  # a lex_lm model's autocast region, as in its forward
        with contextlib.nullcontext() if region is None else region(features.device):
            logits = decoder.output_layer(features[kept])  # (N, V), N the targets kept
        lprobs = F.log_softmax(logits.float(), dim=-1)  # fp32, as fairseq's get_normalized_probs
        loss = F.nll_loss(lprobs, target[kept], reduction="sum")
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {"loss": loss.data, "ntokens": sample["ntokens"], "nsentences": sample["target"].size(0),
                          "sample_size": sample_size}
        return loss, sample_size, logging_output
