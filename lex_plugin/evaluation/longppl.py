"""LongPPL: perplexity over the tokens whose prediction needs the long context.

Fang et al., "What is Wrong with Perplexity for Long-context Language Modeling?" (ICLR 2025, arXiv
2410.23771), section 3. A flat perplexity curve says little about the far context: BCA is flat because it
never reads past l. LongPPL averages only over *key tokens*, found by an evaluator model that predicts
them much better with the long context than with a short one.

Notation (one sample, as :mod:`.length_eval` cuts the stream):

* ``seq``: the sample's first source token then its L targets, (L + 1,); target p is ``seq[p + 1]``.
* ``long[p]``: the evaluator's loss (nats) of target p given all of ``seq[: p + 1]``.
* ``short[p]``: its loss given a truncated context, sliding as the authors' package does (``longppl``
  0.3, ``find_key_token``): with K = ``trunc_len`` and S = ``sliding_window``, ``seq[j]`` (j >= K) is read
  from ``seq[c : j]``, c = S * floor((j - K) / S), a context of K .. K + S - 1 tokens; targets with
  j < K have no short context and are never key tokens.
* key token: ``short[p] - long[p] > alpha`` (the long-short difference, LSD) and ``long[p] < beta``
  (the long-context likelihood LCL = -long[p] > -beta; the package's ``beta = -2`` is this rule's -beta).

LongPPL of a model = exp(mean of its loss over the key tokens): the units of ppl (2 ** bits = e ** nats).

Defaults: alpha = beta = 2 nats as the paper; K = 3l/4 and S = l/4, so every short window holds at
most l tokens (K + S = l) and the evaluator never reads past its training length there (the paper's
K = 4096, S = 1024 were far inside its models' windows).
"""

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..modules.attention.spec import FULL_SPEC, AttentionSpec
from .length_eval import _batches, _pad_batch, _token_nll, document_nll

__all__ = ["KEY_TOKEN_FLAGS", "KeyTokenRule", "key_token_rule", "short_context_nll", "key_token_mask", "find_key_tokens",
           "document_key_tokens",
           "stream_fingerprint", "key_token_entry", "read_key_tokens"]

# the rule's flags, declared once: (KeyTokenRule field, type, help); --longppl-NAME in fairseq-eval-lm and lex score
KEY_TOKEN_FLAGS = (
    ("alpha", float, "--longppl: key tokens gain more than alpha nats from the long context (default 2)"),
    ("beta", float, "--longppl: key tokens have a long-context loss below beta nats (default 2)"),
    ("trunc_len", int, "--longppl: K, the shortest truncated context in tokens (default 3l/4)"),
    ("sliding_window", int, "--longppl: S, targets sharing one truncated context (default l/4)"),
)


@dataclass(frozen=True)
class KeyTokenRule:
    """The key-token rule of LongPPL.

    Attributes:
        alpha: nats; the short-context loss must exceed the long-context loss by more than alpha.
        beta: nats; the long-context loss must be below beta.
        trunc_len: K, the shortest truncated context (tokens); None: 3l/4.
        sliding_window: S, targets sharing one truncated context; None: l/4.

    Raises:
        ValueError (:meth:`resolve`): beta <= 0, K or S < 1, or no training length to take defaults from.
    """

    alpha: float = 2.0
    beta: float = 2.0
    trunc_len: Optional[int] = None
    sliding_window: Optional[int] = None

    def resolve(self, training_length: Optional[int]) -> "KeyTokenRule":
        """The rule with K and S filled from the training length l (3l/4 and l/4), checked."""
        l = training_length
        if (self.trunc_len is None or self.sliding_window is None) and not l:
            raise ValueError("LongPPL's truncated context defaults to 3l/4 (sliding by l/4) and the evaluator records no "
                             "training length: pass --longppl-trunc-len and --longppl-sliding-window.")
        k = self.trunc_len if self.trunc_len is not None else max(1, 3 * l // 4)
        s = self.sliding_window if self.sliding_window is not None else max(1, l // 4)
        if k < 1 or s < 1:
            raise ValueError(f"--longppl-trunc-len and --longppl-sliding-window must be >= 1, got {k} and {s}.")
        if not self.beta > 0:
            raise ValueError(f"--longppl-beta bounds a loss in nats (key tokens have long-context loss < beta); "
                             f"it must be > 0, got {self.beta}.")
        return replace(self, trunc_len=int(k), sliding_window=int(s))

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {"alpha": self.alpha, "beta": self.beta, "trunc_len": self.trunc_len, "sliding_window": self.sliding_window}


def key_token_rule(longppl: bool, key_token_model=None, **flags) -> Optional[KeyTokenRule]:
    """The rule of the ``--longppl`` flags (``flags``: ``longppl_alpha`` ... as :data:`KEY_TOKEN_FLAGS` names them,
    None where not given), None without ``--longppl``.

    Raises:
        ValueError: a ``--longppl-*`` flag or ``--key-token-model`` given without ``--longppl``.
    """
    given = {name: flags.get(f"longppl_{name}") for name, _, _ in KEY_TOKEN_FLAGS}
    given = {name: value for name, value in given.items() if value is not None}
    if not longppl:
        stray = [f"--longppl-{n.replace('_', '-')}" for n in given] + (["--key-token-model"] if key_token_model else [])
        if stray:
            raise ValueError(f"{', '.join(stray)} set(s) LongPPL's key tokens; add --longppl.")
        return None
    return KeyTokenRule(**given)


@torch.no_grad()
def short_context_nll(model, seq: Tensor, spec: AttentionSpec, rule: KeyTokenRule, pad: int,
                      max_tokens: int = 32768) -> Tensor:
    """Loss of every target of ``seq`` given its truncated context (see the module notation).

    Args:
        model: the evaluator, a lex_lm model in eval mode.
        seq: (n,) int64, the first source token then the targets.
        spec: the evaluator's attention (full, as a rule).
        rule: a resolved :class:`KeyTokenRule` (K, S set).
        max_tokens: batch bound: max(1, max_tokens // (K + S)) windows per forward.

    Returns:
        (n - 1,) float64 losses in nats of ``seq[1:]``; NaN for ``seq[1 : K]`` (no short context).
    """
    k, s = rule.trunc_len, rule.sliding_window
    n = seq.numel()
    out = torch.full((n - 1,), math.nan, dtype=torch.float64, device=seq.device)
    windows = [(c, min(c + k + s, n)) for c in range(0, n - k, s)]
    for batch in _batches(windows, max(1, max_tokens // (k + s))):
        width = max(end - c for c, end in batch) - 1
        source = _pad_batch([seq[c : end - 1] for c, end in batch], width, pad)
        target = _pad_batch([seq[c + 1 : end] for c, end in batch], width, pad)
        nll = _token_nll(model, source, target, pad, spec).double()
        for row, (c, end) in enumerate(batch):
            out[c + k - 1 : end - 1] = nll[row, k - 1 : end - c - 1]
    return out


def key_token_mask(long_nll: Tensor, short_nll: Tensor, rule: KeyTokenRule) -> Tensor:
    """(n,) bool: short - long > alpha and long < beta (NaN short: False). Losses in nats, same shape."""
    return (short_nll - long_nll > rule.alpha) & (long_nll < rule.beta)


@torch.no_grad()
def find_key_tokens(model, stream: Tensor, length: int, spec: AttentionSpec, eos: int, pad: int,
                    rule: KeyTokenRule, max_tokens: int = 32768, long_nll: Optional[Tensor] = None) -> Tensor:
    """The key tokens of ``stream`` cut into samples of ``length`` (as :func:`~.length_eval.evaluate_lengths`
    cuts it), found by the evaluator ``model`` under ``spec``.

    Args:
        stream: (T,) int64 token ids; a document is one sample (``length`` >= T).
        rule: a resolved :class:`KeyTokenRule`.
        long_nll: (T,) the evaluator's long-context losses when the caller has them (a document scored
            through the cache); computed here otherwise.

    Returns:
        (T,) bool on ``stream``'s device: True at key tokens.
    """
    device = next(model.parameters()).device
    key = torch.zeros(stream.numel(), dtype=torch.bool)
    for start in range(0, stream.numel(), length):
        target = stream[start : start + length].to(device)
        first = stream.new_tensor([eos]) if start == 0 else stream[start - 1 : start]
        seq = torch.cat([first.to(device), target])
        if long_nll is None:
            long = _token_nll(model, seq[None, :-1], target[None], pad, spec)[0].double()
        else:
            long = long_nll[start : start + target.numel()].to(device).double()
        short = short_context_nll(model, seq, spec, rule, pad, max_tokens)
        key[start : start + target.numel()] = key_token_mask(long, short, rule).cpu()
    return key.to(stream.device)


def document_key_tokens(model, tokens: Tensor, eos: int, pad: int, rule: KeyTokenRule, max_tokens: int = 32768) -> Tensor:
    """The key tokens of one document (T,) (the whole document is the long context, read through the
    key/value cache as :func:`~.length_eval.document_nll` reads it), found by the evaluator ``model`` under full
    attention; the first source token is ``</s>``, as :func:`~.documents.score_tokens` scores it.

    Returns:
        (T,) bool on ``tokens``' device.
    """
    long = document_nll(model, tokens, FULL_SPEC, eos)
    return find_key_tokens(model, tokens, tokens.numel(), FULL_SPEC, eos, pad, rule, max_tokens, long_nll=long)


def stream_fingerprint(stream: Tensor) -> str:
    """sha256 (hex) of the (T,) token ids as int64: which split, dictionary and ``--eval-tokens`` a key-token mask
    belongs to."""
    return hashlib.sha256(stream.to(torch.int64).cpu().numpy().tobytes()).hexdigest()


def key_token_entry(key: Tensor, stream: Tensor, evaluator: str, length: int, rule: KeyTokenRule) -> dict:
    """The report's ``longppl`` entry of a key-token mask (T,) bool found on ``stream`` (T,) by ``evaluator`` (a
    name) on samples of ``length`` under ``rule``: the rule, the count, the positions in the stream and the stream's
    fingerprint, so that another run can score on the same tokens (:func:`read_key_tokens`)."""
    return {"evaluator": evaluator, "window": "full", "length": int(length), **rule.to_dict(),
            "key_tokens": int(key.sum()), "stream_sha256": stream_fingerprint(stream),
            "positions": key.nonzero().flatten().tolist()}


def read_key_tokens(path: Path, stream: Tensor, length: int) -> Tuple[Tensor, dict]:
    """The key tokens an earlier run found (``fairseq-eval-lm --longppl --report-json PATH``), for scoring another
    model on the same tokens (``--key-tokens PATH``): one common evaluator for every model (Fang et al. score every
    model on one evaluator's key tokens).

    Args:
        path: an eval-lm report whose ``longppl`` entry holds ``positions`` (:func:`key_token_entry`).
        stream: (T,) int64, the split being scored.
        length: the longest ``--eval-lengths`` of this run (key tokens depend on the sample length they were found on).

    Returns:
        ((T,) bool mask on ``stream``'s device, this report's ``longppl`` entry: the source's, with ``from``: path).

    Raises:
        ValueError: no ``longppl`` positions in ``path``, another stream (split, dictionary or ``--eval-tokens``), or
            key tokens found on samples of another length.
    """
    source = json.loads(Path(path).read_text()).get("longppl") or {}
    if "positions" not in source:
        raise ValueError(f"--key-tokens {path}: no LongPPL key-token positions there; give an eval-lm report written "
                         "with --longppl --report-json (this version or later).")
    if source["stream_sha256"] != stream_fingerprint(stream):
        raise ValueError(f"--key-tokens {path} was found on another stream (split, dictionary or --eval-tokens differ: "
                         f"{stream.numel():,} tokens here); score the split and --eval-tokens it was found on.")
    if source["length"] != length:
        raise ValueError(f"--key-tokens {path} holds key tokens found on samples of {source['length']} tokens; this run's "
                         f"longest --eval-lengths is {length}: make them equal.")
    key = torch.zeros(stream.numel(), dtype=torch.bool)
    key[torch.tensor(source["positions"], dtype=torch.long)] = True
    return key.to(stream.device), {**source, "from": str(path)}
