"""The answer-only loss of a probe's fine-tuning split (``--answer-only-loss``; rows of
:mod:`lex_plugin.data.finetune`)."""

from typing import List

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset

__all__ = ["AnswerOnlyLossDataset"]

_WRITE_TOGETHER = "write the split and its answer lengths together (lex passkey-data / lex ruler-data)."


class AnswerOnlyLossDataset(BaseWrapperDataset):
    """A fairseq language-modeling split whose targets outside each row's answer are padding.

    Wraps the ``MonolingualDataset`` of a ``--sample-break-mode eos`` split, sample i being row i: its
    ``target`` (n,) keeps the last ``answers[i] + 1`` ids (the answer and the end-of-sentence) and has ``pad``
    before them; ``source`` is unchanged, so the model still reads the whole prompt. The collated batch's
    ``ntokens`` counts the kept targets, the denominator fairseq's cross-entropy reports the loss over.

    Raises:
        ValueError: at construction, a split whose sample count differs from the answer lengths' (an
            answers file of other rows); at a sample, an answer longer than its row.
    """

    def __init__(self, dataset, answers: np.ndarray, pad: int):
        super().__init__(dataset)
        if len(dataset) != len(answers):
            raise ValueError(f"the split has {len(dataset):,} samples for {len(answers):,} answer lengths: its answers.npy "
                             f"belongs to other rows; {_WRITE_TOGETHER}")
        self.answers = answers
        self.pad = pad

    def __getitem__(self, index):
        item = dict(self.dataset[index])
        target, keep = item["target"], int(self.answers[index]) + 1
        if keep > target.numel():
            raise ValueError(f"row {index} has {target.numel()} targets and an answer of {keep - 1} tokens (with its </s>, "
                             f"more than the row): the answers file was not written with these rows; {_WRITE_TOGETHER}")
        item["target"] = torch.cat([target.new_full((target.numel() - keep,), self.pad), target[-keep:]])
        return item

    def collater(self, samples: List[dict]) -> dict:
        batch = self.dataset.collater(samples)
        if batch:
            batch["ntokens"] = int(batch["target"].ne(self.pad).sum())
        return batch
