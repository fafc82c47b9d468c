"""Fine-tuning data-bins in a probe's format (``lex passkey-data``, ``lex ruler-data``) and the answer-only loss.

A probe's fine-tuning row is a prompt followed by its answer. ``write_rows`` binarizes the rows as fairseq's
mmap dataset ``PREFIX.bin`` / ``PREFIX.idx`` (one sentence per row, end-of-sentence appended: fairseq's
``--sample-break-mode eos`` then gives one training sample per row) and records each row's answer length in
``PREFIX.answers.npy``.

With ``--answer-only-loss`` the ``lex_language_modeling`` task wraps such a split in
:class:`~lex_plugin.data.answer_loss.AnswerOnlyLossDataset`: the targets of the prompt become padding, which
fairseq's cross-entropy skips, so the loss (and its gradient) is the answer's tokens and the final end-of-sentence
only. The prompt's tokens
(a haystack of up to l tokens around an answer of 5-30) then no longer dilute the signal the probe asks about;
instruction tuning masks prompts the same way.
"""

from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

ANSWERS_SUFFIX = ".answers.npy"

__all__ = ["ANSWERS_SUFFIX", "FinetuneRow", "load_answer_lengths", "write_rows"]


class FinetuneRow(NamedTuple):
    """One fine-tuning row: ``tokens`` (n,) int64, a prompt followed by its answer (no end-of-sentence), and
    ``answer`` the number of answer tokens at its end (1 <= answer <= n)."""

    tokens: Tensor
    answer: int


def write_rows(rows: Sequence[FinetuneRow], prefix, eos: int, vocab_size: int) -> None:
    """Binarize ``rows`` as ``PREFIX.bin`` / ``PREFIX.idx`` (end-of-sentence appended to each) and their answer
    lengths as ``PREFIX.answers.npy`` (int32, one per row).

    Args:
        rows: the rows, each with 1 <= answer <= its token count.
        prefix: path without suffix, e.g. ``DEST/train``.
        eos: the dictionary's end-of-sentence id.
        vocab_size: the dictionary's size (picks the on-disk integer width).

    Raises:
        ValueError: a row whose answer length is not within its tokens.
    """
    from fairseq.data import indexed_dataset

    bad = [i for i, r in enumerate(rows) if not 1 <= r.answer <= r.tokens.numel()]
    if bad:
        raise ValueError(f"rows {bad[:5]} have answer lengths outside their tokens.")
    builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=vocab_size)
    for row in rows:
        builder.add_item(torch.cat([row.tokens, row.tokens.new_tensor([eos])]).int())
    builder.finalize(f"{prefix}.idx")
    np.save(f"{prefix}{ANSWERS_SUFFIX}", np.array([r.answer for r in rows], dtype=np.int32))


def load_answer_lengths(prefix) -> np.ndarray:
    """The answer lengths ``write_rows`` recorded for the split ``PREFIX`` ((rows,) int32).

    Raises:
        FileNotFoundError: no ``PREFIX.answers.npy`` (a data-bin not written by ``lex passkey-data`` /
            ``lex ruler-data``), with what to do instead.
    """
    path = Path(f"{prefix}{ANSWERS_SUFFIX}")
    if not path.is_file():
        raise FileNotFoundError(f"--answer-only-loss needs {path}, the answer length of every row; write the data-bin "
                                "with lex passkey-data or lex ruler-data, or train without --answer-only-loss.")
    return np.load(path)
