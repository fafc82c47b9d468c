"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", section 4.2): can the model still
find a 5-digit key hidden at a relative depth of a long context?

A prompt of L tokens is::

    INTRO  filler[: d F]  NEEDLE(key)  filler[d F :]  QUESTION

with the filler (F tokens) a random stretch of the data-bin's own text (the test split by default), the
needle ``The pass key is 7 1 4 3 2 . Remember it . 7 1 4 3 2 is the pass key .`` at relative depth d, and
the question ``What is the pass key ? The pass key is``. Keys are written digit by digit. Small language models have no instruction tuning, so the
model is not asked to generate: the true key and N random distractor keys are scored by the model's
log-probability of their text after the prompt, and a trial counts as retrieved when the true key
scores highest (chance: 1 / (N + 1)).

The prompt but its last token runs once, block by block through the key/value cache (bounded under BCA / sliding
window); the N + 1 candidates then continue that one cache as one batch (``branch_cache.BranchCache``: the prompt's keys
read through views, each row's own positions kept apart, the prompt's cache left as it was), each row running the last
prompt token before the candidate's own.

A model too small or too briefly trained to copy at all retrieves at chance even inside l. Then
:func:`finetune_samples` and :func:`~lex_plugin.data.finetune.write_rows` give a short fine-tuning set in the probe's own format
(a prompt followed by its key, at most l - 1 tokens together, filler from the training split): the model learns the
task where it was trained, and the probe asks how far beyond l that skill carries under each window.
"""

from dataclasses import asdict, dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from ..data.finetune import FinetuneRow
from ..modules.attention.branch_cache import branch_incremental_state
from ..modules.attention.kv_cache import fork_incremental_state
from ..modules.attention.spec import AttentionSpec
from .length_eval import FULL_BLOCK, blockwise_forward, progress_bar

__all__ = ["CandidateScores", "PasskeyPrompt", "PasskeyResult", "ReadPrompt", "build_prompt", "finetune_samples", "format_passkey",
           "passkey_accuracy", "plot_passkey", "read_prompt", "score_candidates", "score_continuations"]

INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text . Find it and "
         "memorize it . I will quiz you about the important information there .")
NEEDLE = "The pass key is {key} . Remember it . {key} is the pass key ."
QUESTION = "What is the pass key ? The pass key is"
DIGITS = 5


def _spell(key: int) -> str:
    return " ".join(f"{key:0{DIGITS}d}")


@dataclass
class PasskeyPrompt:
    """Token ids of one prompt (``tokens``, (L,) int64), where the needle sits (``needle_start``,
    ``needle_end``: positions), and the key."""

    tokens: Tensor
    needle_start: int
    needle_end: int
    key: int


def build_prompt(encode, filler: Tensor, length: int, depth: float, key: int) -> PasskeyPrompt:
    """The prompt of exactly ``length`` tokens with ``key`` at relative ``depth`` of the filler.

    Args:
        encode: text -> (n,) int64 ids without end-of-sentence (the model's tokenizer and BPE:
            ``LexLanguageModel.encode_fragment``).
        filler: (>= F,) int64 ids of running text; its first F tokens are used.
        length: L, tokens of the whole prompt (intro, filler, needle, question).
        depth: relative position of the needle in the filler, in [0, 1].
        key: the 5-digit key (0 .. 99999).

    Raises:
        ValueError: ``depth`` outside [0, 1], a key outside 5 digits, L too short for intro + needle +
            question, or a filler shorter than needed.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"passkey depths are fractions of the context in [0, 1], got {depth}.")
    if not 0 <= key < 10**DIGITS:
        raise ValueError(f"a pass key has {DIGITS} digits, got {key}.")
    intro, needle, question = encode(INTRO), encode(NEEDLE.format(key=_spell(key))), encode(QUESTION)
    fill = length - intro.numel() - needle.numel() - question.numel()
    if fill < 0:
        raise ValueError(
            f"a passkey prompt needs at least {length - fill} tokens (intro, needle, question); --lengths {length} is too short."
        )
    if filler.numel() < fill:
        raise ValueError(f"the filler text has {filler.numel():,} tokens, fewer than the {fill:,} that length {length} needs.")
    cut = round(depth * fill)
    tokens = torch.cat([intro, filler[:cut], needle, filler[cut:fill], question])
    start = intro.numel() + cut
    return PasskeyPrompt(tokens, start, start + needle.numel(), key)


def finetune_samples(encode, filler: Tensor, count: int, max_length: int, seed: int = 0) -> List[FinetuneRow]:
    """``count`` passkey prompts followed by their key's tokens: the task in the probe's format, for
    fine-tuning at the training length.

    Each sample has a random key, a uniform random total length (prompt and key together) between the
    shortest that key allows and ``max_length``, a uniform random depth in [0, 1] and a random stretch of
    ``filler``.

    Args:
        encode: as for :func:`build_prompt`.
        filler: (T,) int64 running text (the training split: keep the probe's test text unseen).
        count: number of samples.
        max_length: the longest sample (prompt and key) in tokens, end-of-sentence excluded (l - 1 for
            fairseq's ``--sample-break-mode eos --tokens-per-sample l``).
        seed: seeds keys, lengths, depths and offsets.

    Returns:
        ``count`` rows: (n,) int64 tokens, n <= ``max_length``, each ending with the whole key, whose token count
        is the row's ``answer``.

    Raises:
        ValueError: ``max_length`` shorter than intro + needle + question + key for a drawn key, or a filler
            of at most ``max_length`` tokens.
    """
    if filler.numel() <= max_length:
        raise ValueError(f"the filler text has {filler.numel():,} tokens; samples of {max_length} need more.")
    g = torch.Generator().manual_seed(seed)
    frame = encode(INTRO).numel() + encode(QUESTION).numel()
    samples = []
    for _ in progress_bar(range(count), "passkey-data", "row"):
        key = int(torch.randint(0, 10**DIGITS, (1,), generator=g))
        answer = encode(_spell(key))
        shortest = frame + encode(NEEDLE.format(key=_spell(key))).numel() + answer.numel()
        if shortest > max_length:
            raise ValueError(f"a passkey sample needs at least {shortest} tokens; max_length {max_length} is too short.")
        total = int(torch.randint(shortest, max_length + 1, (1,), generator=g))
        depth = float(torch.rand((), generator=g))
        length = total - answer.numel()
        offset = int(torch.randint(0, filler.numel() - length, (1,), generator=g))
        samples.append(FinetuneRow(torch.cat([build_prompt(encode, filler[offset:], length, depth, key).tokens, answer]),
                                   answer.numel()))
    return samples


class CandidateScores(NamedTuple):
    """What the model makes of N candidate continuations of one prompt.

    ``logprob``: (N,) float64, nats: the sum over a candidate's tokens of log p(token | prompt, its earlier tokens).
    ``greedy``: (N,) bool: every token of the candidate is the argmax of the model's next-token distribution at
    its step, that is, greedy decoding from the prompt writes the candidate (ties go to the lower token id, as
    ``torch.argmax``). Ranking by ``logprob`` asks which candidate the model prefers; ``greedy`` asks whether
    the model would produce it unprompted, the string match of RULER's generated answers in kind.
    """

    logprob: Tensor
    greedy: Tensor


@dataclass
class ReadPrompt:
    """A prompt read once, ready to be continued (:func:`read_prompt`), or a context several prompts share
    (:func:`read_context`).

    ``source``: (1, P + 1) int64, ``</s>`` then the prompt, on the model's device. ``state``: the layers' key/value
    caches holding every position of ``source`` but the last (:func:`read_prompt`: a continuation's first call runs
    the last prompt token and predicts the first new one), or every position (:func:`read_context`). Scoring candidates
    (:func:`score_continuations`) leaves it as it was; to continue it twice otherwise, continue a copy
    (``fork_incremental_state``).
    """

    source: Tensor
    state: Dict


def _read(model, source: Tensor, spec: AttentionSpec, state: Dict, start: int = 0) -> None:
    """Positions ``start`` .. of ``source`` (1, S) through ``state`` (holding the first ``start``), block by block
    (``spec.window.feed_block`` positions a call, bounded under BCA / the sliding window; :data:`FULL_BLOCK` under full
    attention). The caches are what is kept: the hidden states are not projected onto the vocabulary."""
    for _ in blockwise_forward(model, source, spec.window.feed_block or FULL_BLOCK, state, spec=spec, features_only=True,
                               start=start):
        pass


@torch.no_grad()
def read_context(model, context: Tensor, spec: AttentionSpec, eos: int) -> ReadPrompt:
    """Run ``</s>`` and the whole of ``context`` through fresh caches: the start several prompts share (a RULER
    sample's context before each of its questions), each then read by :func:`read_prompt` ``(..., context=)``.

    Args:
        context: (C,) int64 ids; model, spec, eos: as :func:`read_prompt`.
    """
    device = next(model.parameters()).device
    source = torch.cat([context.new_tensor([eos]), context]).to(device)[None]
    state: Dict = {}
    _read(model, source, spec, state)
    return ReadPrompt(source, state)


@torch.no_grad()
def read_prompt(model, prompt: Tensor, spec: AttentionSpec, eos: int, context: Optional[ReadPrompt] = None) -> ReadPrompt:
    """Run ``</s>`` and ``prompt`` but its last token through fresh caches, block by block (``spec.window.feed_block``
    positions a call, bounded under BCA / the sliding window; :data:`FULL_BLOCK` under full attention).

    Args:
        model: a lex_lm model in eval mode.
        prompt: (P,) int64 prompt ids.
        spec: the attention window and RoPE scaling.
        eos: the dictionary's end-of-sentence id (put first, as fairseq's LM task does).
        context: a context read by :func:`read_context` under the same ``spec``, which ``prompt`` continues: a copy of
            its caches reads ``prompt`` but its last token (the context's own are left as they were, for the next
            prompt); the result equals reading the context and ``prompt`` as one prompt. None: ``prompt`` alone.
    """
    device = next(model.parameters()).device
    if context is None:
        source, state, start = torch.cat([prompt.new_tensor([eos]), prompt]).to(device)[None], {}, 0
    else:
        source = torch.cat([context.source, prompt.to(device)[None]], dim=1)
        state, start = fork_incremental_state(context.state), context.source.size(1)
    _read(model, source[:, :-1], spec, state, start)
    return ReadPrompt(source, state)


@torch.no_grad()
def score_continuations(model, read: ReadPrompt, candidates: Sequence[Tensor], spec: AttentionSpec, pad: int) -> CandidateScores:
    """Log-probability of each candidate's tokens after a prompt read by :func:`read_prompt`, and whether greedy
    decoding writes it. The candidates continue ``read.state`` as one batch over its one cache
    (:func:`~lex_plugin.modules.attention.branch_cache.branch_incremental_state`), which is left as it was: the prompt
    can be continued again.

    Args:
        candidates: N 1-D int64 tensors, the ids of each candidate (lengths may differ: a BPE may split some digits;
            the score is then the log-probability of the candidate's text either way).
        spec: the attention spec the prompt was read with; pad: the dictionary's padding id.

    Returns:
        :class:`CandidateScores`: (N,) float64 log-probabilities and (N,) bool greedy flags, on the CPU.
    """
    device = read.source.device
    n, m = len(candidates), max(c.numel() for c in candidates)
    cands = torch.full((n, m), pad, dtype=torch.long, device=device)
    for i, c in enumerate(candidates):
        cands[i, : c.numel()] = c
    # the decoder runs only the uncached columns: the last prompt token, then each candidate's first m - 1 tokens
    # (right padding never reaches earlier positions); their outputs predict the candidates' m tokens
    logits, _ = model(torch.cat([read.source.expand(n, -1), cands[:, :-1]], dim=1),
                      incremental_state=branch_incremental_state(read.state, n), spec=spec)
    log_probs = logits[:, -m:].double().log_softmax(-1)  # (N, m, V)
    steps = log_probs.gather(-1, cands[:, :, None]).squeeze(-1)  # (N, m)
    padding = cands.eq(pad)
    greedy = (log_probs.argmax(-1).eq(cands) | padding).all(-1)
    return CandidateScores(steps.masked_fill(padding, 0.0).sum(-1).cpu(), greedy.cpu())


@torch.no_grad()
def score_candidates(model, prompt: Tensor, candidates: Sequence[Tensor], spec: AttentionSpec, eos: int, pad: int) -> CandidateScores:
    """Log-probability of each candidate's tokens after ``prompt``, and whether greedy decoding writes it: the prompt
    read once (:func:`read_prompt`), the candidates continuing its caches as one batch (:func:`score_continuations`).

    Args:
        model: a lex_lm model in eval mode.
        prompt: (L,) int64 prompt ids (``</s>`` is put in front, as fairseq's LM task does).
        candidates: N 1-D int64 tensors, the ids of each candidate.
        spec: the attention window and RoPE scaling.
        eos, pad: the dictionary's end-of-sentence and padding ids.

    Returns:
        :class:`CandidateScores`: (N,) float64 log-probabilities and (N,) bool greedy flags, on the CPU.
    """
    return score_continuations(model, read_prompt(model, prompt, spec, eos), candidates, spec, pad)


@dataclass
class PasskeyResult:
    """Accuracy of one (window, length, depth) cell over ``trials`` prompts."""

    window: str
    length: int
    depth: float
    distractors: int = 9
    trials: int = 0
    retrieved: int = 0
    greedy: int = 0  # trials whose greedy continuation of the prompt is the true key (CandidateScores.greedy)
    margins: List[float] = field(default_factory=list)  # true key's log-prob minus the best distractor's
    attention: dict = field(default_factory=dict)  # the spec's structured fields (AttentionSpec.fields: mode, ...)

    @property
    def accuracy(self) -> float:
        return self.retrieved / max(self.trials, 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["accuracy"] = self.accuracy
        return out


def passkey_accuracy(
    model,
    encode,
    filler: Tensor,
    lengths: Sequence[int],
    depths: Sequence[float],
    specs: Sequence[AttentionSpec],
    eos: int,
    pad: int,
    trials: int = 10,
    distractors: int = 9,
    seed: int = 0,
    progress: bool = True,
) -> List[PasskeyResult]:
    """Accuracy per (window, length, depth): ``trials`` prompts each, the filler starting at a random
    offset of ``filler`` and a random key per trial, scored against ``distractors`` random other keys.
    The same prompts and candidates serve every window (seeded by ``seed``).

    Raises:
        ValueError: a length the filler text cannot fill (say how many tokens it holds), or the errors
            of :func:`build_prompt`.
    """
    longest = max(lengths)
    if filler.numel() <= longest:
        raise ValueError(
            f"the filler split holds {filler.numel():,} tokens; --lengths up to {longest:,} need more. "
            "Lower the lengths or take a larger split (--split)."
        )
    g = torch.Generator().manual_seed(seed)
    results = []
    cells = [(L, d) for L in lengths for d in depths]
    bar = progress_bar(len(cells) * trials * len(specs), "passkey", "prompt", progress)
    for length, depth in cells:
        cell = {str(w): PasskeyResult(str(w), length, depth, distractors, attention=w.fields()) for w in specs}
        for _ in range(trials):
            offset = int(torch.randint(0, filler.numel() - length, (1,), generator=g))
            keys = torch.randperm(10**DIGITS, generator=g)[: distractors + 1].tolist()  # keys[0] is the true one
            prompt = build_prompt(encode, filler[offset:], length, depth, keys[0])
            candidates = [encode(_spell(k)) for k in keys]
            for spec in specs:
                scores, greedy = score_candidates(model, prompt.tokens, candidates, spec, eos, pad)
                result = cell[str(spec)]
                result.trials += 1
                result.retrieved += int(scores[0] > scores[1:].max())
                result.greedy += int(greedy[0])
                result.margins.append(float(scores[0] - scores[1:].max()))
                bar.update(1)
        results += cell.values()
    bar.close()
    return results


def format_passkey(results: Sequence[PasskeyResult], training_length: Optional[int] = None) -> str:
    """One markdown table per window: rows = depths, columns = lengths (x l), cells = accuracy; a last row counts
    the prompts whose greedy continuation is the true key (all depths of a length together)."""
    out = []
    for window in dict.fromkeys(r.window for r in results):
        rows = [r for r in results if r.window == window]
        lengths = sorted({r.length for r in rows})
        depths = sorted({r.depth for r in rows})
        head = [f"{L} ({L / training_length:g}l)" if training_length else str(L) for L in lengths]
        trials, distractors = max(r.trials for r in rows), rows[0].distractors
        lines = [f"{window}: passkey accuracy ({trials} trials per cell; chance {1 / (1 + distractors):.2f} with "
                 f"{distractors} distractor keys)",
                 "| depth | " + " | ".join(head) + " |", "|---|" + "---|" * len(lengths)]
        cell = {(r.length, r.depth): r.accuracy for r in rows}
        for d in depths:
            lines.append(f"| {d:g} | " + " | ".join(f"{cell[(L, d)]:.2f}" for L in lengths) + " |")
        greedy = [(sum(r.greedy for r in rows if r.length == L), sum(r.trials for r in rows if r.length == L)) for L in lengths]
        lines.append("| greedy writes the key (all depths) | " + " | ".join(f"{g}/{n}" for g, n in greedy) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def plot_passkey(results: Sequence[PasskeyResult], out, training_length: Optional[int] = None) -> None:
    """Heat maps of accuracy (depth x length), one panel per window, into the PNG ``out``.

    Raises:
        ValueError: no results.
    """
    if not results:
        raise ValueError("no passkey results to plot.")
    from ..plotting import figure

    windows = list(dict.fromkeys(r.window for r in results))
    with figure(out, 1, len(windows), (3.2 * len(windows) + 1.2, 3.4), squeeze=False, constrained_layout=True) as (fig, axes):
        _heat_maps(fig, axes, results, windows, training_length)


def _heat_maps(fig, axes, results: Sequence[PasskeyResult], windows: List[str], training_length: Optional[int]) -> None:
    from ..plotting import heat_map

    for ax, window in zip(axes[0], windows):
        rows = [r for r in results if r.window == window]
        lengths, depths = sorted({r.length for r in rows}), sorted({r.depth for r in rows})
        cell = {(r.length, r.depth): r.accuracy for r in rows}
        grid = [[cell[(L, d)] for L in lengths] for d in depths]
        image = heat_map(ax, grid, [f"{L / training_length:g}l" if training_length else str(L) for L in lengths],
                         [f"{d:g}" for d in depths], "{:.1f}")
        ax.set_title(window, fontsize=9)
        ax.set_xlabel("context length")
    axes[0][0].set_ylabel("needle depth")
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="accuracy")
    first = results[0]
    fig.suptitle(f"passkey retrieval: {max(r.trials for r in results)} trials per cell, chance "
                 f"{1 / (1 + first.distractors):.2f} ({first.distractors} distractor keys)", fontsize=10)
