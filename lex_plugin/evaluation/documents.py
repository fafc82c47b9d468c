"""Scoring raw documents (``lex score``, :func:`score_document` on a hub): no data-bin for the text.

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
from torch import Tensor

from ..data.text import paragraphs
from ..modules.attention.spec import AttentionSpec
from .length_eval import Bucket, _Scored, bucket_edges, bucket_table, document_nll, score_lines
from .longppl import document_key_tokens

__all__ = ["DocumentScore", "encode_document", "score_document", "score_tokens", "format_scores"]


@dataclass
class DocumentScore(_Scored):
    """Scores of one document: ``loss`` in bits per token over all ``tokens``, and per bucket."""

    name: str
    window: str
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


def score_document(hub, text: str, name: str = "document", spec: Optional[AttentionSpec] = None,
                   key_token_rule=None, evaluator=None) -> DocumentScore:
    """Score a raw document with a hub (``lex_plugin.from_pretrained``) under ``spec`` (default the hub's own):
    encoded as ``lex prepare`` encodes a corpus (:func:`encode_document`), run whole through the key/value cache
    (never truncated).

    Args:
        hub: a ``LexHubInterface``.
        key_token_rule: a :class:`~.longppl.KeyTokenRule`: also LongPPL, over the key tokens that ``evaluator``
            (default ``hub``; same dictionary) finds under full attention, the whole document as the long context.

    Returns:
        A :class:`DocumentScore` (tokens, loss in bits, ppl, buckets at multiples of l; key tokens and LongPPL with a
        rule).

    Raises:
        ValueError: no text, more tokens than the model's ``max_positions()``, an evaluator with another dictionary.
    """
    tokens = encode_document(hub, text)
    key = None
    if key_token_rule is not None:
        evaluator = evaluator or hub
        if evaluator.src_dict.symbols != hub.src_dict.symbols:
            raise ValueError("the LongPPL evaluator has another dictionary than the scored model; key tokens are "
                             "the same tokens only with the same data-bin.")
        rule = key_token_rule.resolve(evaluator.training_length or hub.training_length)
        key = document_key_tokens(evaluator.models[0], tokens, hub.src_dict.eos(), hub.src_dict.pad(), rule)
    return score_tokens(hub.models[0], tokens, hub.spec if spec is None else spec, hub.src_dict.eos(), name,
                        hub.training_length, key_tokens=key)


def score_tokens(
    model,
    tokens: Tensor,
    spec: AttentionSpec,
    eos: int,
    name: str = "",
    training_length: Optional[int] = None,
    key_tokens: Optional[Tensor] = None,
) -> DocumentScore:
    """Score a whole document of ``tokens`` (T,) with ``model`` under ``spec`` (:func:`~.length_eval.document_nll`).

    Args:
        key_tokens: (T,) bool, LongPPL's key tokens of the document (:func:`.longppl.document_key_tokens`):
            the score also sums the loss over them (``key_tokens``, ``key_nll``, ``longppl``).

    Returns:
        A :class:`DocumentScore` with T scored tokens and buckets at multiples of ``training_length``.

    Raises:
        ValueError: as :func:`~.length_eval.document_nll`; key tokens of another length.
    """
    nll = document_nll(model, tokens, spec, eos, name)
    length = tokens.numel()
    edges = bucket_edges(length, training_length)
    buckets = [Bucket(a, b, tokens=b - a, nll=float(nll[a:b].sum())) for a, b in zip(edges[:-1], edges[1:])]
    score = DocumentScore(name, str(spec), buckets=buckets, tokens=length, nll=float(nll.sum()))
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
    lines = score_lines(("document", "window", "tokens", "x l"), [
        ((s.name, s.window, f"{s.tokens:,}", f"{s.tokens / training_length:.3g}" if training_length else "-"), s)
        for s in scores])
    return "\n".join(lines + bucket_table(("document", "window"), [((s.name, s.window), s.buckets) for s in scores]))
