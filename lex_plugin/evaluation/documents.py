"""Scoring raw documents (``lex score``, ``LexHubInterface.score_document``): no data-bin for the text.

A document is encoded exactly as ``lex prepare`` encodes a corpus (paragraphs, Moses, the data-bin's
SentencePiece model, ``</s>`` after each paragraph) and scored whole: source ``</s>`` + tokens[:-1],
target tokens, as the first sample of a stream in :mod:`.length_eval`. It runs block by block through
the key/value cache (:func:`~.length_eval.blockwise_forward`), so under BCA or a sliding window memory
stays flat however long the document is, and nothing is truncated: a document longer than the model's
positions (learned absolute embeddings) is refused.

Losses are reported in bits per token (ppl = 2 ** loss), overall and per position bucket with edges at
multiples of the training length l ([0, l), [l, 2l), [2l, 4l), ...: :func:`~.length_eval.bucket_edges`).
"""

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.text import paragraphs
from ..modules.attention.spec import AttentionSpec
from .length_eval import Bucket, _Scored, blockwise_forward, bucket_edges, bucket_table

__all__ = ["DocumentScore", "encode_document", "document_nll", "score_tokens", "format_scores"]

FULL_BLOCK = 1024  # positions per forward under full attention (the cache holds all earlier ones)


@dataclass
class DocumentScore(_Scored):
    """Scores of one document: ``loss`` in bits per token over all ``tokens``, and per bucket."""

    name: str
    window: str
    tokens: int = 0
    nll: float = 0.0
    buckets: List[Bucket] = field(default_factory=list)
    key_tokens: Optional[int] = None  # LongPPL's key tokens (None: not asked for)
    key_nll: float = 0.0

    def to_dict(self) -> dict:
        """JSON-ready fields, with loss and ppl for the document and each bucket (and LongPPL when asked for)."""
        out = {
            "name": self.name, "window": self.window, "tokens": self.tokens, "loss": self.loss, "ppl": self.ppl,
            "buckets": [dict(start=b.start, end=b.end, tokens=b.tokens, loss=b.loss, ppl=b.ppl) for b in self.buckets],
        }
        if self.key_tokens is not None:
            out.update(key_tokens=self.key_tokens, longppl=self.longppl)
        return out


def encode_document(hub, text: str) -> Tensor:
    """(T,) int64 ids of ``text`` as ``lex prepare`` writes a document: each non-empty paragraph
    (blank-line separated) tokenized, BPE-encoded and followed by ``</s>``.

    Raises:
        ValueError: the text has no paragraph with a token.
    """
    pieces = []
    for paragraph in paragraphs(text):
        tokenized = hub.tokenize(paragraph)
        if tokenized.strip():
            pieces.append(hub.binarize(hub.apply_bpe(tokenized)).long())
    if not pieces:
        raise ValueError("the document holds no text to score.")
    return torch.cat(pieces)


@torch.no_grad()
def document_nll(model, tokens: Tensor, spec: AttentionSpec, eos: int, name: str = "") -> Tensor:
    """(T,) float64 loss in nats of every token of a document (T,) under ``spec``, the whole document as
    context: fed in blocks (the window's stride, or ``FULL_BLOCK`` under full attention) through the
    key/value cache, so the logits of one block at a time exist, never T x V.

    Raises:
        ValueError: T exceeds ``model.max_positions()`` (say which model and how long), or T = 0.
    """
    length = tokens.numel()
    if length == 0:
        raise ValueError(f"document {name!r} is empty.")
    if length > model.max_positions():
        raise ValueError(
            f"document {name!r} has {length:,} tokens, more than this model's max_positions() = {model.max_positions():,} "
            "(learned absolute positions end there); it would have to be truncated. Score a shorter text or a model "
            "with relative positions."
        )
    device = next(model.parameters()).device
    target = tokens.to(device)[None]
    source = torch.cat([target.new_full((1, 1), eos), target[:, :-1]], dim=1)
    block = spec.window.feed_block or FULL_BLOCK
    return torch.cat([
        F.cross_entropy(out[0].float(), target[0, a:b], reduction="none").double()
        for a, b, out in blockwise_forward(model, source, block, spec=spec)
    ])


def score_tokens(
    model,
    tokens: Tensor,
    spec: AttentionSpec,
    eos: int,
    name: str = "",
    training_length: Optional[int] = None,
    key_tokens: Optional[Tensor] = None,
) -> DocumentScore:
    """Score a whole document of ``tokens`` (T,) with ``model`` under ``spec`` (:func:`document_nll`).

    Args:
        key_tokens: (T,) bool, LongPPL's key tokens of the document (:func:`.longppl.document_key_tokens`):
            the score also sums the loss over them (``key_tokens``, ``key_nll``, ``longppl``).

    Returns:
        A :class:`DocumentScore` with T scored tokens and buckets at multiples of ``training_length``.

    Raises:
        ValueError: as :func:`document_nll`; key tokens of another length.
    """
    nll = document_nll(model, tokens, spec, eos, name)
    length = tokens.numel()
    edges = bucket_edges(length, training_length)
    buckets = [Bucket(a, b, b - a, float(nll[a:b].sum())) for a, b in zip(edges[:-1], edges[1:])]
    score = DocumentScore(name, str(spec), length, float(nll.sum()), buckets)
    if key_tokens is not None:
        if key_tokens.shape != tokens.shape:
            raise ValueError(f"key_tokens must mark the document's {length} tokens, got shape {tuple(key_tokens.shape)}.")
        key = key_tokens.to(nll.device)
        score.key_tokens, score.key_nll = int(key.sum()), float(nll[key].sum())
    return score


def format_scores(scores: Sequence[DocumentScore], training_length: Optional[int] = None) -> str:
    """Markdown tables: one row per document (tokens, loss in bits, ppl; key tokens and LongPPL when scored),
    then the loss per position
    bucket of each document (rows only where a document reaches past l)."""
    longppl = any(s.key_tokens is not None for s in scores)
    lines = ["| document | window | tokens | x l | loss (bits) | ppl |" + (" key tokens | LongPPL |" if longppl else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if longppl else "")]
    for s in scores:
        ratio = f"{s.tokens / training_length:.3g}" if training_length else "-"
        line = f"| {s.name} | {s.window} | {s.tokens:,} | {ratio} | {s.loss:.4f} | {s.ppl:.2f} |"
        if longppl:
            line += f" {s.key_tokens or 0:,} | {'-' if s.longppl is None else f'{s.longppl:.2f}'} |"
        lines.append(line)
    return "\n".join(lines + bucket_table(("document", "window"), [((s.name, s.window), s.buckets) for s in scores]))
