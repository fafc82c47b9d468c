"""Length-stratified language-model evaluation: one token stream, cut into each evaluation length.

"We divide the same input into the target length" (LeX paper, section 4.2): the split is read as one
stream of T tokens (fairseq's ``--sample-break-mode none``) and cut into consecutive samples of L tokens.
As in fairseq, the sample starting at s predicts stream[s : s + L] from stream[s - 1 : s + L - 1] (the
first sample starts from ``</s>``), so every token of the split is scored exactly once at every L.

Also measured:

* loss per position bucket inside samples, with edges at multiples of the training length l
  ([0, l), [l, 2l), [2l, 4l), ...): how a model does on positions it never saw in training;
* the fixed-target protocol of Chi et al. (receptive-field paper, section 3.4): the same final K tokens
  of N windows scored with contexts of every evaluation length, so only the context changes.

Losses are summed in nats in fp32/fp64 and reported in bits (fairseq's "Loss (base 2)") with
perplexity 2 ** loss.
"""

import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from ..modules.attention.spec import AttentionSpec

__all__ = ["FULL_BLOCK", "LengthResult", "blockwise_forward", "bucket_edges", "bucket_table", "document_nll",
           "evaluate_lengths", "evaluate_fixed_target", "format_table", "progress_bar", "score_lines"]

FULL_BLOCK = 1024  # positions per forward through the cache under full attention (the cache holds all earlier ones)


@dataclass
class _Scored:
    """``tokens`` scored with summed negative log-likelihood ``nll`` (nats) -> loss in bits, ppl; both keyword-only
    fields of every subclass, after its own."""

    tokens: int = field(default=0, kw_only=True)
    nll: float = field(default=0.0, kw_only=True)

    @property
    def loss(self) -> float:
        """Bits per token: nll / tokens / ln 2 (fairseq's "Loss (base 2)")."""
        return self.nll / max(self.tokens, 1) / math.log(2)

    @property
    def ppl(self) -> float:
        """Perplexity, 2 ** loss."""
        return 2.0 ** self.loss

    @property
    def longppl(self) -> Optional[float]:
        """LongPPL (:mod:`.longppl`): exp of the mean loss over the ``key_tokens`` (summed in ``key_nll``,
        nats); None when none were scored or none were asked for."""
        key_tokens = getattr(self, "key_tokens", None)
        return math.exp(self.key_nll / key_tokens) if key_tokens else None


@dataclass
class Bucket(_Scored):
    """Positions start .. end - 1 inside samples."""

    start: int
    end: int


@dataclass
class LengthResult(_Scored):
    """Scores of one (spec, length) pass. ``loss`` in bits per token, ``ppl`` = 2 ** loss. ``window`` is the
    row's label (``str(spec)``); ``attention`` the spec's structured fields (``AttentionSpec.fields``:
    mode, stride, sinks, rope_scaling, rope_scaling_factor), what tables select on."""

    window: str
    length: int
    protocol: str = "stream"  # or "fixed_target"
    buckets: List[Bucket] = field(default_factory=list)
    attention: dict = field(default_factory=dict)
    key_tokens: Optional[int] = None  # LongPPL's key tokens scored (None: not asked for)
    key_nll: float = 0.0

    def to_dict(self) -> dict:
        """JSON-ready fields, with loss and ppl for the pass and each bucket (and LongPPL when asked for)."""
        out = asdict(self)
        out["loss"], out["ppl"] = self.loss, self.ppl
        if self.key_tokens is None:
            del out["key_tokens"], out["key_nll"]
        else:
            out["longppl"] = self.longppl
        for b, src in zip(out["buckets"], self.buckets):
            b["loss"], b["ppl"] = src.loss, src.ppl
        return out


def progress_bar(total_or_items, desc: str, unit: str, enabled: bool = True) -> tqdm:
    """A tqdm bar on stderr: live on a terminal (and gone when done), in a log file one line at the start, one
    every 30 s and the final one (never silent for minutes, as fairseq's own passes are not); ``enabled=False``
    hides it. ``total_or_items``: a count, or an iterable to wrap."""
    interactive = sys.stderr.isatty()
    items = None if isinstance(total_or_items, int) else total_or_items
    total = total_or_items if items is None else len(items)
    return tqdm(items, total=total, desc=desc, unit=unit, disable=not enabled, leave=not interactive,
                mininterval=0.5 if interactive else 30.0, file=sys.stderr, dynamic_ncols=interactive)


def bucket_edges(length: int, training_length: Optional[int]) -> List[int]:
    """[0, l, 2l, 4l, ..., length] (l = training length); [0, length] when l is unknown or >= length."""
    edges = [0]
    if training_length:
        edge = training_length
        while edge < length:
            edges.append(edge)
            edge *= 2
    edges.append(length)
    return edges


def _samples(stream: Tensor, length: int, eos: int) -> Iterator[Tuple[int, Tensor, Tensor]]:
    """(start, source, target) for consecutive samples of ``length`` tokens (the last may be shorter)."""
    for start in range(0, stream.numel(), length):
        target = stream[start : start + length]
        if start == 0:
            source = torch.cat([stream.new_tensor([eos]), stream[: target.numel() - 1]])
        else:
            source = stream[start - 1 : start - 1 + target.numel()]
        yield start, source, target


def _batches(items, batch_size: int):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def blockwise_forward(model, tokens: Tensor, block: int, incremental_state: Optional[dict] = None, start: int = 0,
                      **kwargs):
    """Run ``tokens`` (B, L) through ``model`` ``block`` positions at a time with a key/value cache: the
    recurrent reuse of LeX Figure 3. Under BCA or a sliding window the cache is bounded, so memory does not
    grow with L; the outputs equal those of one parallel forward. ``start``: the positions ``incremental_state``
    already holds (the first chunk begins there).

    Yields:
        (start, end, output) per chunk: ``output`` is the model's first return value for positions
        start .. end - 1 (logits (B, end - start, V), or features with ``features_only=True``).
    """
    state = {} if incremental_state is None else incremental_state
    length = tokens.size(1)
    for start in range(start, length, block):
        end = min(start + block, length)
        out, _ = model(tokens[:, :end], incremental_state=state, **kwargs)
        yield start, end, out


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


@torch.no_grad()
def _token_nll(model, source: Tensor, target: Tensor, pad: int, spec: AttentionSpec) -> Tensor:
    """(B, L) per-token negative log-likelihood in nats (fp32), 0 at padding. Under BCA or a sliding
    window, computed block by block through :func:`blockwise_forward` (``window.feed_block`` positions a call; memory
    flat in L, logits included); under full attention in one parallel forward."""
    nll = lambda logits, tgt: F.cross_entropy(logits.float().transpose(1, 2), tgt, ignore_index=pad, reduction="none")  # noqa: E731
    window = spec.window
    if not window.bounded or window.stride >= source.size(1):
        return nll(model(source, spec=spec)[0], target)
    chunks = blockwise_forward(model, source, window.feed_block, spec=spec)
    return torch.cat([nll(out, target[:, a:b]) for a, b, out in chunks], dim=1)


def _pad_batch(rows: Sequence[Tensor], length: int, pad: int) -> Tensor:
    out = rows[0].new_full((len(rows), length), pad)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row
    return out


def evaluate_lengths(
    model,
    stream: Tensor,
    lengths: Sequence[int],
    spec: AttentionSpec,
    eos: int,
    pad: int,
    max_tokens: int = 32768,
    training_length: Optional[int] = None,
    device: Optional[torch.device] = None,
    progress: bool = True,
    key_tokens: Optional[Tensor] = None,
) -> List[LengthResult]:
    """Score ``stream`` (1-D int64, the whole split) cut into each of ``lengths``.

    Args:
        model: a lex_lm model in eval mode.
        stream: (T,) token ids.
        lengths: evaluation lengths L (tokens per sample).
        spec: the attention window and RoPE scaling (its name labels the report, e.g. ``bca(128)``); BCA and
            sliding windows run samples block by block through the bounded key/value cache (memory flat in L).
        max_tokens: batch size bound: max(1, max_tokens // L) samples per forward.
        training_length: l, for the position buckets.
        key_tokens: (T,) bool, LongPPL's key tokens of the stream (:func:`.longppl.find_key_tokens`): each
            result also sums the loss over them (``key_tokens``, ``key_nll``, ``longppl``).
        progress: a progress bar per length (on stderr, every 30 s when it is not a terminal).

    Returns:
        One ``LengthResult`` per length; ``tokens`` == T for every length.
    """
    if key_tokens is not None and key_tokens.shape != stream.shape:
        raise ValueError(f"key_tokens must mark the stream's {stream.numel()} tokens, got shape {tuple(key_tokens.shape)}.")
    device = device or next(model.parameters()).device
    results = []
    for length in lengths:
        edges = bucket_edges(length, training_length)
        result = LengthResult(str(spec), length, buckets=[Bucket(a, b) for a, b in zip(edges[:-1], edges[1:])],
                              attention=spec.fields(), key_tokens=None if key_tokens is None else 0)
        batch_size = max(1, max_tokens // length)
        total = -(-stream.numel() // length)
        bar = progress_bar(total, f"{spec} L={length}", "sample", progress)
        for batch in _batches(_samples(stream, length, eos), batch_size):
            source = _pad_batch([s for _, s, _ in batch], length, pad).to(device)
            target = _pad_batch([t for _, _, t in batch], length, pad).to(device)
            nll = _token_nll(model, source, target, pad, spec).double()
            real = target.ne(pad)
            result.tokens += int(real.sum())
            result.nll += float(nll.sum())
            for b in result.buckets:
                result_slice = slice(b.start, b.end)
                b.tokens += int(real[:, result_slice].sum())
                b.nll += float(nll[:, result_slice].sum())
            if key_tokens is not None:
                key = _pad_batch([key_tokens[s : s + t.numel()] for s, _, t in batch], length, False).to(device)
                result.key_tokens += int(key.sum())
                result.key_nll += float(nll[key].sum())
            bar.update(len(batch))
        bar.close()
        results.append(result)
    return results


def evaluate_fixed_target(
    model,
    stream: Tensor,
    lengths: Sequence[int],
    spec: AttentionSpec,
    pad: int,
    target_tokens: int,
    max_samples: int = 64,
    max_tokens: int = 32768,
    device: Optional[torch.device] = None,
    progress: bool = True,
    longest: Optional[int] = None,
) -> List[LengthResult]:
    """Chi et al. section 3.4: the last ``target_tokens`` tokens of up to ``max_samples`` samples (stretches of
    the stream), each scored with a context of every length L (the sample's final L tokens), so only the
    context grows.

    Sample ends are spread evenly over the stream, after max(lengths) tokens so that every length has its
    full context (``longest``: place them as for that length instead, so that calls for single lengths score
    the same samples). ``spec`` as in :func:`evaluate_lengths`. Raises ValueError if the stream is
    shorter than the longest length + target_tokens or if target_tokens exceeds the smallest length.
    """
    longest = max([*lengths, longest or 0])
    if target_tokens > min(lengths):
        raise ValueError(f"--fixed-target-tokens {target_tokens} exceeds the smallest --eval-lengths {min(lengths)}.")
    if stream.numel() < longest + target_tokens + 1:
        raise ValueError(
            f"the split has {stream.numel()} tokens: too few for the fixed-target protocol at L={longest}."
        )
    first, last = longest + 1, stream.numel()
    n = min(max_samples, (last - first) // target_tokens + 1)
    ends = sorted({first + (last - first) * i // max(n - 1, 1) for i in range(n)})
    device = device or next(model.parameters()).device
    results = []
    for length in lengths:
        result = LengthResult(str(spec), length, protocol="fixed_target", attention=spec.fields())
        batch_size = max(1, max_tokens // length)
        batches = list(_batches(ends, batch_size))
        for batch in progress_bar(batches, f"fixed-target {spec} L={length}", "batch", progress):
            source = torch.stack([stream[e - length - 1 : e - 1] for e in batch]).to(device)
            target = torch.stack([stream[e - length : e] for e in batch]).to(device)
            nll = _token_nll(model, source, target, pad, spec)[:, -target_tokens:].double()
            result.tokens += nll.numel()
            result.nll += float(nll.sum())
        results.append(result)
    return results


def format_table(results: Sequence[LengthResult], training_length: Optional[int] = None) -> str:
    """Markdown table: window, length (and its ratio to l), tokens scored, loss (bits), ppl (and the key
    tokens and LongPPL when any result has them); then the position buckets of each stream pass."""
    lines = score_lines(("protocol", "window", "length", "x l", "tokens"), [
        ((r.protocol, r.window, str(r.length), f"{r.length / training_length:g}" if training_length else "-", f"{r.tokens:,}"), r)
        for r in results])
    return "\n".join(lines + bucket_table(("window", "length"), [((r.window, r.length), r.buckets) for r in results]))


def score_lines(columns: Sequence[str], rows: Sequence[Tuple[Sequence[str], _Scored]]) -> List[str]:
    """Markdown lines of scored rows: ``columns`` and each row's cells, then its loss (bits) and ppl, and the key tokens
    and LongPPL (``-`` where a row has none) when any row has them."""
    longppl = any(scored.key_tokens is not None for _, scored in rows)
    head = [*columns, "loss (bits)", "ppl", *(("key tokens", "LongPPL") if longppl else ())]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cells, s in rows:
        extra = ["-" if s.key_tokens is None else f"{s.key_tokens:,}", "-" if s.longppl is None else f"{s.longppl:.2f}"]
        lines.append("| " + " | ".join([*cells, f"{s.loss:.4f}", f"{s.ppl:.2f}", *(extra if longppl else ())]) + " |")
    return lines


def bucket_table(keys: Sequence[str], rows: Sequence[Tuple[tuple, Sequence[Bucket]]]) -> List[str]:
    """Markdown lines of the loss per position bucket: one row per bucket, led by the ``keys`` columns
    (e.g. window and length); entries with a single bucket are left out, and nothing when none remain."""
    rows = [(values, buckets) for values, buckets in rows if len(buckets) > 1]
    if not rows:
        return []
    head = "| " + " | ".join(keys) + " | positions | tokens | loss (bits) | ppl |"
    lines = ["", head, "|" + "---|" * (len(keys) + 4)]
    for values, buckets in rows:
        lead = "".join(f"| {v} " for v in values)
        lines += [f"{lead}| {b.start}-{b.end - 1} | {b.tokens:,} | {b.loss:.4f} | {b.ppl:.2f} |" for b in buckets]
    return lines
