"""The RULER-lite probe: accuracy of a model on :mod:`.tasks`' prompts by candidate scoring, per (task, window,
length, depth); its table, heat maps, and the fine-tuning samples in the probe's format (``lex ruler-data``).

Each query's prompt (context and question) runs once through the key/value cache (bounded under BCA / the
sliding window, :func:`~lex_plugin.evaluation.passkey.score_candidates`); its answers and distractors then
continue it as one batch. An answer counts as found when its log-probability is above every distractor's
(chance 1 / (K + 1) for each answer); a trial scores the fraction of its answers found (RULER's
``string_match_all`` in kind), a cell the mean over trials.

Ranking K + 1 candidates is a lenient test: a 7-digit value usually differs from its distractors in its first
token, so a model that copies only that token ranks the answer first. Each cell also counts the queries whose
greedy continuation writes one of their answers whole (:class:`~lex_plugin.evaluation.passkey.CandidateScores`):
what RULER's string match of a generated answer asks, without letting the model run on.
"""

import zlib
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor
from tqdm import tqdm

from ...data.finetune import FinetuneRow
from ...modules.attention.spec import AttentionSpec
from ..passkey import score_candidates
from .tasks import TASKS, make_sample

ANSWER_ROOM = 48  # tokens kept free for a fine-tuning sample's answer text (4 values, 3 names or words)

__all__ = ["RulerResult", "finetune_samples", "format_ruler", "plot_ruler", "ruler_accuracy", "sentence_stops"]


def sentence_stops(encode) -> List[int]:
    """Token ids that end a sentence in text encoded by ``encode`` ('.', '!', '?' as the tokenizer writes them)."""
    stops = set()
    for mark in (".", "!", "?"):
        ids = encode(f"It ends{mark}").tolist()
        if ids:
            stops.add(ids[-1])
    return sorted(stops)


@dataclass
class RulerResult:
    """One (task, window, length, depth) cell: ``trials`` prompts, ``score`` the sum of the trials' fractions of
    answers found, ``items`` / ``found`` the answers scored / found, ``tokens`` the longest prompt read,
    ``prompt_tokens`` each trial's prompt (context and longest question) in tokens, ``queries`` / ``greedy`` the
    questions asked / those whose greedy continuation writes one of their answers whole."""

    task: str
    window: str
    length: int
    depth: Optional[float]
    distractors: int = 9
    trials: int = 0
    score: float = 0.0
    items: int = 0
    found: int = 0
    tokens: int = 0
    queries: int = 0
    greedy: int = 0
    prompt_tokens: List[int] = field(default_factory=list)
    attention: dict = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return self.score / max(self.trials, 1)

    @property
    def greedy_rate(self) -> float:
        return self.greedy / max(self.queries, 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["accuracy"] = self.accuracy
        out["greedy_rate"] = self.greedy_rate
        return out


def ruler_accuracy(model, encode, filler: Tensor, tasks: Sequence[str], lengths: Sequence[int], depths: Sequence[float],
                   specs: Sequence[AttentionSpec], eos: int, pad: int, trials: int = 5, distractors: int = 9, hops: int = 2,
                   seed: int = 0, progress: bool = True, unk: Optional[int] = None) -> List[RulerResult]:
    """Accuracy per (task, window, length, depth): ``trials`` prompts per cell (``fwe``: one row per length, depth
    None), the same prompts for every window (seeded by ``seed``, task, length, depth and trial).

    Args:
        model: a lex_lm model in eval mode; encode: text -> ids (``LexHubInterface.encode_fragment``).
        filler: (T,) int64 book text for the book haystacks (the data-bin's test split).
        specs: the attention specs compared; eos, pad, unk: the dictionary's ids (``unk``: refuse text it cannot spell).

    Raises:
        ValueError: as :func:`~.tasks.make_sample` (unknown task, bad depth, a length too short, too little filler).
    """
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown RULER tasks {', '.join(unknown)}; choose from {', '.join(TASKS)}.")
    stops = sentence_stops(encode)
    cells = [(t, L, d) for t in tasks for L in lengths for d in ([None] if t == "fwe" else depths)]
    results = []
    bar = tqdm(total=len(cells) * trials * len(specs), desc="ruler", unit="prompt", disable=not progress or None)
    for task, length, depth in cells:
        cell = {str(s): RulerResult(task, str(s), length, depth, distractors, attention=s.fields()) for s in specs}
        for trial in range(trials):
            g = torch.Generator().manual_seed(zlib.crc32(repr((seed, task, length, depth, trial)).encode()))
            sample = make_sample(task, encode, length, depth, g, filler, stops, distractors, hops, unk)
            for spec in specs:
                found = items = greedy = 0
                for query in sample.queries:
                    scores, writes = score_candidates(model, torch.cat([sample.context, query.question]),
                                                      [*query.answers, *query.distractors], spec, eos, pad)
                    best_wrong = scores[len(query.answers):].max()
                    found += int((scores[:len(query.answers)] > best_wrong).sum())
                    items += len(query.answers)
                    greedy += int(writes[:len(query.answers)].any())
                result = cell[str(spec)]
                result.queries += len(sample.queries)
                result.greedy += greedy
                result.trials += 1
                result.score += found / items
                result.items += items
                result.found += found
                result.tokens = max(result.tokens, sample.tokens)
                result.prompt_tokens.append(sample.tokens)
                bar.update(1)
        results += cell.values()
    bar.close()
    return results


def finetune_samples(encode, filler: Tensor, tasks: Sequence[str], count: int, max_length: int, seed: int = 0,
                     distractors: int = 9, hops: int = 2, unk: Optional[int] = None) -> List[FinetuneRow]:
    """``count`` prompts of the tasks (in turn) each followed by its answer text (one query of it), at most
    ``max_length`` tokens with the answer, each of uniform random length (between max_length / 2, or the
    shortest the task fits in, and max_length - ANSWER_ROOM) and depth: the probe's format, for
    fine-tuning at the training length (``lex ruler-data``; filler from the training split). Each row's
    ``answer`` is the answer text's token count.

    Raises:
        ValueError: ``max_length`` too short for a task's frame and answer, or the errors of :func:`make_sample`.
    """
    stops = sentence_stops(encode)
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        task = tasks[i % len(tasks)]
        low, high = max_length // 2, max_length - ANSWER_ROOM
        while True:  # a uniform length among those the task's frame (intro, needles, question) fits in
            length = int(torch.randint(low, max(low, high) + 1, (1,), generator=g))
            try:
                sample = make_sample(task, encode, length, float(torch.rand((), generator=g)), g, filler, stops,
                                     distractors, hops, unk)
                break
            except ValueError as err:
                if "too short" not in str(err) or length >= high:
                    raise ValueError(f"{err} (--max-length {max_length} leaves {high} tokens for a {task} prompt)") from None
                low = length + 1
        query = sample.queries[int(torch.randint(len(sample.queries), (1,), generator=g))]
        answer = encode(query.answer_text)
        tokens = torch.cat([sample.context, query.question, answer])
        if tokens.numel() > max_length:
            raise ValueError(f"a {task} sample needs {tokens.numel()} tokens with its answer; --max-length {max_length} is "
                             "too short.")
        out.append(FinetuneRow(tokens, answer.numel()))
    return out


def _mean(rows: Sequence[RulerResult]) -> float:
    return sum(r.score for r in rows) / max(sum(r.trials for r in rows), 1)


def _greedy(rows: Sequence[RulerResult]) -> Optional[float]:
    asked = sum(r.queries for r in rows)  # 0 in reports written before greedy was counted: shown as "-"
    return sum(r.greedy for r in rows) / asked if asked else None


def format_ruler(results: Sequence[RulerResult], training_length: Optional[int] = None) -> str:
    """Markdown: the accuracy summary (rows task x window, columns lengths, cells the mean over depths), then
    the same table of greedy rates (the fraction of queries whose greedy continuation writes an answer)."""
    lengths = sorted({r.length for r in results})
    name = (lambda L: f"{L} ({L / training_length:g}l)") if training_length else str
    chance = 1 / (1 + results[0].distractors) if results else 0
    lines = []
    for title, value in ((f"RULER-lite accuracy (mean over depths; chance {chance:.2f} per answer; the longest prompt "
                          "of each cell is in the JSON's tokens)", _mean),
                         ("Greedy: fraction of queries whose greedy continuation writes an answer whole (all depths)", _greedy)):
        lines += [*([""] if lines else []), title, "| task | window | " + " | ".join(map(name, lengths)) + " |",
                  "|---|---|" + "---:|" * len(lengths)]
        for task in dict.fromkeys(r.task for r in results):
            for window in dict.fromkeys(r.window for r in results if r.task == task):
                cells = []
                for L in lengths:
                    rows = [r for r in results if r.task == task and r.window == window and r.length == L]
                    v = value(rows) if rows else None
                    cells.append("-" if v is None else f"{v:.2f}")
                lines.append(f"| {task} | {window} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_ruler(results: Sequence[RulerResult], out, training_length: Optional[int] = None) -> None:
    """One PNG per task (``out`` with ``_TASK`` before the suffix): heat maps depth x length, one panel per window
    (``fwe``: one row).

    Raises:
        ValueError: no results.
    """
    if not results:
        raise ValueError("no RULER results to plot.")
    from pathlib import Path

    from ...plotting import figure

    out = Path(out)
    for task in dict.fromkeys(r.task for r in results):
        rows = [r for r in results if r.task == task]
        windows = list(dict.fromkeys(r.window for r in rows))
        path = out.with_name(f"{out.stem}_{task}{out.suffix}")
        with figure(path, 1, len(windows), (3.2 * len(windows) + 1.2, 3.4), squeeze=False, constrained_layout=True) as (fig, axes):
            image = None
            for ax, window in zip(axes[0], windows):
                mine = [r for r in rows if r.window == window]
                lengths = sorted({r.length for r in mine})
                depths = sorted({r.depth for r in mine}, key=lambda d: -1 if d is None else d)
                cell = {(r.length, r.depth): r.accuracy for r in mine}
                grid = [[cell[(L, d)] for L in lengths] for d in depths]
                image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
                ax.set_xticks(range(len(lengths)), [f"{L / training_length:g}l" if training_length else str(L) for L in lengths])
                ax.set_yticks(range(len(depths)), ["all" if d is None else f"{d:g}" for d in depths])
                for i, line in enumerate(grid):
                    for j, value in enumerate(line):
                        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
                ax.set_title(window, fontsize=9)
                ax.set_xlabel("context length")
            axes[0][0].set_ylabel("depth")
            fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="accuracy")
            fig.suptitle(f"RULER-lite {task}: {max(r.trials for r in rows)} trials per cell, chance "
                         f"{1 / (1 + rows[0].distractors):.2f} per answer", fontsize=10)
